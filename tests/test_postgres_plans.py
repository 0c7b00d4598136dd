"""The generic plans of the record's and the round's statements on a real server never read the whole inbox table.

A session prepares the statements it repeats once and runs them on their generic plans (``force_generic_plan``), which
the server makes when the statement first runs, from what it knows of the table then: in a fresh deployment (or a
benchmark), an empty table with no statistics. A plan that scans the table per batch is cheap then and keeps being
used while the table grows, until statistics are gathered (measured: the record's lookup of the payloads stored
before, a hash join over a sequential scan, took the server's time per 100-update round from 4 ms to 11 ms at
120,000 rows). Each test prepares a statement the way a session does, on a table of rows the planner has no
statistics for, and asks for its generic plan."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_support import requires_pg, store_of

from telegram_fence.store.postgres.claims import settled_count
from telegram_fence.store.postgres.recording import differing_sql, insert_sql

pytestmark = requires_pg


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    with store_of("postgres", tmp_path) as opened:
        with opened.write() as conn:  # rows the planner knows nothing of (never analysed)
            conn.execute(
                f"INSERT INTO {opened.table} (update_id, payload, chat_id, state, attempt, claim_id, due_at, "
                "recorded_at, changed_at) SELECT g, '{\"update_id\":' || g || '}', g % 50, "
                "CASE WHEN g % 10 = 0 THEN 1 ELSE 2 END, 1, 'c' || g, 0, 0, 0 FROM generate_series(1, 2000) AS g")
        yield opened


_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")


def _generic_plan(store: Any, sql: str) -> dict[str, Any]:
    """The generic plan of ``sql`` (its ``%(name)s`` / ``%(name)b`` placeholders made ``$n``), prepared in a session
    of the store's own (its ``EXPLAIN (FORMAT JSON)``, every argument ``NULL``: a generic plan does not look at
    them)."""
    names: list[str] = []
    for name in _PLACEHOLDER.findall(sql):
        if name not in names:
            names.append(name)
    body = _PLACEHOLDER.sub(lambda m: f"${names.index(m.group(1)) + 1}", sql)
    with store.write() as conn:
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE tf_plan AS {body}")
        args = f"({', '.join('NULL' for _ in names)})" if names else ""
        (plan,) = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE tf_plan{args}").fetchone()
        conn.execute("DEALLOCATE tf_plan")
    return plan[0]["Plan"]


def _scans_of(node: dict[str, Any], table: str) -> list[str]:
    """The sequential scans of ``table`` anywhere in the plan ``node`` (with the part of the plan they serve)."""
    found = []
    if node.get("Node Type") == "Seq Scan" and node.get("Relation Name") == table.rpartition(".")[2]:
        found.append(str(node.get("Subplan Name") or node.get("Parent Relationship")))
    for child in node.get("Plans", []):
        found += _scans_of(child, table)
    return found


@pytest.mark.parametrize("statement", ["settle", "insert", "differing payloads"])
def test_the_batch_statements_never_scan_the_table(store: Any, statement: str) -> None:
    """The round's settle, the record's insert and its check of the payloads stored before find their rows by index,
    not by reading the table."""
    t = store.table
    text = {"settle": settled_count(t), "insert": insert_sql(t), "differing payloads": differing_sql(t)}[statement]
    assert _scans_of(_generic_plan(store, text), store.table) == []


def test_a_batch_inside_the_stored_ids_still_finds_the_payloads_stored_before(store: Any) -> None:
    """A batch whose ids fall between stored ones counts an id stored before with another payload, and stores the
    new ones."""
    ids = [1000, 2001]
    new = store.record(
        [{"update_id": i, "message": {"message_id": i, "date": 0, "chat": {"id": 9000 + i, "type": "private"},
                                      "text": "another"}} for i in ids], 2002)
    assert new == 1
    assert store.stats()["payload_conflicts"] == 1
    assert store.next_offset() == 2002
