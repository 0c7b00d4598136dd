"""``SqliteUpdateStore``: the update store in one SQLite file (WAL) through APSW, composed by concern; its own
methods are the housekeeping and observation: pruning, the dead owners' claims, the writability probe, poller
generations and ``stats``."""

from __future__ import annotations

import os
import time
from typing import Any, cast

import apsw

from ...errors import StoreUnavailable
from ...updates import REDELIVERY_WINDOW
from ..owners import owner_is_dead
from ..values import check_door, count_states, door_of, stats_shape, storable_text
from . import sql
from .claims import Claims
from .connection import first, one
from .fenced import Fenced
from .recording import Recording

__all__ = ["SqliteUpdateStore"]


class SqliteUpdateStore(Recording, Claims, Fenced):
    """The durable update store in one SQLite file.

    ``SqliteUpdateStore(path, *, clock=time.time, synchronous="FULL", work_synchronous="NORMAL",
    busy_timeout=5.0, schema_version=LATEST)``.

    ``synchronous`` is the durability of the inbox write and of exhaustions; ``work_synchronous`` that of claims,
    renewals, settlements and fenced transactions (with WAL, ``NORMAL`` commits survive a process crash; power
    loss can only rerun a handler). May be shared between threads. A symlink, a non-database file or a newer
    schema raise at construction (:class:`StoreCorrupt`, :class:`SchemaError`); a lock held past
    ``busy_timeout`` raises :class:`StoreUnavailable`.
    """

    def prune(self, settled_before: float) -> int:
        """Delete settled and skipped rows, and acknowledged exhaustions, last changed before ``settled_before``;
        return how many. Never an open or unacknowledged row, nor one Telegram may still deliver again (not passed
        by the cursor, recorded less than :data:`~telegram_fence.updates.REDELIVERY_WINDOW` ago)."""
        with self._write(self._work_sync) as conn:
            conn.execute(sql.PRUNE, (settled_before, self.clock() - REDELIVERY_WINDOW))
            return conn.changes()

    def release_dead_claims(self) -> dict[str, int]:
        """End now every live claim of a gone process of this host (its attempt counts); return the count per owner,
        with those this store released as it opened alone on the file (see :mod:`.connection`)."""
        released, self._gone_claims = dict(self._gone_claims), {}  # those released as the store opened, alone
        released.update(self._release_owners(owner_is_dead))
        return released

    def probe_writable(self, timeout: float) -> None:
        """Prove within ``timeout`` seconds, writing nothing, that this process may write the file now; else raise
        :class:`StoreUnavailable` saying which lock stayed held, or that the file opens read-only."""
        deadline = time.monotonic() + max(0.0, timeout)
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            raise StoreUnavailable(
                f"{self.path}: another thread of this process held the write lock for more than {timeout:.2g} s "
                "(a write that waits for another process's lock, or a long one)"
            )
        try:
            conn = apsw.Connection(self.path, flags=apsw.SQLITE_OPEN_READWRITE)
            try:
                if conn.readonly("main"):
                    raise StoreUnavailable(f"{self.path} opens read-only for this process; it can take no write")
                conn.set_busy_timeout(max(1, int((deadline - time.monotonic()) * 1000)))
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
            finally:
                conn.close()
        except apsw.BusyError as exc:
            raise StoreUnavailable(
                f"{self.path} stayed locked for more than {timeout:.2g} s by another process (or connection)"
            ) from exc
        except apsw.Error as exc:
            raise StoreUnavailable(f"{self.path} cannot be written: {type(exc).__name__}: {exc}") from exc
        finally:
            self._lock.release()

    def begin_generation(self, pid: int | None = None, *, door: str = "poll") -> int:
        """Start a new generation of ``door`` (``"poll"`` or ``"webhook"``, else :class:`ConfigurationError`); return
        its number (never reused)."""
        check_door(door)
        with self._write(self._record_sync) as conn:
            number = int(one(conn.execute(sql.BEGIN_GENERATION, (pid or os.getpid(), self.clock())))[0])
            if door == "webhook":
                conn.execute(sql.NOTE_WEBHOOK_GENERATION, (number,))
            return number

    def mark_progress(self, generation: int) -> None:
        """Record that ``generation``'s poller completed a ``getUpdates`` call now."""
        with self._write(self._work_sync) as conn:
            conn.execute(sql.PROGRESS, (self.clock(), generation))

    def end_generation(self, generation: int, reason: str) -> None:
        """Record why ``generation``'s poller ended (once; later calls keep the first reason)."""
        with self._write(self._record_sync) as conn:
            conn.execute(sql.END_GENERATION, (self.clock(), storable_text(reason), generation))

    def stats(self) -> dict[str, Any]:
        """The store's counts, in the shape of :func:`~telegram_fence.store.values.stats_shape`."""
        with self._read() as conn:
            rows = cast("list[tuple[int, int, int]]", conn.execute(sql.STATE_COUNTS).fetchall())
            oldest = one(conn.execute(sql.OLDEST_OPEN))[0]
            generation = first(conn.execute(sql.LATEST_GENERATION))
            version = int(conn.pragma("user_version"))
            conflicts = first(conn.execute(sql.READ_PAYLOAD_CONFLICTS))
            webhook = first(conn.execute(sql.READ_WEBHOOK_GENERATION))
            cursor = first(conn.execute(sql.READ_CURSOR))
        gen_info = None
        if generation is not None:
            keys = ("generation", "pid", "started_at", "progress_at", "ended_at", "end_reason")
            gen_info = dict(zip(keys, generation, strict=True))
            gen_info["door"] = door_of(gen_info["generation"], webhook[0] if webhook else None)
        return stats_shape(
            count_states(rows),
            cursor=int(cursor[0]) if cursor else 0,
            oldest_open_age=None if oldest is None else self.clock() - oldest,
            generation=gen_info,
            schema_version=version,
            payload_conflicts=int(conflicts[0]) if conflicts else 0,
            backend="sqlite",
        )
