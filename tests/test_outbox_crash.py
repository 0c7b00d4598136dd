"""The capture outbox across SIGKILL: a real child process, a real collector, the same SQLite file or
PostgreSQL table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from outbox_child import CAPTURED_CHAT, CHILD_LEASE, Collector, Reply, update
from pg_support import DSN, drop_tables, new_table, requires_pg

from telegram_fence.delivery.outbox import Outbox, capture_key
from telegram_fence.store.sqlite import SqliteUpdateStore

pytestmark = pytest.mark.drill

CHILD = Path(__file__).with_name("outbox_child.py")


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    yield server
    server.close()


@dataclass
class Backend:
    """Where the child and the test meet: a SQLite file, or a PostgreSQL table (``dsn`` set)."""

    db: str
    dsn: str | None = None

    def open(self, clock: Callable[[], float] | None = None) -> Any:
        if self.dsn is None:
            return SqliteUpdateStore(self.db) if clock is None else SqliteUpdateStore(self.db, clock=clock)
        from telegram_fence.store.postgres import PostgresUpdateStore

        return PostgresUpdateStore(self.dsn, table=self.db, clock=clock)

    @property
    def outbox_table(self) -> str:
        return "fence_outbox" if self.dsn is None else f"{self.db}_outbox"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_pg)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        yield Backend(str(tmp_path / "bot.db"))
        return
    table = new_table("tf_obxcrash")
    try:
        yield Backend(table, DSN)
    finally:
        drop_tables(table)


def _spawn(mode: str, backend: Backend, url: str, updates: list[dict]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_OUTBOX_CHILD_DSN"}
    if backend.dsn is not None:
        env["TF_OUTBOX_CHILD_DSN"] = backend.dsn
    return subprocess.Popen(
        [sys.executable, str(CHILD), mode, backend.db, url, json.dumps(updates)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
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


def _rows(store: Any, table: str = "fence_outbox") -> dict[str, tuple]:
    with store.write() as conn:
        cursor = conn.execute(f"SELECT key, state, attempts, payload FROM {table} ORDER BY key")
        return {row[0]: tuple(row[1:]) for row in cursor.fetchall()}


def test_sigkill_during_delivery_is_recovered_after_the_lease_with_the_same_key(
    backend: Backend, collector: Collector
) -> None:
    """A capture whose delivering process was SIGKILLed is delivered again after its lease, same key and body; on
    SQLite and on PostgreSQL."""
    updates = [update(1, CAPTURED_CHAT, "first"), update(2, 99, "not captured")]
    collector.answer(Reply(hold=60.0))  # the first delivery never gets an answer
    child = _spawn("deliver", backend, collector.url, updates)
    _expect_line(child, "recorded")
    assert collector.wait_for(1, timeout=20), "the child never started delivering"
    _kill9(child)

    # Reopen the file with a clock past the child's lease instead of sleeping through it.
    shifted = {"offset": 0.0}
    store = backend.open(clock=lambda: time.time() + shifted["offset"])
    try:
        key = capture_key(updates[0])
        assert _rows(store, backend.outbox_table)[key][:2] == ("delivering", 1)
        outbox = Outbox(store, collector.url, lease=CHILD_LEASE, timeout=5.0)
        assert outbox.deliver_once() is False, "a live lease must not be taken over"
        shifted["offset"] = CHILD_LEASE + 1
        assert outbox.deliver_once() is True
        assert collector.wait_for(2, timeout=1)
        first, second = collector.received[:2]
        assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"] == key
        assert first.body == second.body
        assert second.json()["text"] == "first"
        state, attempts, _payload = _rows(store, backend.outbox_table)[key]
        assert (state, attempts) == ("delivered", 2)
        assert outbox.deliver_once() is False
        assert len(collector.received) == 2
    finally:
        store.close()


def test_replaying_the_same_updates_after_reopening_leaves_one_capture_each(
    backend: Backend, collector: Collector
) -> None:
    """Recording the same batch again after a SIGKILL and a reopen adds no capture and keeps the cursor; on SQLite
    and on PostgreSQL."""
    updates = [update(5, CAPTURED_CHAT, "a"), update(6, CAPTURED_CHAT, "b"), update(7, 42, "c")]
    collector.answer(Reply(hold=60.0))
    child = _spawn("deliver", backend, collector.url, updates)
    _expect_line(child, "recorded")
    assert collector.wait_for(1, timeout=20)
    _kill9(child)

    from telegram_fence.delivery.outbox import CaptureRule

    for _ in range(2):  # replay twice, each time on a freshly opened file
        store = backend.open()
        try:
            before = _rows(store, backend.outbox_table)
            outbox = Outbox(store, collector.url, rule=CaptureRule(chats={CAPTURED_CHAT}))
            assert outbox.store.record(updates, 8, on_record=outbox.record_hook) == 0
            for one in updates[:2]:
                assert outbox.enqueue(one) == capture_key(one)  # direct enqueue is a no-op too
            after = _rows(store, backend.outbox_table)
            assert sorted(after) == sorted(capture_key(u) for u in updates[:2])
            assert after == before
            assert store.next_offset() == 8
        finally:
            store.close()


def test_sigkill_inside_the_record_transaction_leaves_neither_updates_nor_captures(
    backend: Backend, collector: Collector
) -> None:
    """A process killed while its capture hook runs leaves no update, no capture and the old cursor; on SQLite and
    on PostgreSQL."""
    store = backend.open()
    store.record([update(1, CAPTURED_CHAT)], 2)  # an earlier batch, so the cursor has a value to keep
    store.close()
    child = _spawn("hang-in-hook", backend, collector.url, [update(2, CAPTURED_CHAT), update(3, CAPTURED_CHAT)])
    _expect_line(child, "in-hook")
    _kill9(child)

    store = backend.open()
    try:
        assert store.next_offset() == 2
        stats = store.stats()
        assert stats["pending"] == 1  # only the earlier batch's update
        assert _rows(store, backend.outbox_table) == {}
        assert collector.received == []
    finally:
        store.close()
