"""What a newcomer types wrong or asks of the wrong file: one `telegram-fence: …` line, the right exit, no change."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from telegram_fence.cli.main import main
from telegram_fence.store.schema import LATEST
from telegram_fence.store.sqlite import SqliteUpdateStore
from telegram_fence.textlog import IN_MESSAGE, TextFormatter

HUGE = "99999999999999999999999"
PG_DSN = os.environ.get("TELEGRAM_FENCE_PG_DSN")


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse errors
        return int(exc.code or 0)


def files(directory: Path) -> dict[str, str]:
    """Every file in ``directory`` with the hash of its bytes (what "nothing written" compares)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir() if p.is_file()}


def message(update_id: int) -> dict[str, object]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "text": "hi",
                                                "chat": {"id": 1, "type": "private"}}}


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A current fence database holding three pending updates, closed (no -wal/-shm left)."""
    path = tmp_path / "bot.db"
    with SqliteUpdateStore(path) as store:
        store.record([message(i) for i in (1, 2, 3)], 4)
    return str(path)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


OVERFLOWS = [
    ["show", "{db}", HUGE],
    ["retry", "{db}", HUGE],
    ["updates", "{db}", "--chat", HUGE],
    ["updates", "{db}", "--chat", "-" + HUGE],
    ["updates", "{db}", "--limit", HUGE],
    ["exhaustions", "{db}", "--ack", f"{HUGE}/1/abc"],
    ["exhaustions", "{db}", "--ack", f"1/{HUGE}/abc"],
    ["calls", "{db}", "--update", HUGE],
    ["states", "{db}", "--chat", HUGE],
    ["states", "{db}", "--chat", "-" + HUGE],
    ["outbox", "{db}", "--failed", HUGE],
]


@pytest.mark.parametrize("argv", OVERFLOWS, ids=[" ".join(a[2:]) for a in OVERFLOWS])
def test_a_number_too_large_for_the_database_is_one_line_and_exit_2(
    db: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """An id or count beyond SQLite's 64 bits is refused before the file is touched (was: OverflowError, exit 1)."""
    before = files(Path(db).parent)
    assert run([a.format(db=db) for a in argv]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("telegram-fence") and "9223372036854775807" in line, line
    assert files(Path(db).parent) == before


def test_a_huge_update_id_in_a_real_process_has_no_traceback(db: str) -> None:
    """`telegram-fence show DB <huge>` as a process: exit 2 and one line, no OverflowError traceback."""
    done = subprocess.run([sys.executable, "-m", "telegram_fence", "show", db, HUGE], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2, done
    assert "too large for an update id" in one_line(done.stderr)


def test_prune_refuses_a_bare_number_and_its_help_names_the_units(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`prune --older-than 7` (no unit) deletes nothing and asks for a unit; the help lists s, m, h, d, w."""
    before = files(Path(db).parent)
    assert run(["prune", db, "--older-than", "7"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "'7' has no unit" in line and "7d for days" in line and "7s seconds" in line, line
    assert files(Path(db).parent) == before
    assert run(["prune", db, "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "s seconds, m minutes, h hours, d days, w weeks" in help_text, help_text
    assert run(["prune", db, "--older-than", "7s"]) == 0
    assert "older than 7 s" in capsys.readouterr().out


def test_broadcast_rate_zero_says_it_is_a_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`broadcast run --rate 0` names a rate in messages per second, not "a number of seconds"."""
    assert run(["broadcast", "run", "news", "--rate", "0", "--dir", str(tmp_path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "is not a rate above 0 (messages per second" in line and "seconds above" not in line, line


def test_migrate_of_a_current_file_says_it_is_current(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`migrate` of a current file says so (no `4 -> 4`), also when it only switched the file back to WAL."""
    assert run(["migrate", db]) == 0
    out = capsys.readouterr().out
    assert f"already current (schema version {LATEST}); nothing changed" in out and "->" not in out, out
    conn = apsw.Connection(db)
    conn.pragma("journal_mode", "delete")
    conn.close()
    assert run(["migrate", db]) == 0
    out = capsys.readouterr().out
    assert f"already current (schema version {LATEST}); switched it back to WAL mode" in out and "->" not in out


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["show", "{db}", "77"], "telegram-fence: update 77 is not stored in"),
        (["retry", "{db}", "1"], "telegram-fence: update 1: not retried: it is pending, not exhausted"),
        (["exhaustions", "{db}", "--ack", "1/1/abc"], "telegram-fence: no unacknowledged exhaustion 1/1/abc"),
    ],
    ids=["show", "retry", "ack"],
)
def test_what_could_not_be_done_is_a_prefixed_line_and_exit_1(
    db: str, capsys: pytest.CaptureFixture[str], argv: list[str], wanted: str
) -> None:
    """`show` of a missing update, `retry` of a pending one and `--ack` of an unknown identity: prefixed, exit 1."""
    assert run([a.format(db=db) for a in argv]) == 1
    assert one_line(capsys.readouterr().err).startswith(wanted)


@pytest.mark.parametrize("command", ["migrate", "outbox"])
def test_a_connection_string_given_to_a_sqlite_only_command_says_which_commands_take_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """Only status, exhaustions, updates, show, retry, prune, calls, steps and states take a PostgreSQL connection
    string; the others say so."""
    monkeypatch.chdir(tmp_path)
    assert run([command, "host=127.0.0.1 dbname=bot user=someone"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "status, exhaustions, updates, show, retry, prune, calls, steps and states take a connection string" \
        in line and "someone" in line, line
    assert list(tmp_path.iterdir()) == []


def test_the_text_line_of_a_retry_states_the_delay_and_the_error_once() -> None:
    """Extras a message already states (IN_MESSAGE) are left out of the text line, kept as fields otherwise."""
    record = logging.LogRecord("telegram_fence.workers", logging.WARNING, __file__, 1,
                               "update %s: handler failed: %s; will retry in %s s", (7, "ValueError: boom", 1.5), None)
    record.update_id = 7
    record.retry_in = 1.5
    record.err = ValueError("boom")
    setattr(record, IN_MESSAGE, ("retry_in", "err"))
    line = TextFormatter().format(record)
    assert line.count("1.5") == 1 and line.count("boom") == 1, line
    assert "will retry in 1.5 s" in line and "update_id=7" in line and "retry_in=" not in line


def test_a_real_handler_failure_logs_its_delay_once(api: object, bot: object, db: str) -> None:
    """A failing handler's retry warning (plain-text fallback logging) prints its delay and its error once each."""
    from helpers import make_fence, stop

    from telegram_fence.testing import FakeBotAPI

    assert isinstance(api, FakeBotAPI)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("telegram_fence")
    logger.addHandler(handler)
    try:
        fence = make_fence(bot, db, retry=lambda exc, attempt: 30.0)

        @bot.message_handler(func=lambda m: True)  # type: ignore[attr-defined,misc]
        def fail(message: object) -> None:
            raise ValueError("boom-once")

        fence.start()
        api.push_message(1, "hi")
        assert api.wait_for(lambda: "will retry in" in stream.getvalue(), timeout=10)
        stop(fence)
    finally:
        logger.removeHandler(handler)
    line = next(x for x in stream.getvalue().splitlines() if "will retry in" in x)
    assert line.count("boom-once") == 1 and "retry_in=" not in line and "will retry in 30 s" in line, line


@pytest.mark.skipif(not PG_DSN, reason="TELEGRAM_FENCE_PG_DSN is not set: no PostgreSQL server")
@pytest.mark.parametrize("command", ["status", "exhaustions", "calls", "steps", "states", "broadcast run --db"])
def test_a_missing_postgres_database_is_one_line_at_once(command: str, tmp_path: Path) -> None:
    """Every command that takes a DSN, given one naming a database that does not exist, connects once and prints
    one line, exit 2, in a real process (was: 10 s and 8 identical pool errors; `calls`, `states` and `broadcast
    run --db` still 10 s and 5 to 9 lines of the pool's own warnings)."""
    import psycopg.conninfo

    params = psycopg.conninfo.conninfo_to_dict(PG_DSN or "")
    params["dbname"] = "telegram_fence_no_such_database"
    dsn = psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]
    env = dict(os.environ, TELEGRAM_BOT_TOKEN="123456:" + "A" * 35)
    argv = [command, dsn]
    if command.startswith("broadcast"):
        (tmp_path / "audience.txt").write_text("1\n2\n", encoding="utf-8")
        assert run(["broadcast", "create", "news", "--audience", str(tmp_path / "audience.txt"), "--text", "hi",
                    "--dir", str(tmp_path)]) == 0
        argv = ["broadcast", "run", "news", "--dir", str(tmp_path), "--api-url", "http://127.0.0.1:9", "--db", dsn]
    done = subprocess.run([sys.executable, "-m", "telegram_fence", *argv], capture_output=True, text=True,
                          timeout=60, check=False, env=env)
    assert done.returncode == 2, done
    line = one_line(done.stderr)
    assert line.startswith("telegram-fence") and "cannot connect to PostgreSQL:" in line and "does not exist" in line


@pytest.mark.skipif(not PG_DSN, reason="TELEGRAM_FENCE_PG_DSN is not set: no PostgreSQL server")
@pytest.mark.parametrize("command", ["status", "exhaustions", "calls", "steps", "states"])
def test_a_table_that_is_not_there_is_one_line_in_the_words_of_the_command_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --table naming no table of that database says to check --table (was: the library's advice to pass
    create_table=True, which no command takes); a name that is no table name is refused naming what may be one."""
    assert run([command, PG_DSN or "", "--table", "tf_no_such_table"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("telegram-fence: no telegram_fence table tf_no_such_table in that database") and \
        "check --table" in line and "create_table" not in line, line
    assert run([command, PG_DSN or "", "--table", "bad;name"]) == 2
    assert "is not usable: pass a lower-case identifier" in one_line(capsys.readouterr().err)


@pytest.mark.skipif(not PG_DSN, reason="TELEGRAM_FENCE_PG_DSN is not set: no PostgreSQL server")
def test_postgres_status_names_the_store_instead_of_an_unexplained_schema_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PostgreSQL `status` says which table it read and how to see its DDL, not a bare `schema version 1`."""
    from pg_support import drop_tables, new_table

    from telegram_fence.store.postgres import PostgresUpdateStore

    table = new_table("tf_clistatus")
    store = PostgresUpdateStore(PG_DSN or "", table=table)
    try:
        assert run(["status", PG_DSN or "", "--table", table]) == 0
        out = capsys.readouterr().out
        assert f"PostgreSQL, table {table} (its DDL: telegram-fence schema --postgres {table})" in out, out
        assert "schema version" not in out
    finally:
        store.close()
        drop_tables(table)


@pytest.mark.parametrize("dsn", ["host=db dbname=bot user=u password=hunter2", "host=db password='hun ter2' dbname=bot",
                                 "postgresql://u:hunter2@db:5432/bot", "postgresql://db/bot?password=hunter2"])
@pytest.mark.parametrize("command", [["migrate"], ["schema"], ["outbox"]], ids=lambda c: c[0])
def test_a_connection_string_given_to_a_sqlite_only_command_never_shows_its_password(
    command: list[str], dsn: str
) -> None:
    """The refusal of a connection string by a SQLite-only command (a real process) names it without its
    password, whether ``password=`` or a URL's ``user:password@``."""
    argv = [command[0], dsn, *command[1:]]
    result = subprocess.run([sys.executable, "-m", "telegram_fence", *argv], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "looks like a PostgreSQL connection string" in result.stderr, result.stderr
    assert "hunter2" not in result.stderr and "hun ter2" not in result.stderr, result.stderr
    assert "db" in result.stderr
