"""Every database command on a file that is not a current fence database: exit 2, one line, the file untouched."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from telegram_fence.cli.database import DatabaseRefused, inspect, open_current, reader
from telegram_fence.cli.main import main
from telegram_fence.store.schema import LATEST
from telegram_fence.store.sqlite import SqliteUpdateStore


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse errors
        return int(exc.code or 0)


def snapshot(directory: Path) -> dict[str, str]:
    """Every file in ``directory`` with the hash of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir() if p.is_file()}


def foreign_rollback(path: Path) -> None:
    conn = apsw.Connection(str(path))
    conn.execute("CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users VALUES (1, 'ann')")
    conn.pragma("user_version", 7)
    conn.close()


def foreign_wal(path: Path) -> None:
    conn = apsw.Connection(str(path))
    conn.pragma("journal_mode", "wal")
    conn.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY); INSERT INTO orders VALUES (1)")
    conn.close()


def empty(path: Path) -> None:
    path.write_bytes(b"")


def text_file(path: Path) -> None:
    path.write_text("not a database at all\n" * 20)


def newer(path: Path) -> None:
    SqliteUpdateStore(path).close()
    conn = apsw.Connection(str(path))
    conn.pragma("user_version", LATEST + 1)
    conn.close()


def older(path: Path) -> None:
    SqliteUpdateStore(path, schema_version=1).close()


MAKERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "foreign rollback-mode file": (foreign_rollback, "not a telegram_fence database"),
    "foreign WAL file": (foreign_wal, "not a telegram_fence database"),
    "empty file": (empty, "not a telegram_fence database (an empty file)"),
    "text file": (text_file, "not a telegram_fence database (not a SQLite file)"),
    "newer schema": (newer, f"schema version {LATEST + 1} is newer than this telegram_fence ({LATEST})"),
    "older schema": (older, "older than this telegram_fence"),
}

COMMANDS: dict[str, list[str]] = {
    "status": ["status", "{db}"],
    "status --json --max-progress-age": ["status", "{db}", "--json", "--max-progress-age", "60"],
    "exhaustions": ["exhaustions", "{db}", "--json"],
    "exhaustions --ack": ["exhaustions", "{db}", "--ack", "1/1/abc"],
    "outbox": ["outbox", "{db}"],
    "outbox --requeue-failed": ["outbox", "{db}", "--requeue-failed"],
    "updates": ["updates", "{db}"],
    "show": ["show", "{db}", "1"],
    "retry": ["retry", "{db}", "1"],
    "prune": ["prune", "{db}", "--older-than", "0s"],
}


@pytest.mark.parametrize("kind", list(MAKERS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_database_command_never_touches_a_file_that_is_not_a_current_fence_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, command: str
) -> None:
    """Each command exits 2 with one line naming the problem; the file keeps its bytes and gains no -wal/-shm."""
    make, expected = MAKERS[kind]
    db = tmp_path / "app.db"
    make(db)
    before = snapshot(tmp_path)
    argv = [arg.format(db=db) for arg in COMMANDS[command]]
    assert run(argv) == 2
    out, err = capsys.readouterr()
    assert expected in err and str(db) in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err + out
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_directory_or_a_missing_path_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A directory is "not a telegram_fence database", a missing path is named; nothing is created."""
    for path, expected in ((tmp_path, "not a telegram_fence database (it is a directory)"),
                           (tmp_path / "missing.db", "no database file there")):
        argv = [arg.format(db=path) for arg in COMMANDS[command]]
        assert run(argv) == 2
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_schema_reports_versions_without_changing_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`schema` prints the version read-only: current 0, older 1 (pointing at migrate), newer 2, foreign 2."""
    cases = [("current.db", lambda p: SqliteUpdateStore(p).close(), 0, f"schema version {LATEST}"),
             ("older.db", older, 1, "telegram-fence migrate"),
             ("newer.db", newer, 2, "is newer than"),
             ("foreign.db", foreign_rollback, 2, "not a telegram_fence database")]
    for name, make, code, expected in cases:
        db = tmp_path / name
        make(db)
        before = snapshot(tmp_path)
        assert run(["schema", str(db)]) == code, name
        out, err = capsys.readouterr()
        assert expected in out + err, (name, out, err)
        assert snapshot(tmp_path) == before, name


def test_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    """A link is not followed: the real path must be named (as the store itself demands)."""
    real = tmp_path / "real.db"
    SqliteUpdateStore(real).close()
    link = tmp_path / "link.db"
    link.symlink_to(real)
    with pytest.raises(DatabaseRefused, match="symbolic link"):
        inspect(link)


def test_read_commands_leave_a_current_fence_database_byte_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a current fence database at rest, the read commands change no byte and leave no -wal/-shm (the store's
    -owners lock file, made by the store, stays as it was)."""
    db = tmp_path / "bot.db"
    with SqliteUpdateStore(db) as store:
        store.record([{"update_id": 5, "message": {"message_id": 1, "date": 0, "text": "x",
                                                   "chat": {"id": 9, "type": "private"}}}], 6)
    before = snapshot(tmp_path)
    assert set(before) == {"bot.db", "bot.db-owners"}
    for argv in (["status", str(db)], ["status", str(db), "--json"], ["exhaustions", str(db)], ["schema", str(db)],
                 ["outbox", str(db)], ["updates", str(db)], ["show", str(db), "5"]):
        assert run(argv) == 0, argv
        assert snapshot(tmp_path) == before, argv
    capsys.readouterr()


def test_the_migrate_command_upgrades_only_a_fence_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`migrate` upgrades an older fence database, reports a current one unchanged and refuses anything else."""
    old = tmp_path / "old.db"
    older(old)
    assert run(["migrate", str(old)]) == 0
    assert f"upgraded from schema version 1 to {LATEST}" in capsys.readouterr().out
    assert inspect(old).version == LATEST
    assert run(["status", str(old)]) == 0
    before = snapshot(tmp_path)
    assert run(["migrate", str(old)]) == 0
    assert "nothing changed" in capsys.readouterr().out
    assert snapshot(tmp_path) == before
    for make in (foreign_rollback, empty, newer):
        db = tmp_path / f"{make.__name__}.db"
        make(db)
        before = snapshot(tmp_path)
        assert run(["migrate", str(db)]) == 2
        assert capsys.readouterr().err.count("\n") == 1
        assert snapshot(tmp_path) == before
    assert run(["migrate", str(tmp_path / "none.db")]) == 2
    assert not (tmp_path / "none.db").exists()


def test_a_fence_database_switched_out_of_wal_is_refused_until_migrated(tmp_path: Path) -> None:
    """Opening would switch it back to WAL (a change), so read commands refuse it and migrate switches it."""
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    conn = apsw.Connection(str(db))
    conn.pragma("journal_mode", "delete")
    conn.close()
    with pytest.raises(DatabaseRefused, match="not in WAL mode"):
        open_current(db)
    assert run(["migrate", str(db)]) == 0
    open_current(db).close()


def test_the_reader_sees_commits_still_in_the_wal_of_a_running_bot(tmp_path: Path) -> None:
    """While another connection holds the file open (its -wal exists), the read-only check reads through it."""
    db = tmp_path / "bot.db"
    with SqliteUpdateStore(db) as store:
        store.record([{"update_id": 3}], 4)
        assert os.path.exists(f"{db}-wal")
        conn = reader(str(db))
        try:
            assert conn.execute("SELECT count(*) FROM fence_updates").fetchone()[0] == 1
        finally:
            conn.close()
        assert inspect(db).version == LATEST


def test_a_real_subprocess_on_a_foreign_file(tmp_path: Path) -> None:
    """`python -m telegram_fence status` on another application's SQLite file: exit 2, one line, file intact."""
    db = tmp_path / "app.db"
    foreign_rollback(db)
    before = snapshot(tmp_path)
    result = subprocess.run([sys.executable, "-m", "telegram_fence", "status", str(db)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == f"telegram-fence: {db}: not a telegram_fence database " \
                                    "(it has no fence_updates and fence_meta tables)"
    assert snapshot(tmp_path) == before
