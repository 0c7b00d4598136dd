"""The inline run as one frame (the sqlcpu lane): outcomes filed once per run, and what a stall leaves behind.

A real fence against the fake Bot API server over HTTP, a real SQLite file and threads.
"""

from __future__ import annotations

import threading
from typing import Any

import telebot
from helpers import eventually, make_fence, stop

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
