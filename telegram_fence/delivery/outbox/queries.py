"""Queries over the outbox table for operators and the fence: counts, failed captures, re-queueing, pruning."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ...errors import ConfigurationError
from ...store.contract import RecordHook
from .dialect import Sql, db, first

log = logging.getLogger("telegram_fence.outbox.queries")


class OutboxWrites(Protocol):
    """What the outbox's queries need of a store: its write transaction (``SqliteUpdateStore`` and
    ``PostgresUpdateStore`` offer it; see :meth:`~telegram_fence.store.UpdateStore.write`)."""

    def write(self, *, durable: bool = False) -> AbstractContextManager[Any]:
        """A write transaction; store calls on this thread inside it join it."""
        ...


class ClockedOutboxWrites(OutboxWrites, Protocol):
    """:class:`OutboxWrites` and the store's clock (capture times are in it)."""

    @property
    def clock(self) -> Callable[[], float]:
        """The store's time, in seconds."""
        ...


class OutboxStore(ClockedOutboxWrites, Protocol):
    """What an :class:`~telegram_fence.delivery.outbox.Outbox` needs of its store: the write transaction, the
    clock and ``record`` with ``on_record=`` (the fast path of
    :meth:`~telegram_fence.store.UpdateStore.record`)."""

    def record(
        self,
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        *,
        skip: Collection[int] = (),
        generation: int | None = None,
        on_record: RecordHook | None = None,
        body: bytes | str | None = None,
    ) -> int:
        """Record ``updates`` and raise the cursor to ``next_offset`` in one transaction, ``on_record`` in it."""
        ...

#: The states of a capture, in the order a successful one goes through them (plus ``failed``).
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
_FAILED = Sql(
    "SELECT key, update_id, chat_id, attempts, last_status, last_error, changed_at FROM {outbox} "
    "WHERE state = 'failed' ORDER BY changed_at, key LIMIT ?"
)
_PRUNE = Sql("DELETE FROM {outbox} WHERE state = 'delivered' AND changed_at < ?")


def outbox_stats(store: ClockedOutboxWrites) -> dict[str, Any]:
    """Counts of captures by state and the age in seconds of the oldest undelivered one (``None`` if none).

    ``{"pending", "delivering", "delivered", "failed", "oldest_pending_age", "next_due_at"}``;
    "undelivered" means pending or delivering.
    """
    counts: dict[str, Any] = dict.fromkeys(STATES, 0)
    with store.write() as handle:
        conn = db(handle)
        now = store.clock()
        for state, count in conn.execute(_COUNTS):
            counts[state] = count
        oldest = first(conn.execute(_OLDEST_UNDELIVERED))[0]
        next_due = first(conn.execute(_EARLIEST_DUE))[0]
    counts["oldest_pending_age"] = None if oldest is None else max(0.0, now - oldest)
    counts["next_due_at"] = next_due
    return counts


def requeue_failed(store: ClockedOutboxWrites, keys: Iterable[str] | None = None) -> int:
    """Put failed captures back to pending, due now, with a fresh attempt budget; return how many.

    ``keys=None`` re-queues every failed capture; otherwise only the failed ones among ``keys``
    (other keys are ignored; :func:`requeue_named` tells which were re-queued). Their last error and answer stay
    until the next attempt. Raises :class:`ConfigurationError` for keys that are not strings.
    """
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


def requeue_named(store: ClockedOutboxWrites, keys: Iterable[str]) -> set[str]:
    """Put the failed captures among ``keys`` back to pending (as :func:`requeue_failed`); return the keys that
    were re-queued, so a caller can name the others (not stored, or not failed). One transaction.
    Raises :class:`ConfigurationError` for keys that are not strings."""
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
        conn = db(handle)
        rows = conn.execute(_FAILED, (limit,)).fetchall()
    names = ("key", "update_id", "chat_id", "attempts", "last_status", "last_error", "failed_at")
    return [dict(zip(names, row, strict=True)) for row in rows]


def prune_delivered(store: OutboxWrites, delivered_before: float) -> int:
    """Delete delivered captures last changed before ``delivered_before``; return how many.

    Never deletes a pending, delivering or failed capture.
    """
    with store.write() as handle:
        conn = db(handle)
        conn.execute(_PRUNE, (delivered_before,))
        return int(conn.changes())
