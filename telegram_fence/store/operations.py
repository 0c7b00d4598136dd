"""Operator queries on a fence's store, SQLite file or PostgreSQL table alike: list and show updates, retry an
exhaustion, prune old rows.

Safe while the bot runs: reads take any connection, and every write is a short transaction through the store's
``write()``, a few hundred rows at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..errors import ConfigurationError
from ..updates import REDELIVERY_WINDOW
from .schema import CLAIMED, EXHAUSTED, PENDING
from .values import STATE_NAMES

__all__ = [
    "NO_PAYLOAD",
    "STATE_FILTERS",
    "STATE_NAMES",
    "Tables",
    "list_updates",
    "prune_finished",
    "retry_exhausted",
    "show_update",
]

_STATE_CODES = {name: code for code, name in STATE_NAMES.items()}
#: ``--state`` choices: a state name, or ``open`` (pending or claimed).
STATE_FILTERS = (*_STATE_CODES, "open")
#: What :func:`retry_exhausted` returns for an exhaustion that holds no payload to run.
NO_PAYLOAD = "exhausted without a payload"

_COLUMNS = "update_id, chat_id, state, attempt, claim_id, due_at, error, recorded_at, changed_at, acknowledged"
_LIST = f"SELECT {_COLUMNS} FROM {{updates}}"
_SHOW = f"SELECT {_COLUMNS}, payload FROM {{updates}} WHERE update_id = ?"
_CAPTURES = (
    "SELECT key, state, attempts, last_status, last_error, created_at, changed_at FROM {outbox} "
    "WHERE update_id = ? ORDER BY key"
)
# Back to pending with a fresh attempt budget, acknowledged, its claim_id cleared (no old identity matches again).
_RETRY = (
    "UPDATE {updates} SET state = 0, attempt = 0, claim_id = NULL, due_at = 0, acknowledged = true, "
    "changed_at = ? WHERE update_id = ? AND state = 3 RETURNING update_id"
)
_STATE_AND_PAYLOAD = "SELECT state, payload FROM {updates} WHERE update_id = ?"
# Settled and skipped rows only, never one Telegram may still deliver again (see REDELIVERY_WINDOW).
_PRUNE_UPDATES = (
    "DELETE FROM {updates} WHERE update_id IN (SELECT update_id FROM {updates} "
    "WHERE state IN (2, 4) AND changed_at < ? "
    "AND NOT (update_id >= coalesce((SELECT value FROM {meta} WHERE key = 'cursor'), 0) AND recorded_at > ?) "
    "LIMIT ?) RETURNING update_id"
)
_PRUNE_CAPTURES = (
    "DELETE FROM {outbox} WHERE key IN (SELECT key FROM {outbox} "
    "WHERE state = 'delivered' AND changed_at < ? LIMIT ?) RETURNING key"
)


class Tables:
    """The tables and parameter style of a SQLite file (``postgres_table=None``) or of the PostgreSQL store on
    ``postgres_table``."""

    def __init__(self, postgres_table: str | None = None) -> None:
        self.postgres = postgres_table is not None
        base = postgres_table or "fence"
        self.names = {"updates": postgres_table or "fence_updates", "meta": f"{base}_meta",
                      "outbox": f"{base}_outbox"}

    def sql(self, template: str) -> str:
        """``template`` with its tables named and, on PostgreSQL, ``?`` written as ``%s``."""
        text = template.format(**self.names)
        return text.replace("?", "%s") if self.postgres else text

    def rows(self, conn: Any, template: str, params: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row of one statement run on ``conn`` (an APSW or a psycopg connection)."""
        return [tuple(row) for row in conn.execute(self.sql(template), tuple(params)).fetchall()]


def _row(row: tuple[Any, ...], now: float) -> dict[str, Any]:
    update_id, chat_id, state, attempt, claim_id, due_at, error, recorded_at, changed_at, acknowledged = row[:10]
    item: dict[str, Any] = {
        "update_id": update_id,
        "chat_id": chat_id,
        "state": STATE_NAMES.get(state, f"state{state}"),
        "attempts": attempt,
        "claim_id": claim_id,
        "error": error,
        "recorded_at": recorded_at,
        "changed_at": changed_at,
    }
    if state == EXHAUSTED:
        item["acknowledged"] = bool(acknowledged)
    if state == CLAIMED:
        item["lease_until"] = due_at
        item["lease_lapsed"] = due_at <= now
    elif state == PENDING:
        item["due_at"] = due_at if due_at > now else None
    return item


def list_updates(
    conn: Any,
    *,
    now: float,
    state: str | None = None,
    chat_id: int | None = None,
    limit: int = 50,
    tables: Tables | None = None,
) -> list[dict[str, Any]]:
    """Rows of the updates table, newest ``update_id`` first, as dicts without payloads, of ``state`` (one of
    :data:`STATE_FILTERS`) and ``chat_id``; :class:`ConfigurationError` for an unknown state or a ``limit`` below 1."""
    tables = tables or Tables()
    if limit < 1:
        raise ConfigurationError(f"--limit {limit} must be at least 1")
    where: list[str] = []
    params: list[Any] = []
    if state is not None:
        if state == "open":
            where.append("state < 2")
        elif state in _STATE_CODES:
            where.append("state = ?")
            params.append(_STATE_CODES[state])
        else:
            raise ConfigurationError(f"--state {state!r} is not one of {', '.join(STATE_FILTERS)}")
    if chat_id is not None:
        where.append("chat_id = ?")
        params.append(chat_id)
    sql = _LIST + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY update_id DESC LIMIT ?"
    params.append(limit)
    return [_row(row, now) for row in tables.rows(conn, sql, params)]


def show_update(conn: Any, update_id: int, *, now: float, tables: Tables | None = None) -> dict[str, Any] | None:
    """One row with its raw update (``update``) and its outbox captures; ``None`` when not stored."""
    tables = tables or Tables()
    found = tables.rows(conn, _SHOW, (update_id,))
    if not found:
        return None
    item = _row(found[0], now)
    item["update"] = json.loads(found[0][10])
    names = ("key", "state", "attempts", "last_status", "last_error", "created_at", "changed_at")
    item["captures"] = [dict(zip(names, row, strict=True)) for row in tables.rows(conn, _CAPTURES, (update_id,))]
    return item


def _payloadless(payload: Any) -> bool:
    """Whether a stored payload is only the ``{"update_id": N}`` stub of an update that could not be stored."""
    try:
        decoded = json.loads(payload)
    except (TypeError, ValueError):
        return True
    return not isinstance(decoded, dict) or len(decoded) <= 1


def retry_exhausted(store: Any, update_ids: Iterable[int], *, tables: Tables | None = None) -> dict[int, str | None]:
    """Put each exhausted update back to pending, due now, with a fresh attempt budget, one short transaction each;
    the exhaustion counts as acknowledged. Returns, per id, ``None`` when it was put back, or the state that kept it
    (``"not stored"``, ``"pending"``, …, or :data:`NO_PAYLOAD`)."""
    tables = tables or Tables()
    results: dict[int, str | None] = {}
    for update_id in update_ids:
        with store.write(durable=True) as conn:
            found = tables.rows(conn, _STATE_AND_PAYLOAD, (update_id,))
            if not found:
                results[update_id] = "not stored"
                continue
            state, payload = found[0]
            if state == EXHAUSTED and _payloadless(payload):
                results[update_id] = NO_PAYLOAD
                continue
            done = tables.rows(conn, _RETRY, (store.clock(), update_id))
        results[update_id] = None if done else STATE_NAMES.get(state, f"state{state}")
    return results


def prune_finished(store: Any, before: float, *, batch: int = 500, tables: Tables | None = None) -> dict[str, int]:
    """Delete settled and skipped updates, and delivered captures, last changed before ``before``, ``batch`` rows
    per transaction; never an open or exhausted update, an undelivered capture, nor an update Telegram may still
    deliver again (:data:`~telegram_fence.updates.REDELIVERY_WINDOW`). Returns ``{"updates": n, "captures": m}``."""
    tables = tables or Tables()
    if batch < 1:
        raise ConfigurationError(f"batch={batch!r} must be at least 1")
    counts = {"updates": 0, "captures": 0}
    floor = store.clock() - REDELIVERY_WINDOW
    for name, sql in (("updates", _PRUNE_UPDATES), ("captures", _PRUNE_CAPTURES)):
        params = (before, floor, batch) if name == "updates" else (before, batch)
        while True:
            with store.write() as conn:
                deleted = len(tables.rows(conn, sql, params))
            counts[name] += deleted
            if deleted < batch:
                break
    return counts
