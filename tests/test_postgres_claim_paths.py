"""The PostgreSQL claim's fast paths on a real server: the literals its scripts carry, and the lean one-update
claim that looks only at the backlog's first rows (and must still find an update further on)."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any

import pytest
from pg_support import DSN, drop_tables, new_table, requires_pg

pytestmark = requires_pg


@pytest.fixture
def table() -> Iterator[str]:
    name = new_table()
    yield name
    drop_tables(name)


def _update(update_id: int, chat: int) -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0,
                                                "chat": {"id": chat, "type": "private"}, "text": "x"}}


@pytest.mark.parametrize("conforming", ["on", "off"])
def test_script_literals_reach_the_server_unchanged(conforming: str) -> None:
    """Every value a script writes as a literal comes back from the server as it was sent, whatever
    ``standard_conforming_strings``; a text holding NUL is refused before anything is sent."""
    import psycopg

    from telegram_fence.store.postgres.prepared import literal

    texts = ["", "plain", "it's", "''", "back\\slash", "\\'", "E'x'", "$1 %s %(x)s ;", "ünï © 🐍", "line\nbreak\t"]
    numbers: list[Any] = [0, -1, 2**62, -(2**63), 1.5, -0.25, 1e300, 5e-324, float("inf"), float("-inf"), True, False]
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"SET standard_conforming_strings = {conforming}")
        for text in texts:
            row = conn.execute(f"SELECT {literal(text)}::text").fetchone()
            assert row is not None and row[0] == text, f"{text!r} came back as {row!r}"
        for number in numbers:
            cast = "boolean" if isinstance(number, bool) else "float8" if isinstance(number, float) else "numeric"
            row = conn.execute(f"SELECT {literal(number)}::{cast}").fetchone()
            assert row is not None and row[0] == number, f"{number!r} came back as {row!r}"
        class Level(enum.IntEnum):
            HIGH = 7

        class Name(str):
            pass

        for value, cast, expected in ((Level.HIGH, "integer", 7), (Name("o'k\\"), "text", "o'k\\")):
            row = conn.execute(f"SELECT {literal(value)}::{cast}").fetchone()
            assert row is not None and row[0] == expected, f"{value!r} came back as {row!r}"
        nan = conn.execute(f"SELECT {literal(float('nan'))}::float8").fetchone()
        assert nan is not None and nan[0] != nan[0]
        assert conn.execute(f"SELECT {literal(None)}::text IS NULL").fetchone() == (True,)
    with pytest.raises(psycopg.DataError):
        literal("nul\x00byte")
    with pytest.raises(TypeError):
        literal(b"bytes")


def test_a_claim_past_a_window_of_busy_rows_finds_the_next_free_chat(table: str) -> None:
    """The backlog's first 300 updates all belong to one chat whose first update is claimed (live): none of them
    may be claimed, and the one-update claim (which looks at the first rows only, then at every chat's head)
    still takes the update of another chat behind them, then reports nothing more while the chat is busy."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    store = PostgresUpdateStore(DSN, table=table)
    try:
        store.record([_update(i, 7) for i in range(1, 301)] + [_update(301, 8)], 302)
        first = store.claim_owned(30.0)
        assert first is not None and first.update_id == 1
        other = store.claim_owned(30.0)
        assert other is not None and other.update_id == 301, "the free chat behind the busy one was not claimed"
        assert store.claim_owned(30.0) is None, "an update of a chat with a live claim was claimed"
        assert store.settle_owned(first.identity)
        after = store.claim_owned(30.0)
        assert after is not None and after.update_id == 2, "the busy chat's next update did not come next"
    finally:
        store.close()
