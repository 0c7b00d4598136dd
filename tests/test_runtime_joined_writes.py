"""The other threads' writes join the dispatcher's round: one transaction (one commit) for the writes a round takes
and its own settles, claims and records, each write in a savepoint of its own, each sender answered only after
that commit.

A real ``WorkerPool`` on a real SQLite file; the writes come from real threads through the pool's ``Writer``. The
store notes which outermost ``write()`` transaction each write ran in (the dispatcher's round opens one; a write
made on its own opens its own).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw
import pytest
from helpers import eventually

from telegram_fence import SqliteUpdateStore
from telegram_fence.retry import default_retry
from telegram_fence.runtime.mailbox import Mailbox, Writer
from telegram_fence.runtime.pool import WorkerPool


class NumberedTransactions(SqliteUpdateStore):
    """A real SQLite store whose outermost ``write()`` blocks are numbered (nested ones are savepoints)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.opened = 0  # outermost write() blocks so far
        self._depth = threading.local()
        with super().write() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS notes(name TEXT PRIMARY KEY, tx INTEGER)")

    def write(self, *, durable: bool = False) -> Any:
        return self._numbered(super().write(durable=durable))

    @contextmanager
    def _numbered(self, block: Any) -> Iterator[Any]:
        depth = getattr(self._depth, "n", 0)
        if depth == 0:
            self.opened += 1
            self._depth.tx = self.opened
        self._depth.n = depth + 1
        try:
            with block as conn:
                yield conn
        finally:
            self._depth.n = depth

    def note(self, name: str, fail: bool = False) -> int:
        """Insert ``name`` in a write of its own (a savepoint inside a round); the transaction's number.
        ``fail``: raise after the insert (the insert must be undone)."""
        with self.write() as conn:
            conn.execute("INSERT INTO notes VALUES (?, ?)", (name, self._depth.tx))
            if fail:
                raise ValueError(f"{name} fails")
            return int(self._depth.tx)

    def stored(self) -> dict[str, int]:
        """The notes as another connection sees them (committed only)."""
        conn = apsw.Connection(self.path, flags=apsw.SQLITE_OPEN_READONLY)
        try:
            return {name: tx for name, tx in conn.execute("SELECT name, tx FROM notes")}
        finally:
            conn.close()


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[tuple[WorkerPool, NumberedTransactions]]:
    store = NumberedTransactions(tmp_path / "bot.db")
    writer = Writer(Mailbox(), store.record)
    pool = WorkerPool(store, writer, handle=lambda update, ctx: None, parse=lambda raw: raw,
                      workers=1, lease=30.0, max_attempts=5, retry=default_retry, handler_timeout=60)
    pool.start()
    try:
        yield pool, store
    finally:
        pool.stop()
        assert pool.join(10)
        store.close()


def test_writes_taken_by_one_round_commit_together_and_a_failing_one_fails_alone(
    pool: tuple[WorkerPool, NumberedTransactions],
) -> None:
    """While the dispatcher is held inside a write, six threads hand it writes (one of them raises after its
    insert): the five others ran in one transaction (before: five), each is committed when its sender is
    answered, and the failing one's insert is undone, its sender alone getting its ``ValueError``."""
    pool_, store = pool
    writer = pool_.writer
    assert eventually(writer.serving)
    entered, release = threading.Event(), threading.Event()

    def hold() -> int:
        entered.set()
        assert release.wait(10)
        return store.note("hold")

    names = [f"w{i}" for i in range(6)]

    def send(name: str) -> Any:
        try:
            tx = writer.call(lambda: store.note(name, fail=name == "w3"))
        except ValueError as exc:
            return exc
        assert name in store.stored(), f"{name} was answered before its transaction committed"
        return tx

    with ThreadPoolExecutor(7, thread_name_prefix="test-sender") as senders:
        held = senders.submit(writer.call, hold)
        assert entered.wait(10)
        answers = [senders.submit(send, name) for name in names]
        assert eventually(lambda: len(pool_.mailbox._writes) == 6)  # all six wait for the next round
        release.set()
        results = {name: future.result(15) for name, future in zip(names, answers, strict=True)}
        held.result(15)
    failed = results.pop("w3")
    assert isinstance(failed, ValueError) and str(failed) == "w3 fails"
    assert len(set(results.values())) == 1, results  # one transaction for the five
    stored = store.stored()
    assert "w3" not in stored and all(stored[name] == tx for name, tx in results.items()), stored


def test_a_round_that_fails_runs_its_writes_again_each_on_its_own(tmp_path: Path) -> None:
    """When the rest of the round raises after the writes ran in it, the round's transaction rolls back (their
    inserts too); each write is then run again in a transaction of its own, so it is answered with its own
    outcome (stored, or its own error), and the round's error is raised to the dispatcher."""
    from telegram_fence.runtime.mailbox import WriteRequest, joined

    store = NumberedTransactions(tmp_path / "bot.db")
    try:
        requests = [WriteRequest(lambda: store.note("a")), WriteRequest(lambda: store.note("b", fail=True)),
                    WriteRequest(lambda: store.note("c"), durable=False)]
        with pytest.raises(RuntimeError, match="claiming failed"), joined(requests, lambda: store.write(durable=True)):
            raise RuntimeError("claiming failed")
        assert all(request.wait(0) for request in requests)
        a, c = requests[0].outcome(), requests[2].outcome()
        with pytest.raises(ValueError, match="b fails"):
            requests[1].outcome()
        assert a != c  # each in its own transaction, after the round's rolled back
        assert store.stored() == {"a": a, "c": c}
    finally:
        store.close()
