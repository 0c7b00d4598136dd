"""The outbox table's SQL on either backend (SQLite's text, run by :func:`rows`) and its queries: counts, failed
captures, re-queueing, pruning."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ...errors import ConfigurationError
from ...store.tables import is_sqlite, outbox_table

log = logging.getLogger("telegram_fence.outbox.queries")


class OutboxWrites(Protocol):
    """What the outbox needs of a store: its write transaction and its clock."""

    def write(self, *, durable: bool = False) -> AbstractContextManager[Any]: ...

    @property
    def clock(self) -> Callable[[], float]: ...


def rows(conn: Any, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run ``statement`` (SQLite's text: ``?`` parameters, table ``fence_outbox``; every outbox statement returns rows)
    on an APSW or psycopg connection and return all its rows (read to the end: an APSW statement left open keeps its
    read snapshot; a psycopg pipeline is synced)."""
    if not is_sqlite(conn):
        statement = statement.replace("fence_outbox", str(outbox_table(conn, "fence_outbox"))).replace("?", "%s")
    return [tuple(row) for row in conn.execute(statement, tuple(params)).fetchall()]


STATES = ("pending", "delivering", "delivered", "failed")

EARLIEST_DUE = "SELECT min(due_at) FROM fence_outbox WHERE state = 'pending'"
_COUNTS = "SELECT state, count(*) FROM fence_outbox GROUP BY state"
_OLDEST_UNDELIVERED = "SELECT min(created_at) FROM fence_outbox WHERE state IN ('pending', 'delivering')"
_REQUEUE = ("UPDATE fence_outbox SET state = 'pending', attempts = 0, due_at = ?, changed_at = ? WHERE state = 'failed'"
            " AND (? OR key = ?) RETURNING key")
_FAILED = ("SELECT key, update_id, chat_id, attempts, last_status, last_error, changed_at FROM fence_outbox "
           "WHERE state = 'failed' ORDER BY changed_at, key LIMIT ?")
_PRUNE = "DELETE FROM fence_outbox WHERE state = 'delivered' AND changed_at < ? RETURNING key"


def outbox_stats(store: OutboxWrites) -> dict[str, Any]:
    """Captures by state, ``oldest_pending_age`` (seconds the oldest pending or delivering one waited, or ``None``)
    and ``next_due_at``."""
    counts: dict[str, Any] = dict.fromkeys(STATES, 0)
    with store.write() as conn:
        now = store.clock()
        counts.update(rows(conn, _COUNTS))
        ((oldest,),) = rows(conn, _OLDEST_UNDELIVERED)
        ((counts["next_due_at"],),) = rows(conn, EARLIEST_DUE)
    counts["oldest_pending_age"] = None if oldest is None else max(0.0, now - oldest)
    return counts


def requeue_failed(store: OutboxWrites, keys: Iterable[str] | None = None) -> set[str]:
    """Put failed captures (all, or those among ``keys``) back to pending, due now, with a fresh attempt budget;
    return the keys re-queued (the others were not failed captures). Raises :class:`ConfigurationError` for keys that
    are not strings."""
    wanted = None if keys is None else [keys] if isinstance(keys, str) else list(keys)
    if wanted is not None and not all(isinstance(k, str) for k in wanted):
        raise ConfigurationError("requeue_failed(keys=...) takes capture keys (strings)")
    with store.write() as conn:
        now = store.clock()
        pairs = [(True, None)] if wanted is None else [(False, key) for key in wanted]
        done = {str(row[0]) for every, key in pairs for row in rows(conn, _REQUEUE, (now, now, every, key))}
    if done:
        log.info("failed captures re-queued", extra={"count": len(done)})
    return done


def failed_captures(store: OutboxWrites, limit: int = 20) -> list[dict[str, Any]]:
    """Up to ``limit`` failed captures, oldest failure first: key, ids, attempts, last status and error."""
    with store.write() as conn:
        found = rows(conn, _FAILED, (limit,))
    names = ("key", "update_id", "chat_id", "attempts", "last_status", "last_error", "failed_at")
    return [dict(zip(names, row, strict=True)) for row in found]


def prune_delivered(store: OutboxWrites, delivered_before: float) -> int:
    """Delete delivered captures last changed before ``delivered_before`` (never another state); return how many."""
    with store.write() as conn:
        return len(rows(conn, _PRUNE, (delivered_before,)))
