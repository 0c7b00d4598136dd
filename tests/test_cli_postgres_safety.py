"""``updates``, ``show``, ``retry`` and ``prune`` given a PostgreSQL connection string are as safe as on a file:
a missing, foreign or misnamed table and an unreachable server are one line on stderr and exit 2, and nothing is
created or changed. Against the real server."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from pg_support import DSN, fresh_tables, new_table, requires_pg

from telegram_fence.cli.main import main

pytestmark = requires_pg

COMMANDS = {
    "updates": ["updates", "{dsn}", "--table", "{table}"],
    "show": ["show", "{dsn}", "1", "--table", "{table}"],
    "retry": ["retry", "{dsn}", "1", "--table", "{table}"],
    "prune": ["prune", "{dsn}", "--older-than", "0s", "--table", "{table}"],
}
#: Every other command that takes a connection string: refused alike.
OTHERS = {
    "status": ["status", "{dsn}", "--table", "{table}"],
    "exhaustions": ["exhaustions", "{dsn}", "--table", "{table}"],
    "exhaustions --ack": ["exhaustions", "{dsn}", "--ack", "1/1/abc", "--table", "{table}"],
    "calls": ["calls", "{dsn}", "--table", "{table}"],
    "steps": ["steps", "{dsn}", "--table", "{table}"],
    "states": ["states", "{dsn}", "--table", "{table}"],
}


def run(capsys: pytest.CaptureFixture[str], argv: list[str], **words: str) -> tuple[int, list[str]]:
    try:
        code = main([arg.format(**words) for arg in argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err.splitlines()


def _tables_like(prefix: str) -> list[tuple[str, str]]:
    """Every table whose name starts with ``prefix``, with its columns: what a command could have made or changed."""
    assert DSN is not None
    with psycopg.connect(DSN) as conn:
        return conn.execute(
            "SELECT table_name, string_agg(column_name || ' ' || data_type, ', ' ORDER BY ordinal_position) "
            "FROM information_schema.columns WHERE table_name LIKE %s GROUP BY table_name ORDER BY table_name",
            (prefix + "%",)).fetchall()


@pytest.fixture
def foreign() -> Iterator[str]:
    """Another application's tables named as a store's would be (``T`` and ``T_meta``), each holding a row."""
    with fresh_tables() as made:
        table = new_table("tf_foreign")
        made.append(table)
        assert DSN is not None
        with psycopg.connect(DSN) as conn:
            conn.execute(f"CREATE TABLE {table} (update_id bigint PRIMARY KEY, note text)")
            conn.execute(f"INSERT INTO {table} VALUES (1, 'mine')")
            conn.execute(f"CREATE TABLE {table}_meta (key text PRIMARY KEY, value text)")
            conn.execute(f"INSERT INTO {table}_meta VALUES ('cursor', 'not a number')")
        yield table


def _contents(table: str) -> list[list[tuple[object, ...]]]:
    assert DSN is not None
    with psycopg.connect(DSN) as conn:
        return [conn.execute(f"SELECT * FROM {name} ORDER BY 1").fetchall() for name in (table, f"{table}_meta")]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_missing_table_is_one_line_and_exit_2_and_nothing_is_created(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A ``--table`` that is not in the database is named in one line (exit 2); no table appears."""
    table = new_table("tf_absent")
    code, lines = run(capsys, COMMANDS[command], dsn=str(DSN), table=table)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"telegram-fence: no telegram_fence table {table} in that database"), lines
    assert _tables_like(table) == []


@pytest.mark.parametrize("command", [*COMMANDS, *OTHERS])
def test_another_applications_tables_are_refused_and_left_as_they_were(
    capsys: pytest.CaptureFixture[str], foreign: str, command: str
) -> None:
    """Tables of the right names that are not a fence store's are refused in one line (exit 2); their rows and
    columns are unchanged and no table is added beside them."""
    columns, rows = _tables_like(foreign), _contents(foreign)
    code, lines = run(capsys, {**COMMANDS, **OTHERS}[command], dsn=str(DSN), table=foreign)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("telegram-fence: "), lines
    assert _tables_like(foreign) == columns and _contents(foreign) == rows


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_bad_table_name_or_an_unreachable_server_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A table name that is no SQL identifier, and a server nobody listens for, are each one line and exit 2."""
    code, lines = run(capsys, COMMANDS[command], dsn=str(DSN), table="x; DROP TABLE y")
    assert code == 2 and len(lines) == 1 and "is not usable" in lines[0], lines
    code, lines = run(capsys, COMMANDS[command], dsn="host=127.0.0.1 port=1 dbname=test user=postgres",
                      table="fence_updates")
    assert code == 2 and len(lines) == 1 and lines[0].startswith("telegram-fence: cannot connect to PostgreSQL"), lines
