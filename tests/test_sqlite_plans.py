"""The SQLite claim statements look up a chat's older rows through an index, never by walking the table."""

from __future__ import annotations

import re
from pathlib import Path

import apsw
import pytest

from telegram_fence.store.sqlite import SqliteUpdateStore, sql

STATEMENTS = {"HEADS": sql.HEADS, "CANDIDATES": sql.CANDIDATES}


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_the_retry_check_of_a_claim_statement_searches_an_index_of_open_rows(tmp_path: Path, name: str) -> None:
    """Each claim statement finds a chat's row waiting for its retry through the index of open rows by chat: a
    search by rowid below the candidate's id reads every settled row too, once per candidate."""
    path = str(tmp_path / "bot.db")
    SqliteUpdateStore(path).close()
    statement = STATEMENTS[name]
    conn = apsw.Connection(path)
    try:
        names = set(re.findall(r":(\w+)", statement))
        values = {"now": 1.0, "chats": "[1]", "settle": "[]", "scan": 10, "with_payload": 0,
                  "chatless": "[]"}
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + statement, {k: values[k] for k in names})]
    finally:
        conn.close()
    waits = [line for line in plan if line.startswith(("SEARCH w ", "SCAN w"))]
    assert waits == ["SEARCH w USING INDEX fence_updates_open_chat (chat_id=? AND update_id<?)"], plan

