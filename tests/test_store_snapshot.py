"""A statement left open past a write block, and what StoreUnavailable then says (the APSW 3.54.0.0 failure)."""

from __future__ import annotations

import threading
from pathlib import Path

import apsw
import pytest

from telegram_fence.errors import StoreUnavailable
from telegram_fence.store.sqlite import SqliteUpdateStore
from telegram_fence.store.sqlite.connection import first, one


def _write_elsewhere(path: Path) -> None:
    """Commit one write on another connection, from another thread (as the outbox thread does)."""

    def run() -> None:
        other = apsw.Connection(str(path))
        other.set_busy_timeout(5000)
        with other:
            other.execute("INSERT INTO t VALUES (99)")
        other.close()

    thread = threading.Thread(target=run, name="fence-test-writer")
    thread.start()
    thread.join()


def test_a_cursor_left_open_past_its_block_gets_a_message_naming_the_cause(tmp_path: Path) -> None:
    """A cursor kept open past write() makes the next write fail at once; the error names that cause, not a lock."""
    path = tmp_path / "bot.db"
    with SqliteUpdateStore(path, busy_timeout=5.0) as store:
        with store.write() as conn:
            conn.execute("CREATE TABLE t(x)")
            conn.execute("INSERT INTO t VALUES (1), (2)")
        with store.write() as conn:
            kept = conn.execute("SELECT x FROM t")
            assert kept.fetchone() == (1,)
        _write_elsewhere(path)
        with pytest.raises(StoreUnavailable) as info, store.write() as conn:
            conn.execute("INSERT INTO t VALUES (3)")
        message = str(info.value)
        assert "left open" in message and "old snapshot" in message, message
        assert "5 s" not in message and "process" not in message, message
        assert isinstance(info.value.__cause__, apsw.BusyError)
        kept.close()
        with store.write() as conn:  # closing the cursor is the cure
            conn.execute("INSERT INTO t VALUES (3)")
            assert conn.execute("SELECT count(*) FROM t").fetchall() == [(4,)]


@pytest.mark.parametrize("helper", [first, one], ids=["first", "one"])
def test_the_single_row_helpers_close_their_cursor(tmp_path: Path, helper: object) -> None:
    """first() and one() close the cursor, so a write after another thread's write starts."""
    path = tmp_path / "bot.db"
    with SqliteUpdateStore(path) as store:
        with store.write() as conn:
            conn.execute("CREATE TABLE t(x)")
            conn.execute("INSERT INTO t VALUES (1), (2)")
        with store.write() as conn:
            cursor = conn.execute("SELECT x FROM t ORDER BY x")
            assert helper(cursor) == (1,)  # type: ignore[operator]
        _write_elsewhere(path)
        with store.write() as conn:  # the cursor is still referenced, but its statement was closed
            conn.execute("INSERT INTO t VALUES (3)")
        assert cursor is not None


def test_a_lock_held_past_the_busy_timeout_says_how_long_it_waited(tmp_path: Path) -> None:
    """A write lock another connection holds past busy_timeout is reported with the real wait and the timeout."""
    path = tmp_path / "bot.db"
    with SqliteUpdateStore(path, busy_timeout=0.2) as store:
        other = apsw.Connection(str(path))
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreUnavailable) as info, store.write():
                pass
        finally:
            other.execute("ROLLBACK")
            other.close()
        message = str(info.value)
        assert "stayed locked for 0.2" in message and "busy_timeout=0.2" in message, message
        assert "another connection" in message, message
