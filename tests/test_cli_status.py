"""`telegram-fence status` tells a running poller from a stopped one, and an idle bot is healthy."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually
from pg_support import DSN, fresh_tables, new_table, requires_pg

from telegram_fence import Fence
from telegram_fence.cli.main import main
from telegram_fence.store.sqlite import SqliteUpdateStore
from telegram_fence.testing import FakeBotAPI


def status(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(["status", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def status_json(capsys: pytest.CaptureFixture[str], db: Path) -> dict[str, Any]:
    code, out = status(capsys, str(db), "--json")
    assert code == 0, out
    return dict(json.loads(out))


@pytest.fixture
def slow_api() -> Iterator[FakeBotAPI]:
    """A fake server that holds a long poll as long as the client asks (up to 30 s)."""
    with FakeBotAPI(max_long_poll=30) as server:
        yield server


def test_a_fresh_bot_is_healthy_before_its_first_long_poll_returns(
    slow_api: FakeBotAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Right after start (the first 25 s long poll still open) the health check passes: a start is progress."""
    db = tmp_path / "bot.db"
    fence = Fence(telebot.TeleBot(slow_api.token, threaded=False), str(db), long_poll_timeout=25,
                  shutdown_timeout=2)
    fence.start()
    try:
        assert eventually(lambda: slow_api.polling, timeout=10)
        code, out = status(capsys, str(db), "--max-progress-age", "20")
        assert code == 0, out
        assert "running" in out and "UNHEALTHY" not in out
    finally:
        fence.pause()  # the open long poll returns with this update; the poller then waits, not polls
        slow_api.push_message(1, "bye")
        fence.stop()
        assert fence.join(15)


def test_an_idle_bot_marks_progress_with_every_empty_long_poll(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With nothing to fetch, each empty getUpdates answer moves the generation's progress forward."""
    db = tmp_path / "bot.db"
    with FakeBotAPI(max_long_poll=0.2) as api:
        fence = Fence(telebot.TeleBot(api.token, threaded=False), str(db), long_poll_timeout=0.2,
                      shutdown_timeout=2)
        fence.start()
        try:
            first = status_json(capsys, db)["generation"]["progress_at"]
            assert eventually(lambda: status_json(capsys, db)["generation"]["progress_at"] > first, timeout=10)
            assert api.pending_count == 0
            code, out = status(capsys, str(db), "--max-progress-age", "30")
            assert code == 0, out
        finally:
            fence.stop()
            assert fence.join(15)


def test_a_clean_stop_ends_the_generation_and_the_health_check_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After Fence.stop() status shows `stopped (clean stop)`, and --max-progress-age exits 1 at once."""
    db = tmp_path / "bot.db"
    with FakeBotAPI(max_long_poll=0.2) as api:
        fence = Fence(telebot.TeleBot(api.token, threaded=False), str(db), long_poll_timeout=0.2,
                      shutdown_timeout=2)
        fence.start()
        assert status(capsys, str(db), "--max-progress-age", "30")[0] == 0
        fence.stop()
        assert fence.join(15)
    shown = status_json(capsys, db)
    assert shown["poller"] == "stopped" and shown["generation"]["end_reason"] == "clean stop"
    code, out = status(capsys, str(db))
    assert code == 0 and "stopped (clean stop)" in out and "running" not in out
    code, out = status(capsys, str(db), "--max-progress-age", "30")
    assert code == 1 and "UNHEALTHY: poller generation 1 stopped: clean stop" in out


def test_a_poller_that_ended_on_its_own_shows_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A generation ended with a reason (e.g. a refused token) is shown stopped with that reason, unhealthy."""
    db = tmp_path / "bot.db"
    with SqliteUpdateStore(db) as store:
        generation = store.begin_generation()
        store.mark_progress(generation)
        store.end_generation(generation, "Telegram refused the bot token (401 Unauthorized)")
    code, out = status(capsys, str(db), "--max-progress-age", "30")
    assert code == 1
    assert "stopped (Telegram refused the bot token (401 Unauthorized))" in out


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "soon"])
def test_a_max_progress_age_that_is_not_a_positive_number_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """--max-progress-age takes seconds above 0; anything else is one line and exit 2."""
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    code, out = status(capsys, str(db), f"--max-progress-age={value}")
    assert code == 2 and "--max-progress-age" in out and len(out.strip().splitlines()) == 1


#: A locked store must be answered for before one of its own lock waits could have run out (5 s, the default busy
#: timeout of SQLite and lock_timeout of PostgreSQL): a generous bound on ``--timeout 1``, not a speed measurement.
_BEFORE_A_LOCK_WAIT = 4.0


def _timed_status(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[float, int, str]:
    started = time.monotonic()
    code, out = status(capsys, *argv)
    return time.monotonic() - started, code, out


def _holder(code: str, *args: str) -> subprocess.Popen[str]:
    """Another process that runs ``code`` (which takes a lock), prints ``locked``, and holds it until stdin closes."""
    child = subprocess.Popen([sys.executable, "-c", code + "print('locked', flush=True)\nsys.stdin.read()\n", *args],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "locked\n"
    return child


def _release(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.close()
    assert child.wait(10) == 0


def test_status_answers_normally_while_another_process_holds_the_sqlite_write_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In WAL mode readers do not wait for a writer: with another process in ``BEGIN EXCLUSIVE`` status still
    prints the counts and the health check passes, well before a busy timeout could have run out."""
    db = tmp_path / "bot.db"
    with SqliteUpdateStore(db) as store:
        store.mark_progress(store.begin_generation())
    child = _holder("import sqlite3, sys\nconn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                    "conn.execute('BEGIN EXCLUSIVE')\n", str(db))
    try:
        took, code, out = _timed_status(capsys, str(db), "--max-progress-age", "60", "--timeout", "1")
    finally:
        _release(child)
    assert code == 0 and took < _BEFORE_A_LOCK_WAIT, (took, out)
    assert "pending / claimed    0 / 0" in out and "UNHEALTHY" not in out and "telegram-fence:" not in out


def test_status_says_in_time_that_a_sqlite_file_another_process_locked_exclusively_cannot_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A connection in ``locking_mode=EXCLUSIVE`` that wrote keeps every reader out, WAL or not: status gives up
    at ``--timeout`` with one line saying the store is locked, exit 1 (health unknown), the file unchanged."""
    db = tmp_path / "bot.db"
    with SqliteUpdateStore(db) as store:
        store.mark_progress(store.begin_generation())
    child = _holder("import sqlite3, sys\nconn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                    "conn.execute('PRAGMA locking_mode=EXCLUSIVE')\nconn.execute('BEGIN IMMEDIATE')\n"
                    "conn.execute(\"UPDATE fence_meta SET value = value WHERE key = 'cursor'\")\n"
                    "conn.execute('COMMIT')\n", str(db))
    try:
        took, code, out = _timed_status(capsys, str(db), "--max-progress-age", "60", "--timeout", "1")
    finally:
        _release(child)
    assert code == 1 and took < _BEFORE_A_LOCK_WAIT, (took, out)
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("telegram-fence: the store could not be read within 1 s: "
                                                   "another connection holds a lock on it"), out
    assert status(capsys, str(db), "--max-progress-age", "60")[0] == 0  # the lock gone: read as ever


@requires_pg
def test_on_postgresql_status_says_in_time_that_a_locked_table_cannot_be_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """While another session holds ``ACCESS EXCLUSIVE`` on the inbox table (each read would wait the store's 5 s
    lock_timeout), ``status --max-progress-age`` answers by ``--timeout``: one line saying the store is locked,
    exit 1; once the lock goes, the counts as ever."""
    import psycopg

    from telegram_fence.store.postgres import PostgresUpdateStore

    assert DSN is not None
    with fresh_tables() as tables:
        table = new_table()
        tables.append(table)
        with PostgresUpdateStore(DSN, table=table) as store:
            store.mark_progress(store.begin_generation())
        with psycopg.connect(DSN) as other:
            other.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            took, code, out = _timed_status(capsys, DSN, "--table", table, "--max-progress-age", "60",
                                            "--timeout", "1")
            other.rollback()
        assert code == 1 and took < _BEFORE_A_LOCK_WAIT, (took, out)
        lines = out.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("telegram-fence: the store could not be read within 1 s: "
                                                       "another connection holds a lock on it"), out
        code, out = status(capsys, DSN, "--table", table, "--max-progress-age", "60")
        assert code == 0 and "pending / claimed    0 / 0" in out, out


@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_a_status_timeout_that_is_not_a_positive_number_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """--timeout takes seconds above 0; anything else is one line and exit 2."""
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    code, out = status(capsys, str(db), f"--timeout={value}")
    assert code == 2 and "--timeout" in out and len(out.strip().splitlines()) == 1
