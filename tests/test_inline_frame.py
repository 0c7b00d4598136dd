"""The inline run as one frame: outcomes filed once per run, and what a stall leaves behind.

A real fence against the fake Bot API server over HTTP, a real SQLite file and threads.
"""

from __future__ import annotations

import threading
from typing import Any

import telebot
from helpers import eventually, make_fence, stop

from telegram_fence.store import Identity
from telegram_fence.testing import FakeBotAPI


def test_attempts_run_inline_keep_no_payload_once_filed(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """The outcomes of an inline run are filed once per run (``Mailbox.file_many``): each attempt's payload is
    released then, as a worker's attempt is by ``Mailbox.file``."""
    kept: list[Any] = []
    lock = threading.Lock()
    fence = make_fence(bot, db, workers=2)

    @fence.attempt_handler
    def handle(update: Any, ctx: Any) -> None:
        with lock:
            kept.append((threading.current_thread().name, ctx))

    fence.start()
    api.push_messages(600, chats=[1, 2, 3])
    try:
        assert eventually(lambda: fence.stats()["settled"] == 600, timeout=30)
    finally:
        stop(fence)
    inline = [ctx for name, ctx in kept if name == "fence-dispatcher"]
    assert inline, "fast handlers should have run on the dispatcher"
    assert all(dict(ctx.raw) == {} for _, ctx in kept)


def test_an_attempt_finished_before_a_stall_in_the_same_run_is_settled_while_the_stall_lasts(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """An inline run keeps its finished attempts until it ends; when a handler of the run stalls, the hand-over
    takes the ones finished before it, so the new dispatcher settles them (and serves their chats) while the
    stalled handler still runs, instead of after it returned."""
    release = threading.Event()
    handled: list[str] = []
    ids: list[int] = []
    lock = threading.Lock()
    fence = make_fence(bot, db, workers=2)

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        if update.message.text == "tail1":
            release.wait(20)
        with lock:
            handled.append(update.message.text)
            ids.append(update.update_id)

    fence.start()
    api.push_messages(300, chats=[2, 3])
    try:
        assert eventually(lambda: len(handled) == 300, timeout=30)
        assert eventually(lambda: fence.stats()["settled"] == 300, timeout=10)
        assert fence.stats()["workers"]["inline"], "fast handlers should have switched the pool to inline mode"
        # One batch (one wake-up of the long poll): chat 2's update runs first in the run, then chat 1's stalls.
        api.push_messages(2, chats=[2, 1], text="tail{i}")
        assert eventually(lambda: "tail0" in handled, timeout=10)
        assert eventually(lambda: fence.stats()["workers"]["handovers"] == 1, timeout=10)
        assert eventually(lambda: fence.stats()["settled"] == 301, timeout=10)  # while tail1 still blocks
        assert "tail1" not in handled
        later = api.push_messages(4, chats=[2, 3])  # the other chats keep being served
        assert eventually(lambda: fence.stats()["settled"] == 305, timeout=10)
        assert len(later) == 4 and "tail1" not in handled
        release.set()
        assert eventually(lambda: fence.stats()["settled"] == 306, timeout=15)
    finally:
        release.set()
        stop(fence)
    assert len(ids) == 306 and len(set(ids)) == 306  # each update once


class _Ctx:
    def __init__(self, update_id: int) -> None:
        self.identity = Identity(update_id, 1, f"c{update_id}")


def test_the_journal_frame_of_an_attempt_is_made_on_first_use_and_nesting_restores_the_outer_one() -> None:
    """An attempt begun on a thread has no journal frame until something asks for one (``active()``): a handler that
    makes no Bot API call builds none; an attempt begun inside another gets its own, and the outer one's is back
    after it."""
    from telegram_fence.calls import frame as journal_frame

    outer, inner = _Ctx(1), _Ctx(2)
    assert journal_frame.active() is None  # outside any attempt
    journal_frame.begin(outer)
    assert journal_frame.peek() is None  # nothing made yet
    made = journal_frame.active()
    assert made is not None and made.identity == outer.identity and made.ctx is outer
    assert journal_frame.active() is made and made.take_seq() == 0
    journal_frame.begin(inner)
    assert journal_frame.peek() is None
    inner_frame = journal_frame.active()
    assert inner_frame is not None and inner_frame.identity == inner.identity
    journal_frame.leave()
    assert journal_frame.peek() is made and made.take_seq() == 1  # the outer frame, its position kept
    journal_frame.leave()
    assert journal_frame.peek() is None and journal_frame.active() is None


class _Recorder:
    def __init__(self, name: str, log: list[str], fail_end: bool = False) -> None:
        self.name, self.log, self.fail_end = name, log, fail_end

    def begin(self, ctx: Any) -> None:
        self.log.append(f"{self.name}.begin")

    def before_commit(self, ctx: Any, conn: Any, complete: bool) -> None:
        pass

    def after_commit(self, ctx: Any, complete: bool) -> None:
        pass

    def end(self, ctx: Any, ok: bool) -> None:
        self.log.append(f"{self.name}.end({ok})")
        if self.fail_end:
            raise RuntimeError(f"{self.name} end failed")


def test_run_in_runs_the_hooks_as_running_does() -> None:
    """``run_in`` (what a fence runs around each handler) calls the extensions' hooks in the order and with the
    outcomes of ``with running(...)``, raises what it raises, and restores the thread's attempt in every case."""
    from telegram_fence.runtime.attempt import current_attempt, run_in, running

    def through_running(ctx: Any, extensions: Any, fn: Any) -> None:
        with running(ctx, extensions):
            fn()

    def boom() -> None:
        raise ValueError("handler")

    cases = [(lambda: None, False), (boom, False), (lambda: None, True), (boom, True)]
    for fn, fail_end in cases:
        seen: list[tuple[list[str], str | None]] = []
        for runner in (through_running, lambda c, e, f: run_in(c, e, f)):
            log: list[str] = []
            extensions = (_Recorder("a", log, fail_end=fail_end), _Recorder("b", log))
            ctx = object()
            error = None
            try:
                runner(ctx, extensions, fn)
            except Exception as exc:  # what each raises is compared
                error = f"{type(exc).__name__}: {exc}"
            assert current_attempt() is None
            seen.append((log, error))
        assert seen[0] == seen[1], (fn, fail_end, seen)
        assert seen[0][0][:2] == ["a.begin", "b.begin"]
