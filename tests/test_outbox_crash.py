"""The capture outbox across SIGKILL: a real child process, a real collector, the same SQLite file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from outbox_child import CAPTURED_CHAT, CHILD_LEASE, Collector, Reply, update

from telegram_fence.delivery.outbox import Outbox, capture_key
from telegram_fence.store.sqlite import SqliteUpdateStore

pytestmark = pytest.mark.drill

CHILD = Path(__file__).with_name("outbox_child.py")


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    yield server
    server.close()


def _spawn(mode: str, db: Path, url: str, updates: list[dict]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), mode, str(db), url, json.dumps(updates)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _expect_line(child: subprocess.Popen[str], line: str) -> None:
    assert child.stdout is not None
    got = child.stdout.readline().strip()  # blocks until the child prints or dies
    if got != line:
        child.kill()
        _, err = child.communicate(timeout=10)
        pytest.fail(f"child printed {got!r} instead of {line!r}; stderr:\n{err}")


def _kill9(child: subprocess.Popen[str]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    if child.stdout:
        child.stdout.close()
    if child.stderr:
        child.stderr.close()


def _rows(store: SqliteUpdateStore) -> dict[str, tuple]:
    with store.write() as conn:
        return {
            row[0]: row[1:]
            for row in conn.execute("SELECT key, state, attempts, payload FROM fence_outbox ORDER BY key")
        }


def test_sigkill_during_delivery_is_recovered_after_the_lease_with_the_same_key(
    tmp_path: Path, collector: Collector
) -> None:
    """A capture whose delivering process was SIGKILLed is delivered again after its lease, same key and body."""
    db = tmp_path / "bot.db"
    updates = [update(1, CAPTURED_CHAT, "first"), update(2, 99, "not captured")]
    collector.answer(Reply(hold=60.0))  # the first delivery never gets an answer
    child = _spawn("deliver", db, collector.url, updates)
    _expect_line(child, "recorded")
    assert collector.wait_for(1, timeout=20), "the child never started delivering"
    _kill9(child)

    # Reopen the file with a clock past the child's lease instead of sleeping through it.
    shifted = {"offset": 0.0}
    store = SqliteUpdateStore(db, clock=lambda: time.time() + shifted["offset"])
    try:
        key = capture_key(updates[0])
        assert _rows(store)[key][:2] == ("delivering", 1)
        outbox = Outbox(store, collector.url, lease=CHILD_LEASE, timeout=5.0)
        assert outbox.deliver_once() is False, "a live lease must not be taken over"
        shifted["offset"] = CHILD_LEASE + 1
        assert outbox.deliver_once() is True
        assert collector.wait_for(2, timeout=1)
        first, second = collector.received[:2]
        assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"] == key
        assert first.body == second.body
        assert second.json()["text"] == "first"
        state, attempts, _payload = _rows(store)[key]
        assert (state, attempts) == ("delivered", 2)
        assert outbox.deliver_once() is False
        assert len(collector.received) == 2
    finally:
        store.close()


def test_replaying_the_same_updates_after_reopening_leaves_one_capture_each(
    tmp_path: Path, collector: Collector
) -> None:
    """Recording the same batch again after a SIGKILL and a reopen adds no capture and keeps the cursor."""
    db = tmp_path / "bot.db"
    updates = [update(5, CAPTURED_CHAT, "a"), update(6, CAPTURED_CHAT, "b"), update(7, 42, "c")]
    collector.answer(Reply(hold=60.0))
    child = _spawn("deliver", db, collector.url, updates)
    _expect_line(child, "recorded")
    assert collector.wait_for(1, timeout=20)
    _kill9(child)

    from telegram_fence.delivery.outbox import CaptureRule

    for _ in range(2):  # replay twice, each time on a freshly opened file
        store = SqliteUpdateStore(db)
        try:
            before = _rows(store)
            outbox = Outbox(store, collector.url, rule=CaptureRule(chats={CAPTURED_CHAT}))
            assert outbox.record(updates, 8) == 0
            for one in updates[:2]:
                assert outbox.enqueue(one) == capture_key(one)  # direct enqueue is a no-op too
            after = _rows(store)
            assert sorted(after) == sorted(capture_key(u) for u in updates[:2])
            assert after == before
            assert store.next_offset() == 8
        finally:
            store.close()


def test_sigkill_inside_the_record_transaction_leaves_neither_updates_nor_captures(
    tmp_path: Path, collector: Collector
) -> None:
    """A process killed while its capture hook runs leaves no update, no capture and the old cursor."""
    db = tmp_path / "bot.db"
    store = SqliteUpdateStore(db)
    store.record([update(1, CAPTURED_CHAT)], 2)  # an earlier batch, so the cursor has a value to keep
    store.close()
    child = _spawn("hang-in-hook", db, collector.url, [update(2, CAPTURED_CHAT), update(3, CAPTURED_CHAT)])
    _expect_line(child, "in-hook")
    _kill9(child)

    store = SqliteUpdateStore(db)
    try:
        assert store.next_offset() == 2
        stats = store.stats()
        assert stats["pending"] == 1  # only the earlier batch's update
        assert _rows(store) == {}
        assert collector.received == []
    finally:
        store.close()
