"""The base of ``PostgresUpdateStore`` (on :class:`~.connection.Connections`): opening (schema, columns, clock), and
what the fence's runtime uses beyond the claims (``write``, poller generations, ``stats``, ``poll_leadership``, the
exhaustion listeners).

May import psycopg (through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`
and the contract types of :mod:`telegram_fence.store`.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import psycopg
import psycopg.rows

from ...errors import ConfigurationError, SchemaError, StoreUnavailable
from ..values import check_door, count_states, door_of, stats_shape, storable_text
from .connection import Connections, translated
from .schema import FENCED_COLUMNS, NOW, lock_keys, schema_sql, split_table, table_names

__all__ = ["CLAIMED", "EXHAUSTED", "PENDING", "SETTLED", "SKIPPED", "StoreSupport"]

PENDING, CLAIMED, SETTLED, EXHAUSTED, SKIPPED = 0, 1, 2, 3, 4

#: How long the server clock's offset from this host's clock is reused before it is measured again.
_CLOCK_REFRESH = 5.0


class StoreSupport(Connections):
    """Opening, transactions and runtime support of :class:`PostgresUpdateStore` (its base class)."""

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = "fence_updates",
        clock: Callable[[], float] | None = None,
        create_table: bool = True,
        pool_size: int = 10,
        lock_timeout: float = 5.0,
        connect_timeout: float = 10.0,
        leader_check: float = 1.0,
        statement_timeout: float = 30.0,
    ) -> None:
        split_table(table)
        if not isinstance(conninfo, str):
            raise ConfigurationError(f"conninfo={type(conninfo).__name__} must be a libpq connection string")
        if lock_timeout <= 0 or connect_timeout <= 0 or statement_timeout <= 0:
            raise ConfigurationError(
                "lock_timeout, connect_timeout and statement_timeout must be positive numbers of seconds"
            )
        if leader_check <= 0:
            raise ConfigurationError(f"leader_check={leader_check!r} must be a positive number of seconds")
        if clock is not None and not callable(clock):
            raise ConfigurationError(f"clock={clock!r} must be a () -> float callable, or None for the server's")
        self.table = table
        self.lock_timeout = float(lock_timeout)
        self.leader_check = float(leader_check)
        self._chat_ns, self._leader_ns = lock_keys(table)
        self._given_clock = clock
        self._offset: float | None = None
        self._offset_at = 0.0
        self.clock: Callable[[], float] = clock if clock is not None else self._server_clock
        super().__init__(conninfo, pool_size=pool_size, lock_timeout=lock_timeout,
                         connect_timeout=connect_timeout, statement_timeout=statement_timeout,
                         outbox_table=f"{table}_outbox")
        self._leadership: Any = None
        try:
            # The DDL takes table locks even when it changes nothing: run it only when something is
            # missing, so a host starting up never stalls the others' transactions.
            if create_table and not self._complete(table):
                self._create(table)
            if not self._complete(table):
                raise SchemaError(f"table {table} (or one of its companion tables or columns) is missing; apply "
                                  f"schema_sql({table!r}) (`telegram-fence schema --postgres {table}`) or pass "
                                  "create_table=True")
        except BaseException:
            Connections.close(self)
            raise

    # --- opening --------------------------------------------------------------------------------

    def _create(self, table: str) -> None:
        """Apply the schema once, serialised between processes by an advisory lock."""
        with self._tx("creating the schema") as conn, translated("creating the schema"):
            conn.execute("SELECT pg_advisory_xact_lock(%s::integer, -1)", (self._leader_ns,))
            conn.execute(schema_sql(table).encode())

    def _complete(self, table: str) -> bool:
        """Whether every table of the schema (:func:`~.schema.table_names`) and the inbox's fenced columns exist."""
        with self._tx("reading the schema") as conn, translated("reading the schema"):
            row = conn.execute(
                "SELECT bool_and(to_regclass(n) IS NOT NULL), (SELECT count(*) FROM pg_attribute WHERE attrelid = "
                "to_regclass(%s) AND attname = ANY(%s) AND NOT attisdropped) FROM unnest(%s::text[]) AS x(n)",
                (table, list(FENCED_COLUMNS), list(table_names(table)))).fetchone()
        return row is not None and bool(row[0]) and row[1] == len(FENCED_COLUMNS)

    # --- time -----------------------------------------------------------------------------------

    def _now(self) -> float | None:
        """The ``now`` parameter of a statement: the given clock's reading, or None for the server's."""
        return None if self._given_clock is None else float(self._given_clock())

    def _server_clock(self) -> float:
        """The database server's time (this host's clock plus an offset measured every few seconds)."""
        mono = time.monotonic()
        if self._offset is None or mono - self._offset_at > _CLOCK_REFRESH:
            with self._tx("reading the server clock") as conn, translated("reading the server clock"):
                before = time.time()
                (server,) = conn.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchall()[0]
                after = time.time()
            self._offset = float(server) - (before + after) / 2
            self._offset_at = mono
        return time.time() + self._offset

    # --- transactions ---------------------------------------------------------------------------

    def _joined(self, where: str) -> AbstractContextManager[psycopg.Connection[Any]]:
        """:meth:`_one` for a caller that makes its own savepoint: inside this thread's transaction, its connection
        as it is."""
        conn = self._local.conn
        return nullcontext(conn) if conn is not None else self._one(where)

    def read(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A connection for reads, each statement its own transaction (inside a :meth:`write` on this thread: that
        transaction's). Raises :class:`StoreUnavailable` when no connection can be had; the statements' failures
        are the caller's to translate."""
        return self._one("read")

    def write(self, *, durable: bool = False) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A transaction for the application's own tables; yields the psycopg connection. Commits when the block
        ends, rolls back when it raises; store calls inside it on this thread join it (as savepoints). Every commit
        is durable (``durable`` is accepted for the runtime)."""
        del durable
        return self._tx("write")

    def one_statement(self, sql: str, params: dict[str, Any], *, flush: bool = True) -> list[tuple[Any, ...]]:
        """Run the one statement ``sql`` (``%(name)s`` placeholders) with ``params`` in a transaction of its own (a
        savepoint inside a :meth:`write` on this thread); its rows (``[]`` when it returns none). ``flush=False``
        outside a transaction: the commit does not wait for the server's disk (lost only if the server crashes within
        about three ``wal_writer_delay``; any later waiting commit flushes it too). Raises :class:`StoreError`
        subclasses."""
        with self._one("one_statement") as conn, translated("one_statement"):
            lazy = not flush and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            with conn.transaction() if lazy else nullcontext():
                if lazy:
                    conn.execute("SET LOCAL synchronous_commit TO off")
                cur = conn.cursor(row_factory=psycopg.rows.tuple_row).execute(sql, params)
                return cur.fetchall() if cur.description is not None else []

    def close(self) -> None:
        """Release the poll leadership and close the pool. Later calls raise
        :class:`StoreUnavailable`. Call it after every thread that used the store has stopped."""
        leadership = self._leadership
        if leadership is not None:
            leadership.release()
        super().close()

    # --- poll leadership ------------------------------------------------------------------------

    def poll_leadership(self) -> Any:
        """The :class:`~.leadership.PollLeadership` of this store (one per store). Once it was acquired,
        :meth:`record` stores a batch only while its epoch is the database's."""
        if self._leadership is None:
            from .leadership import PollLeadership

            self._leadership = PollLeadership(
                lambda timeout: self.dedicated("telegram-fence-leader", connect_timeout=timeout),
                table=self.table, namespace=self._leader_ns, lock_timeout=self.lock_timeout,
                check_interval=self.leader_check, clock=self._now, watch=self.watchdog.watching,
            )
        return self._leadership

    # --- runtime support ------------------------------------------------------------------------

    def probe_writable(self, timeout: float) -> None:
        """Prove within ``timeout`` seconds, writing nothing, that the database takes writes now (a readiness
        check): the server is not read-only and the updates table grants the ``ROW EXCLUSIVE`` lock every write
        takes. Raises :class:`StoreUnavailable` when it is read-only, away, or the lock stayed held."""
        bound = f"{max(1, int(timeout * 1000))}ms"
        with self._tx("probe_writable") as conn, translated("probe_writable"):
            row = conn.execute(
                "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true), "
                "current_setting('transaction_read_only')", (bound, bound)).fetchone()
            if row is not None and row[2] == "on":
                raise StoreUnavailable(f"table {self.table}: the server takes no writes (read-only: a standby, or "
                                       "default_transaction_read_only)")
            conn.execute(f"LOCK TABLE {self.table} IN ROW EXCLUSIVE MODE")

    def begin_generation(self, pid: int | None = None, *, door: str = "poll") -> int:
        """Start a new generation of ``door`` (``"poll"`` or ``"webhook"``; this process: pid and host) and
        return its number. Raises :class:`~telegram_fence.errors.ConfigurationError` for another ``door``."""
        check_door(door)
        sql = (
            f"INSERT INTO {self.table}_generations (generation, pid, host, started_at) VALUES ("
            f"(SELECT coalesce(max(generation), 0) + 1 FROM {self.table}_generations), %s, %s, %s) "
            "RETURNING generation"
        )
        with self._tx("begin_generation") as conn, translated("begin_generation"):
            conn.execute("SELECT pg_advisory_xact_lock(%s::integer, -2)", (self._leader_ns,))
            row = conn.execute(sql, (pid or os.getpid(), socket.gethostname(), self.clock())).fetchone()
            if row and door == "webhook":
                conn.execute(
                    f"INSERT INTO {self.table}_meta (key, value) VALUES ('webhook_generation', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (int(row[0]),),
                )
        return int(row[0]) if row else 0

    def mark_progress(self, generation: int) -> None:
        """Record that ``generation``'s poller completed a ``getUpdates`` call now."""
        with self._one("mark_progress") as conn, translated("mark_progress"):
            conn.execute(f"UPDATE {self.table}_generations SET progress_at = %s WHERE generation = %s",
                         (self.clock(), generation))

    def end_generation(self, generation: int, reason: str) -> None:
        """Record why ``generation``'s poller ended (once; later calls keep the first reason)."""
        with self._tx("end_generation") as conn, translated("end_generation"):
            conn.execute(
                f"UPDATE {self.table}_generations SET ended_at = %s, end_reason = %s "
                "WHERE generation = %s AND ended_at IS NULL",
                (self.clock(), storable_text(reason), generation),
            )

    def stats(self) -> dict[str, Any]:
        """Counts by state, the cursor, the oldest open update's age, the latest poller generation, the
        payload conflicts, in the shape of :func:`~telegram_fence.store.values.stats_shape`; and the poll
        leader (epoch, pid, host, since, and whether its lock is held now)."""
        t = self.table
        with self._tx("stats") as conn, translated("stats"):
            rows = conn.execute(f"SELECT state, acknowledged, count(*) FROM {t} GROUP BY 1, 2").fetchall()
            oldest_row = conn.execute(f"SELECT min(recorded_at), {NOW} FROM {t} WHERE state < 2",
                                      {"now": self._now()}).fetchone()
            meta = dict(conn.execute(f"SELECT key, value FROM {t}_meta").fetchall())
            generation = conn.execute(
                f"SELECT generation, pid, host, started_at, progress_at, ended_at, end_reason "
                f"FROM {t}_generations ORDER BY generation DESC LIMIT 1"
            ).fetchone()
            leader = conn.execute(
                f"SELECT epoch, pid, host, since, EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
                "AND classid = %s::bigint::oid AND objid = 0 AND objsubid = 2 AND granted AND pid = backend_pid) "
                f"FROM {t}_leader WHERE id = 1",
                (self._leader_ns & 0xFFFFFFFF,),
            ).fetchone()
        oldest, now = oldest_row if oldest_row is not None else (None, None)
        gen_info = None
        if generation is not None:
            keys = ("generation", "pid", "host", "started_at", "progress_at", "ended_at", "end_reason")
            gen_info = dict(zip(keys, generation, strict=True))
            gen_info["door"] = door_of(gen_info["generation"], meta.get("webhook_generation"))
        leader_info = None
        if leader is not None and leader[0]:
            leader_info = dict(zip(("epoch", "pid", "host", "since", "live"), leader, strict=True))
        return stats_shape(
            count_states(rows),
            cursor=int(meta.get("cursor", 0)),
            oldest_open_age=None if oldest is None or now is None else now - oldest,
            generation=gen_info,
            schema_version=1,
            payload_conflicts=int(meta.get("payload_conflicts", 0)),
            backend="postgres",
            leader=leader_info,
        )
