"""The read commands answer within ``--timeout`` whatever holds the store: ``exhaustions``, ``calls``, ``steps``,
``states``, ``updates``, ``show`` and ``outbox`` as ``status`` does (a locked SQLite file or PostgreSQL table is one
line, exit 1), a PostgreSQL server that never answers is one line within ``--timeout`` (not libpq's fixed 5 s), and a
negative ``prune --older-than`` is one line naming the value.

Real SQLite files locked by a real second process, a real PostgreSQL session holding a table lock, a real TCP
listener that never answers; the commands run through ``telegram_fence.cli.main.main``.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pg_support import DSN, fresh_tables, new_table, requires_pg

from telegram_fence.cli.main import main
from telegram_fence.store.sqlite import SqliteUpdateStore

#: Well above ``--timeout 1`` (2 for a connect) and below the 5 s every one of these waited before: a bound on
#: the answer, not a speed measurement.
_IN_TIME = 4.0

#: The read commands and the arguments each takes after the database.
READS = {"exhaustions": [], "calls": [], "steps": [], "states": [], "updates": [], "show": ["1"], "outbox": []}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[float, int, list[str]]:
    """Run the command line; how long it took, its exit code, and the lines it printed (stdout and stderr)."""
    started = time.monotonic()
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    took = time.monotonic() - started
    captured = capsys.readouterr()
    return took, code, (captured.out + captured.err).strip().splitlines()


@contextmanager
def _held_by_child(db: Path, statements: str, ready: str, after: str = "") -> Iterator[None]:
    """A fence database at ``db`` with one pending update, on which another process (``python -c``, sqlite3) runs
    ``statements`` (lines of Python using ``conn``, autocommit) and prints ``ready``, then keeps what it holds until
    the block ends and runs ``after``; its clean exit (code 0) is checked afterwards."""
    with SqliteUpdateStore(db) as store:
        store.record([{"update_id": 1, "message": {"message_id": 1, "date": 1, "chat": {"id": 5, "type": "private"},
                                                   "text": "hi"}}], 2)
    code = (f"import sqlite3, sys\nconn = sqlite3.connect(sys.argv[1], isolation_level=None)\n{statements}"
            f"print({ready!r}, flush=True)\nsys.stdin.read()\n{after}")
    child = subprocess.Popen([sys.executable, "-c", code, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == f"{ready}\n"
        yield
    finally:
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(10) == 0


@pytest.fixture
def locked_file(tmp_path: Path) -> Iterator[Path]:
    """A current fence database that another process holds in ``locking_mode=EXCLUSIVE`` after a write (every
    reader is kept out, WAL or not) until the test ends."""
    db = tmp_path / "bot.db"
    with _held_by_child(db, "conn.execute('PRAGMA locking_mode=EXCLUSIVE')\nconn.execute('BEGIN IMMEDIATE')\n"
                        "conn.execute(\"UPDATE fence_meta SET value = value WHERE key = 'cursor'\")\n"
                        "conn.execute('COMMIT')\n", "locked"):
        yield db


@pytest.mark.parametrize("command", sorted(READS))
def test_a_read_command_says_within_its_timeout_that_a_locked_sqlite_file_cannot_be_read(
    locked_file: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """With the file locked by another process, ``COMMAND DB --timeout 1`` answers before a lock wait of the old
    5 s: one line saying the store is locked, exit 1 (as ``status``); once the lock is gone it reads as ever."""
    took, code, lines = run(capsys, command, str(locked_file), *READS[command], "--timeout", "1")
    assert code == 1 and took < _IN_TIME, (took, lines)
    assert len(lines) == 1 and re.match(
        r"telegram-fence( outbox)?: the store could not be read within 1 s: another connection holds a lock on it",
        lines[0]), lines


def test_the_outbox_listing_takes_no_write_lock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``outbox DB`` reads: while another process holds a write transaction on the file (a bot writing), the
    listing answers at once instead of waiting for the write lock; ``--requeue-failed`` (a write) still waits."""
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    code = ("import sqlite3, sys\nconn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "conn.execute('BEGIN IMMEDIATE')\nconn.execute(\"UPDATE fence_meta SET value = value\")\n"
            "print('writing', flush=True)\nsys.stdin.read()\nconn.execute('COMMIT')\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "writing\n"
        took, status, lines = run(capsys, "outbox", str(db), "--timeout", "1")
        assert status == 0 and took < 1.0, (took, lines)
        assert lines[0] == f"outbox of {db}" and "  pending            0" in lines, lines
        took, status, lines = run(capsys, "outbox", str(db), "--requeue-failed")
        assert status == 1 and took >= 4.0 and len(lines) == 1 and "locked" in lines[0], (took, lines)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(10) == 0


def test_every_read_command_takes_a_timeout_of_seconds_above_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--timeout`` is checked as ``status``'s is: ``0`` is one line naming it and exit 2; a good one reads."""
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    for command, extra in READS.items():
        _, code, lines = run(capsys, command, str(db), *extra, "--timeout", "0")
        assert code == 2 and len(lines) == 1 and "--timeout" in lines[0], (command, lines)
        _, code, lines = run(capsys, command, str(db), *extra, "--timeout", "2")
        assert code in (0, 1) and not any(line.startswith("telegram-fence: the store") for line in lines), lines


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A connection string to a TCP port that accepts connections and never answers (a server hung, or a
    firewall that lets the handshake through)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield f"host=127.0.0.1 port={listener.getsockname()[1]} dbname=test user=postgres"
    finally:
        listener.close()


@pytest.mark.parametrize("command", ["status", "exhaustions", "calls", "steps", "states"])
def test_a_postgresql_server_that_never_answers_is_one_line_within_the_timeout(
    silent_server: str, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Connecting follows ``--timeout`` (whole seconds, at least 2, as libpq counts them) instead of a fixed 5 s:
    ``--timeout 2`` gives up by then with one line saying it cannot connect (exit 2, as ever)."""
    pytest.importorskip("psycopg")
    took, code, lines = run(capsys, command, silent_server, "--timeout", "2")
    assert code == 2 and took < _IN_TIME, (took, lines)
    assert len(lines) == 1 and lines[0].startswith("telegram-fence: cannot connect to PostgreSQL: "), lines
    assert "within 2 s" in lines[0], lines


@requires_pg
@pytest.mark.parametrize(("command", "suffix"), [
    ("exhaustions", ""), ("calls", "_calls"), ("steps", "_step_results"), ("states", "_states")])
def test_on_postgresql_a_read_command_says_within_its_timeout_that_a_locked_table_cannot_be_read(
    capsys: pytest.CaptureFixture[str], command: str, suffix: str
) -> None:
    """While another session holds ``ACCESS EXCLUSIVE`` on the table the command reads, ``--timeout 1`` answers
    before the store's 5 s lock_timeout: one line saying the store is locked, exit 1; then it reads as ever."""
    import psycopg

    from telegram_fence.store.postgres import PostgresUpdateStore

    assert DSN is not None
    with fresh_tables() as tables:
        table = new_table()
        tables.append(table)
        PostgresUpdateStore(DSN, table=table).close()
        with psycopg.connect(DSN) as other:
            other.execute(f"LOCK TABLE {table}{suffix} IN ACCESS EXCLUSIVE MODE")
            took, code, lines = run(capsys, command, DSN, "--table", table, "--timeout", "1")
            other.rollback()
        assert code == 1 and took < _IN_TIME, (took, lines)
        assert len(lines) == 1 and lines[0].startswith(
            "telegram-fence: the store could not be read within 1 s: another connection holds a lock on it"), lines
        _, code, lines = run(capsys, command, DSN, "--table", table)
        assert code == 0, lines


@pytest.mark.parametrize("value", ["-5d", "-1h", "-0.5w"])
def test_a_negative_prune_age_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    value: str) -> None:
    """``prune --older-than -5d`` (a sign where none belongs) is refused in one line that names the value and
    says how to write it, exit 2, nothing deleted (before: argparse's "expected one argument")."""
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    _, code, lines = run(capsys, "prune", str(db), "--older-than", value)
    assert code == 2 and len(lines) == 1, lines
    assert f"{value!r} is negative" in lines[0] and f"e.g. {value[1:]}" in lines[0], lines


@pytest.mark.parametrize("argv", [["retry", "{db}", "1"], ["prune", "{db}", "--older-than", "1d"],
                                  ["exhaustions", "{db}", "--ack", "1/1/x"]], ids=lambda a: " ".join(a[:1] + a[2:]))
def test_a_write_to_a_file_another_process_keeps_locked_is_one_line_and_exit_1(tmp_path: Path, argv: list[str]) -> None:
    """A write command (a real process) on a file whose write lock another process holds past the 5 s busy timeout:
    one line saying it stayed locked, exit 1 (not done: try again; not bad input), and the file's rows unchanged."""
    db = tmp_path / "bot.db"
    # the child commits only after the command ran: it holds the write lock (BEGIN IMMEDIATE) all along
    with _held_by_child(db, "conn.execute('BEGIN IMMEDIATE')\nconn.execute(\"UPDATE fence_meta SET value = value\")\n",
                        "writing", after="conn.execute('COMMIT')\n"):
        result = subprocess.run([sys.executable, "-m", "telegram_fence", *[a.format(db=db) for a in argv]],
                                capture_output=True, text=True, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, (result.returncode, result.stderr)
    assert lines[0].startswith(f"telegram-fence: {db}: could not start a write transaction: the file stayed locked")
    assert "could not be read" not in lines[0]
    with SqliteUpdateStore(db) as store:
        assert store.stats()["pending"] == 1
