"""A finished attempt of a quiet chat (nothing known to wait behind its claim) is settled by the next round that runs
anyway, or after ``SETTLE_HOLD``; one whose chat has work waiting is settled by the very next round."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from telegram_fence import SqliteUpdateStore
from telegram_fence.runtime import mailbox as mailbox_module
from telegram_fence.runtime.attempt import AttemptContext
from telegram_fence.runtime.mailbox import Mailbox, RecordRequest, Round
from telegram_fence.store import Claim, Identity

CHAT = 7


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteUpdateStore]:
    opened = SqliteUpdateStore(tmp_path / "bot.db")
    yield opened
    opened.close()


def attempt(store: SqliteUpdateStore, update_id: int = 1, chat: int = CHAT) -> AttemptContext:
    """An attempt of ``update_id`` in ``chat`` (only its identity and chat matter to the mailbox)."""
    return AttemptContext(store, Claim(Identity(update_id, 1, f"c{update_id}"), {"update_id": update_id}, chat,
                                       time.time() + 30))


def mailbox() -> Mailbox:
    box = Mailbox()
    box.attach(threading.Event(), lambda: 0, lambda: None)  # no room: only writes and settles make a round
    return box


def next_round_on_a_thread(box: Mailbox) -> tuple[threading.Thread, list[Round]]:
    taken: list[Round] = []
    thread = threading.Thread(target=lambda: taken.append(box.next_round(lambda: 60.0)), name="test-writer")
    thread.start()
    return thread, taken


def test_a_quiet_chat_s_finished_attempt_rides_on_the_next_round_that_records(store: SqliteUpdateStore) -> None:
    """A held settle is taken by the round a batch to record makes, in that same round."""
    box = mailbox()
    ctx = attempt(store)
    box.claimed({CHAT}, {CHAT}, set())
    box.file(ctx, True)
    request = RecordRequest([{"update_id": 2}], 3, {})
    box.post(request)
    work = box.next_round(lambda: 60.0)
    assert work.requests == [request] and work.finished == [ctx]


def test_a_quiet_chat_s_finished_attempt_is_settled_alone_after_the_hold(store: SqliteUpdateStore) -> None:
    """With nothing else to do, the writer's next round settles the held attempt once ``SETTLE_HOLD`` passed."""
    box = mailbox()
    ctx = attempt(store)
    box.claimed({CHAT}, {CHAT}, set())
    started = time.monotonic()
    box.file(ctx, True)
    work = box.next_round(lambda: 60.0)
    assert work.finished == [ctx]
    assert time.monotonic() - started >= mailbox_module.SETTLE_HOLD


def test_a_finished_attempt_whose_chat_may_have_work_is_settled_by_the_next_round(
    store: SqliteUpdateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat claimed without being known quiet holds nothing: its finished attempt makes a round at once."""
    monkeypatch.setattr(mailbox_module, "SETTLE_HOLD", 300.0)
    box = mailbox()
    ctx = attempt(store)
    box.claimed({CHAT}, set(), set())
    thread, taken = next_round_on_a_thread(box)
    box.file(ctx, True)
    thread.join(30)
    assert not thread.is_alive() and taken[0].finished == [ctx]


def test_work_arriving_behind_a_held_settle_makes_the_round_at_once(
    store: SqliteUpdateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round that could not claim a chat's new update (its attempt is held) makes the next round settle it now."""
    monkeypatch.setattr(mailbox_module, "SETTLE_HOLD", 300.0)
    box = mailbox()
    ctx = attempt(store)
    box.claimed({CHAT}, {CHAT}, set())
    box.file(ctx, True)
    thread, taken = next_round_on_a_thread(box)
    box.claimed(set(), set(), {CHAT})
    thread.join(30)
    assert not thread.is_alive() and taken[0].finished == [ctx]


def test_a_stopping_pool_settles_held_attempts_without_waiting(
    store: SqliteUpdateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the pool stops, a held settle is taken by the next round, not after the hold."""
    monkeypatch.setattr(mailbox_module, "SETTLE_HOLD", 300.0)
    stopped = threading.Event()
    box = Mailbox()
    box.attach(stopped, lambda: 0, lambda: None)
    ctx = attempt(store)
    box.claimed({CHAT}, {CHAT}, set())
    box.file(ctx, True)
    stopped.set()
    thread, taken = next_round_on_a_thread(box)
    thread.join(30)
    assert not thread.is_alive() and taken[0].finished == [ctx]
