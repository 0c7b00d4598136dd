"""Operator queries on a fence's SQLite file: list and show updates, retry an exhaustion, prune old rows.

The command line's ``updates``, ``show``, ``retry`` and ``prune`` use these; they are safe while the bot
runs: reads go through any connection to the file (a read-only one is enough), and every write is a
short ``BEGIN IMMEDIATE`` transaction taken through :meth:`SqliteUpdateStore.write` (so under its busy
timeout), a few hundred rows at a time.

May import: ``errors``, ``store/*``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import apsw

from ..errors import ConfigurationError
from ..updates import REDELIVERY_WINDOW
from .schema import CLAIMED, EXHAUSTED, PENDING, SETTLED, SKIPPED
from .sqlite.connection import first

__all__ = [
    "NO_PAYLOAD",
    "STATE_FILTERS",
    "STATE_NAMES",
    "list_updates",
    "prune_finished",
    "retry_exhausted",
    "show_update",
]

#: The names an operator uses for the states of ``fence_updates.state``.
STATE_NAMES = {PENDING: "pending", CLAIMED: "claimed", SETTLED: "settled", EXHAUSTED: "exhausted", SKIPPED: "skipped"}
_STATE_CODES = {name: code for code, name in STATE_NAMES.items()}
#: ``--state`` choices: a state name, or ``open`` (pending or claimed).
STATE_FILTERS = (*_STATE_CODES, "open")

_COLUMNS = "update_id, chat_id, state, attempt, claim_id, due_at, error, recorded_at, changed_at, acknowledged"
_LIST = f"SELECT {_COLUMNS} FROM fence_updates"
_SHOW = f"SELECT {_COLUMNS}, payload FROM fence_updates WHERE update_id = ?"
_CAPTURES = (
    "SELECT key, state, attempts, last_status, last_error, created_at, changed_at FROM fence_outbox "
    "WHERE update_id = ? ORDER BY key"
)
# Back to pending with a fresh attempt budget. The exhaustion it was is acknowledged by this very change:
# it leaves state 3, so no reader of unacknowledged exhaustions finds it again. Its identity's claim_id is
# cleared; the next claim draws a fresh one, so no identity of an earlier attempt can ever match again.
_RETRY = (
    "UPDATE fence_updates SET state = 0, attempt = 0, claim_id = NULL, due_at = 0, acknowledged = 1, "
    "changed_at = ? WHERE update_id = ? AND state = 3"
)
_STATE_OF = "SELECT state FROM fence_updates WHERE update_id = ?"
# An exhaustion that holds no payload: the update could not be read or stored when it arrived, and only
# its ``{"update_id": N}`` stub is kept. Retrying it would run a handler on nothing and settle the stub.
_PAYLOADLESS = (
    "SELECT 1 FROM fence_updates WHERE update_id = ? AND state = 3 "
    "AND (NOT json_valid(payload) OR (SELECT count(*) FROM json_each(payload)) <= 1)"
)
#: What :func:`retry_exhausted` returns for an exhaustion that holds no payload to run.
NO_PAYLOAD = "exhausted without a payload"
# Settled and skipped rows only: never an open row, never an exhaustion (acknowledged or not).
# ... and never a row Telegram may still deliver again (see REDELIVERY_WINDOW): kept until recorded that long ago.
_PRUNE_UPDATES = (
    "DELETE FROM fence_updates WHERE update_id IN (SELECT update_id FROM fence_updates "
    "WHERE state IN (2, 4) AND changed_at < ? "
    "AND NOT (update_id >= coalesce((SELECT value FROM fence_meta WHERE key = 'cursor'), 0) AND recorded_at > ?) "
    "LIMIT ?)"
)
_PRUNE_CAPTURES = (
    "DELETE FROM fence_outbox WHERE key IN (SELECT key FROM fence_outbox "
    "WHERE state = 'delivered' AND changed_at < ? LIMIT ?)"
)
_HAS_OUTBOX = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fence_outbox'"


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
    conn: apsw.Connection,
    *,
    now: float,
    state: str | None = None,
    chat_id: int | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """Rows of ``fence_updates``, newest ``update_id`` first, as dicts (payloads left out).

    ``state`` is one of :data:`STATE_FILTERS`; ``chat_id`` keeps one chat's rows. Raises
    :class:`ConfigurationError` for an unknown state or a ``limit`` below 1.
    """
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
    return [_row(row, now) for row in conn.execute(sql, params).fetchall()]


def show_update(conn: apsw.Connection, update_id: int, *, now: float) -> dict[str, Any] | None:
    """One row with its raw update (``update``) and its outbox captures; ``None`` when not stored."""
    row = first(conn.execute(_SHOW, (update_id,)))
    if row is None:
        return None
    item = _row(row, now)
    item["update"] = json.loads(row[10])
    captures: list[dict[str, Any]] = []
    if first(conn.execute(_HAS_OUTBOX)) is not None:
        for key, state, attempts, status, error, created, changed in conn.execute(_CAPTURES, (update_id,)):
            captures.append({"key": key, "state": state, "attempts": attempts, "last_status": status,
                             "last_error": error, "created_at": created, "changed_at": changed})
    item["captures"] = captures
    return item


def retry_exhausted(store: Any, update_ids: Iterable[int]) -> dict[int, str | None]:
    """Put each exhausted update back to pending, due now, with a fresh attempt budget.

    ``store`` is a :class:`~telegram_fence.store.sqlite.SqliteUpdateStore` (its ``write()`` and
    ``clock`` are used). One short transaction per update. Returns, per id, ``None`` when it was
    put back, or the state that kept it (``"not stored"``, ``"pending"``, …, or :data:`NO_PAYLOAD` for an
    exhaustion that holds only its ``update_id``: the update could not be read or stored when it arrived, so
    there is nothing to run); such a row is unchanged.
    The exhaustion counts as acknowledged (the operator decided): an ``on_exhausted`` that has not
    seen it yet never will, and the next failure of the update is a new exhaustion with a new identity.
    """
    results: dict[int, str | None] = {}
    for update_id in update_ids:
        with store.write(durable=True) as conn:
            if first(conn.execute(_PAYLOADLESS, (update_id,))) is not None:
                results[update_id] = NO_PAYLOAD
                continue
            conn.execute(_RETRY, (store.clock(), update_id))
            if conn.changes() == 1:
                results[update_id] = None
                continue
            row = first(conn.execute(_STATE_OF, (update_id,)))
        results[update_id] = "not stored" if row is None else STATE_NAMES.get(row[0], f"state{row[0]}")
    return results


def prune_finished(store: Any, before: float, *, batch: int = 500) -> dict[str, int]:
    """Delete settled and skipped updates, and delivered captures, last changed before ``before``.

    Never touches a pending, claimed or exhausted update (acknowledged or not), nor an undelivered
    capture, nor an update Telegram may still deliver again: one the cursor has not passed (the webhook
    stored it) recorded less than :data:`~telegram_fence.updates.REDELIVERY_WINDOW` (24 h) ago, whatever
    ``before`` says. Deletes ``batch`` rows per transaction, so a running bot waits at most one short
    transaction. Returns ``{"updates": n, "captures": m}``.
    """
    if batch < 1:
        raise ConfigurationError(f"batch={batch!r} must be at least 1")
    counts = {"updates": 0, "captures": 0}
    with store.write() as conn:
        has_outbox = first(conn.execute(_HAS_OUTBOX)) is not None
    steps = [("updates", _PRUNE_UPDATES)] + ([("captures", _PRUNE_CAPTURES)] if has_outbox else [])
    floor = store.clock() - REDELIVERY_WINDOW
    for name, sql in steps:
        params = (before, floor, batch) if name == "updates" else (before, batch)
        while True:
            with store.write() as conn:
                conn.execute(sql, params)
                deleted = conn.changes()
            counts[name] += deleted
            if deleted < batch:
                break
    return counts
