"""The outbox table's SQL on either backend (:class:`Sql` run by :func:`db`) and its queries: counts, failed captures,
re-queueing, pruning."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ...errors import ConfigurationError
from ...store.contract import RecordHook
from ...store.tables import is_sqlite, outbox_table

log = logging.getLogger("telegram_fence.outbox.queries")


class OutboxWrites(Protocol):
    """What the outbox's queries need of a store: its write transaction and its clock."""

    def write(self, *, durable: bool = False) -> AbstractContextManager[Any]: ...

    @property
    def clock(self) -> Callable[[], float]: ...


class OutboxStore(OutboxWrites, Protocol):
    """What an :class:`~telegram_fence.delivery.outbox.Outbox` needs of its store: also ``record(on_record=)``."""

    def record(self, updates: Sequence[Mapping[str, Any]], next_offset: int, *, skip: Collection[int] = (),
               generation: int | None = None, on_record: RecordHook | None = None,
               body: bytes | str | None = None) -> int: ...


class Sql:
    """One outbox statement with ``?`` placeholders and ``{outbox}`` for the table: SQLite's text names the table
    ``fence_outbox``; PostgreSQL's (``postgres=`` where the dialects differ) takes ``%s`` and the store's table."""

    __slots__ = ("postgres", "sqlite")

    def __init__(self, text: str, postgres: str | None = None) -> None:
        self.sqlite = text.format(outbox="fence_outbox")
        self.postgres = postgres or text.replace("?", "%s")


class _Db:
    """``execute`` (of :class:`Sql` statements) and ``changes`` over an APSW or psycopg connection."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._sqlite = is_sqlite(conn)
        self._table = None if self._sqlite else str(outbox_table(conn, "fence_outbox"))
        self._changes = 0

    def execute(self, sql: Sql, params: Sequence[Any] = ()) -> Any:
        if self._sqlite:
            return self._conn.execute(sql.sqlite, tuple(params))
        cursor = self._conn.execute(sql.postgres.format(outbox=self._table), tuple(params))
        self._changes = max(0, cursor.rowcount)
        return cursor

    def changes(self) -> int:
        return int(self._conn.changes()) if self._sqlite else self._changes


def db(conn: Any) -> _Db:
    """The outbox's interface over an APSW or psycopg connection (``conn`` itself when it is one already)."""
    return conn if isinstance(conn, _Db) else _Db(conn)


def first(cursor: Any) -> Any:
    """The first row of ``cursor`` (``None`` if none), the cursor closed: an APSW statement left open at commit keeps
    its read snapshot and fails the thread's next write."""
    try:
        return cursor.fetchone()
    finally:
        cursor.close()


STATES = ("pending", "delivering", "delivered", "failed")

_EARLIEST_DUE = Sql("SELECT min(due_at) FROM {outbox} WHERE state = 'pending'")
_COUNTS = Sql("SELECT state, count(*) FROM {outbox} GROUP BY state")
_OLDEST_UNDELIVERED = Sql("SELECT min(created_at) FROM {outbox} WHERE state IN ('pending', 'delivering')")
_REQUEUE = "UPDATE {outbox} SET state = 'pending', attempts = 0, due_at = ?, changed_at = ? WHERE state = 'failed'"
_REQUEUE_ALL = Sql(_REQUEUE)
_REQUEUE_KEYS = Sql(
    _REQUEUE + " AND key IN (SELECT value FROM json_each(?)) RETURNING key",
    postgres=_REQUEUE.replace("?", "%s") + " AND key IN (SELECT json_array_elements_text(%s::json)) RETURNING key",
)
_FAILED = Sql("SELECT key, update_id, chat_id, attempts, last_status, last_error, changed_at FROM {outbox} "
              "WHERE state = 'failed' ORDER BY changed_at, key LIMIT ?")
_PRUNE = Sql("DELETE FROM {outbox} WHERE state = 'delivered' AND changed_at < ?")


def outbox_stats(store: OutboxWrites) -> dict[str, Any]:
    """Captures by state, ``oldest_pending_age`` (seconds the oldest pending or delivering one waited, or ``None``)
    and ``next_due_at``."""
    counts: dict[str, Any] = dict.fromkeys(STATES, 0)
    with store.write() as handle:
        conn = db(handle)
        now = store.clock()
        counts.update(conn.execute(_COUNTS))
        oldest = first(conn.execute(_OLDEST_UNDELIVERED))[0]
        counts["next_due_at"] = first(conn.execute(_EARLIEST_DUE))[0]
    counts["oldest_pending_age"] = None if oldest is None else max(0.0, now - oldest)
    return counts


def requeue_failed(store: OutboxWrites, keys: Iterable[str] | None = None) -> int:
    """Put failed captures (all, or those among ``keys``) back to pending, due now, with a fresh attempt budget;
    return how many. Raises :class:`ConfigurationError` for keys that are not strings."""
    if keys is not None:
        return len(requeue_named(store, keys))
    with store.write() as handle:
        conn = db(handle)
        now = store.clock()
        conn.execute(_REQUEUE_ALL, (now, now))
        count = conn.changes()
    if count:
        log.info("failed captures re-queued", extra={"count": count})
    return count


def requeue_named(store: OutboxWrites, keys: Iterable[str]) -> set[str]:
    """:func:`requeue_failed` for ``keys``, returning the keys re-queued (the others were not failed captures)."""
    wanted = [keys] if isinstance(keys, str) else list(keys)
    if not all(isinstance(k, str) for k in wanted):
        raise ConfigurationError("requeue_failed(keys=...) takes capture keys (strings)")
    with store.write() as handle:
        conn = db(handle)
        now = store.clock()
        done = {str(row[0]) for row in conn.execute(_REQUEUE_KEYS, (now, now, json.dumps(wanted))).fetchall()}
    if done:
        log.info("failed captures re-queued", extra={"count": len(done)})
    return done


def failed_captures(store: OutboxWrites, limit: int = 20) -> list[dict[str, Any]]:
    """Up to ``limit`` failed captures, oldest failure first: key, ids, attempts, last status and error."""
    with store.write() as handle:
        rows = db(handle).execute(_FAILED, (limit,)).fetchall()
    names = ("key", "update_id", "chat_id", "attempts", "last_status", "last_error", "failed_at")
    return [dict(zip(names, row, strict=True)) for row in rows]


def prune_delivered(store: OutboxWrites, delivered_before: float) -> int:
    """Delete delivered captures last changed before ``delivered_before`` (never another state); return how many."""
    with store.write() as handle:
        conn = db(handle)
        conn.execute(_PRUNE, (delivered_before,))
        return int(conn.changes())
