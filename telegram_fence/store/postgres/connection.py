"""Connections of ``PostgresUpdateStore``: its own pool of sessions, the watchdog that cuts a connection the server
stopped answering, one transaction per thread (nested ones as savepoints), and the one boundary where psycopg's
exceptions become :mod:`telegram_fence.errors`.

May import psycopg, the standard library and :mod:`telegram_fence.errors`. Thread safety: a :class:`Connections` is
shared by every thread of the store; each thread's open transaction is its own (thread-local).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.conninfo
import psycopg.errors
import psycopg.pq
import psycopg.rows

from ...errors import SchemaError, StoreCorrupt, StoreError, StoreUnavailable
from ..deadline import PerThread, ThreadBound
from ..values import corrupt_message

__all__ = ["KEEPALIVES", "SAMPLE", "Connections", "PoolTimeout", "SessionPool", "Watchdog", "translated"]

log = logging.getLogger("telegram_fence.store.postgres.connection")
_cut_log = logging.getLogger("telegram_fence.store.postgres.watchdog")

#: TCP settings of every connection the store opens, unless the connection string sets them: a vanished peer is
#: noticed within about 10 s + 3 x 2 s of silence, unacknowledged data fails the connection after 20 s. A server that
#: acknowledges but never answers is the :class:`Watchdog`'s.
KEEPALIVES: dict[str, int] = {
    "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 2, "keepalives_count": 3,
    **({"tcp_user_timeout": 20_000} if psycopg.pq.version() >= 120000 else {}),  # (libpq 12 and later)
}

def _first_line(exc: BaseException) -> str:
    """The server's message without the ``LINE 1: …`` context psycopg appends on the lines after it."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def translate(exc: BaseException, where: str) -> BaseException:
    """The :mod:`telegram_fence.errors` exception for a psycopg failure, or a value the driver could not send
    (``UnicodeError``); other exceptions are returned as they are."""
    if isinstance(exc, (psycopg.errors.DataCorrupted, psycopg.errors.IndexCorrupted)):
        return StoreCorrupt(corrupt_message(f"the PostgreSQL database ({where})", exc))
    if isinstance(exc, UnicodeError):
        return StoreError(f"{where}: a value could not be sent to the database as UTF-8 ({exc}); nothing was written")
    if isinstance(exc, PoolTimeout):
        return StoreUnavailable(f"{where}: no database connection became free or could be opened in time ({exc})")
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        return StoreUnavailable(f"{where}: a row or table stayed locked by another transaction past lock_timeout "
                                f"({_first_line(exc)})")
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return StoreUnavailable(f"{where}: the statement was cancelled (statement_timeout or an operator): "
                                f"{_first_line(exc)}")
    if isinstance(exc, (psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedTable)):
        return SchemaError(
            f"{where}: the table does not have the layout this library needs ({exc}); "
            "apply telegram_fence.store.postgres.schema_sql(table) (or `telegram-fence schema --postgres TABLE`)"
        )
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return StoreUnavailable(f"{where}: the database cannot be reached or dropped the connection: {exc}")
    if isinstance(exc, psycopg.Error):
        return StoreError(f"{where}: the database refused the statement: {exc}")
    return exc


class translated:  # (lower case: it reads as a function, ``with translated("claim"):``; a class: it is cheaper)
    """Raise every psycopg exception of the block (and a value psycopg could not encode) as the matching
    :class:`StoreError` (chained): the one boundary every public method of the store runs its statements in."""

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and isinstance(exc, (psycopg.Error, UnicodeError)):
            raise translate(exc, self.where) from exc


def _rollback(tx: AbstractContextManager[Any], exc: BaseException) -> None:
    """Roll ``tx`` back because of ``exc``; a connection too broken to roll back rolls back on the server."""
    with suppress(psycopg.Error):
        tx.__exit__(type(exc), exc, exc.__traceback__)


_IDLE = psycopg.pq.TransactionStatus.IDLE
_IN_TRANSACTION = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)


class PoolTimeout(psycopg.OperationalError):
    """No connection of the pool became free, and none could be opened, within the wait ``getconn`` was given."""


class SessionPool:
    """The pool of sessions the store opens from the connection string ``conninfo``: up to ``max_size`` autocommit
    connections with :data:`KEEPALIVES` where ``conninfo`` leaves them unset, each opened in the thread that needs
    one when none is free and handed to ``configure(conn)`` once before first use; most recently returned reused
    first; none kept past ``max_lifetime``, those unused for ``max_idle`` closed (one stays). No thread of its own.
    ``conninfo`` and ``kwargs`` (the connection keyword arguments) stay readable."""

    def __init__(self, conninfo: str, *, max_size: int, configure: Callable[[psycopg.Connection[Any]], None],
                 max_idle: float = 600.0, max_lifetime: float = 3600.0) -> None:
        try:
            named = psycopg.conninfo.conninfo_to_dict(conninfo)
        except psycopg.Error:  # libpq refuses it when connecting, with its own message
            named = {}
        self.conninfo = conninfo
        self.kwargs: dict[str, Any] = {"autocommit": True, **{k: v for k, v in KEEPALIVES.items() if k not in named}}
        self.max_size = max(1, max_size)
        self._configure = configure
        self._max_idle = max_idle
        self._max_lifetime = max_lifetime
        self._cond = threading.Condition()
        self._idle: list[tuple[psycopg.Connection[Any], float]] = []  # (connection, returned at), oldest first
        self._born: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = weakref.WeakKeyDictionary()
        self._count = 0  # connections open or being opened, idle or lent
        self._opened = 0
        self._closed = False
        self._timeout_given = "connect_timeout" in named

    def getconn(self, timeout: float) -> psycopg.Connection[Any]:
        """A connection for the caller alone until :meth:`putconn`: a free one, else a new one if fewer than
        ``max_size`` are open, else the first one returned within ``timeout`` seconds. Raises :class:`PoolTimeout`
        when none came in time, ``psycopg.OperationalError`` when the pool is closed, and psycopg's exceptions of
        opening a connection (the connect waits at most what is left of ``timeout``, at least libpq's 2 s)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise psycopg.OperationalError("the store's connection pool is closed")
                if self._idle:
                    return self._idle.pop()[0]
                if self._count < self.max_size:
                    self._count += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PoolTimeout(f"none of the {self.max_size} connections became free within {timeout:g} s")
                self._cond.wait(left)
        try:
            return self._connect(deadline - time.monotonic())
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _connect(self, left: float) -> psycopg.Connection[Any]:
        kwargs = dict(self.kwargs)
        if not self._timeout_given:
            kwargs["connect_timeout"] = max(2, math.ceil(left))
        conn = psycopg.Connection.connect(self.conninfo, **kwargs)
        try:
            self._configure(conn)
        except BaseException:
            conn.close()
            raise
        with self._cond:
            self._born[conn] = time.monotonic()
            self._opened += 1
        return conn

    def putconn(self, conn: psycopg.Connection[Any]) -> None:
        """Take back a connection :meth:`getconn` gave: kept when healthy and idle (an open transaction rolled back
        first), closed otherwise; also closes those unused for ``max_idle``. Never raises psycopg's exceptions."""
        status = conn.pgconn.transaction_status
        if not conn.closed and status in _IN_TRANSACTION:
            try:
                conn.rollback()
            except psycopg.Error:
                conn.close()
        now = time.monotonic()
        discard: list[psycopg.Connection[Any]] = []
        with self._cond:
            healthy = not conn.closed and conn.pgconn.transaction_status == _IDLE
            if healthy and not self._closed and now - self._born.get(conn, now) < self._max_lifetime:
                self._idle.append((conn, now))
            else:
                self._count -= 1
                discard.append(conn)
            while len(self._idle) > 1 and now - self._idle[0][1] > self._max_idle:
                discard.append(self._idle.pop(0)[0])
                self._count -= 1
            self._cond.notify()
        for old in discard:
            old.close()

    def close(self) -> None:
        """Close the free connections now and each lent one when it comes back; :meth:`getconn` refuses after."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        for conn, _ in idle:
            conn.close()

    def get_stats(self) -> dict[str, int]:
        """``pool_size`` (open now), ``pool_available`` (free now), ``connections_num`` (opened so far), as
        psycopg_pool's ``get_stats`` names them."""
        with self._cond:
            return {"pool_size": self._count, "pool_available": len(self._idle), "connections_num": self._opened}


#: How often (seconds) the watchdog looks at the connections it watches.
SAMPLE = 0.1


@dataclass
class _Watch:
    conn: psycopg.Connection[Any]
    bound: float
    busy_since: float | None = None


class Watchdog:
    """A client-side bound on every statement the store runs: cuts a watched connection whose statement the server
    has not answered within its bound (``cuts`` counts them).

    The server's ``statement_timeout`` cannot help when the server (or a proxy, a frozen VM, a partition) stops
    answering, and TCP keepalives miss a peer whose kernel still acknowledges. The watchdog samples the connections
    the store has lent out every :data:`SAMPLE` seconds; one whose statement has been in progress at the server
    (libpq's ``ACTIVE``) at every sample over its bound has its socket shut down: the waiting call fails at once with
    psycopg's ``OperationalError`` (the store raises :class:`StoreUnavailable`). Time the application's code spends
    inside an open transaction is never counted. It runs one daemon thread, ``fence-pg-watchdog``, from the first
    watch until :meth:`close` (joined)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, _Watch] = {}
        self._next = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cuts = 0

    def watch(self, conn: psycopg.Connection[Any], bound: float) -> int:
        """Watch ``conn`` until :meth:`unwatch` with the key returned: a statement in progress at the server for
        ``bound`` seconds gets the connection cut."""
        with self._lock:
            key = self._next
            self._next += 1
            self._watched[key] = _Watch(conn, max(SAMPLE, bound))
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="fence-pg-watchdog", daemon=True)
                self._thread.start()
        return key

    def unwatch(self, key: int) -> None:
        """Stop watching what :meth:`watch` returned ``key`` for; once this returns, it is never cut."""
        with self._lock:
            del self._watched[key]

    @contextmanager
    def watching(self, conn: psycopg.Connection[Any], bound: float) -> Iterator[None]:
        """:meth:`watch` ``conn`` while the block runs."""
        key = self.watch(conn, bound)
        try:
            yield
        finally:
            self.unwatch(key)

    def close(self) -> None:
        """Stop watching and end the thread (joined). Idempotent."""
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE):
            now = time.monotonic()
            with self._lock:  # the connections are not handed back while this runs (see watching)
                for watch in self._watched.values():
                    if not _in_progress(watch.conn):
                        watch.busy_since = None
                    elif watch.busy_since is None:
                        watch.busy_since = now
                    elif now - watch.busy_since >= watch.bound:
                        waited = now - watch.busy_since
                        watch.busy_since = None
                        if _cut(watch.conn):
                            self.cuts += 1
                            _cut_log.error("the database did not answer a statement for %.1f s; its connection is cut "
                                           "(the call fails with StoreUnavailable)", waited,
                                           extra={"waited": round(waited, 1), "bound": watch.bound})


def _in_progress(conn: psycopg.Connection[Any]) -> bool:
    """Whether a statement of ``conn`` waits for the server now."""
    try:
        return bool(conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.ACTIVE)
    except psycopg.Error:  # closed: nothing waits on it
        return False


def _cut(conn: psycopg.Connection[Any]) -> bool:
    """Shut the socket of ``conn`` down both ways (a read waiting on it returns at once); ``False`` without one."""
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return False
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.close()  # closes the duplicate only; the shutdown reached the connection itself
    return True


class _Local(PerThread):
    conn: psycopg.Connection[Any] | None = None


class Connections(ThreadBound):
    """The base of :class:`~.support.StoreSupport`: a pool of connections, and the transaction (if any) the calling
    thread has open.

    ``conninfo`` is a libpq connection string (a :class:`SessionPool` of up to ``pool_size`` connections
    is made, and closed by :meth:`close`). ``lock_timeout`` bounds every wait for a lock, ``connect_timeout`` the
    wait for a connection, ``statement_timeout`` every statement at the server; a statement unanswered for twice
    that has its connection cut by the :class:`Watchdog`. All end in :class:`StoreUnavailable`.
    """

    def __init__(
        self, conninfo: str, *, pool_size: int, lock_timeout: float,
        connect_timeout: float, statement_timeout: float = 30.0, outbox_table: str = "fence_outbox",
    ) -> None:
        self.outbox_table = outbox_table
        self._lock_ms = max(1, int(lock_timeout * 1000))
        self._statement_ms = max(1, int(statement_timeout * 1000))
        #: how long a statement may wait for the server before its connection is cut (seconds)
        self.answer_bound = 2 * statement_timeout
        self.watchdog = Watchdog()
        self._connect_timeout = connect_timeout
        self._local = _Local()
        self.closed = False
        self.pool = SessionPool(conninfo, max_size=pool_size, configure=self._configure)

    def dedicated(self, application_name: str, *, connect_timeout: float | None = None) -> psycopg.Connection[Any]:
        """A new autocommit session outside the pool for a session the store keeps to itself (the leadership),
        opened with the pool's connection settings (:data:`KEEPALIVES` where the connection string leaves them
        unset); rows as tuples. The connect waits at most
        ``connect_timeout`` (default the store's; libpq counts whole seconds, at least 2). Raises psycopg's
        exceptions."""
        timeout = self._connect_timeout if connect_timeout is None else connect_timeout
        return psycopg.Connection.connect(self.pool.conninfo, **{
            **self.pool.kwargs, "row_factory": psycopg.rows.tuple_row, "application_name": application_name,
            "connect_timeout": max(2, math.ceil(timeout))})

    def close(self) -> None:
        """Close the pool. Later transactions raise :class:`StoreUnavailable`."""
        self.closed = True
        self.pool.close()
        self.watchdog.close()

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Set the timeouts of a new connection of the store's own pool, and run the statements psycopg prepares
        on it on their generic plans (a custom plan of a claim's statements, made again on every call, costs the
        server more than running them). The outbox's queries find their table on the connection."""
        conn.fence_outbox_table = self.outbox_table  # type: ignore[attr-defined]
        conn.execute("SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false), "
                     "set_config('plan_cache_mode', 'force_generic_plan', false)",
                     (f"{self._lock_ms}ms", f"{self._statement_ms}ms"))

    @contextmanager
    def _one(self, where: str) -> Iterator[psycopg.Connection[Any]]:
        """An autocommit connection for statements that are each their own transaction (a statement and its commit:
        one round trip); :meth:`_tx` instead when the calling thread has one open, or inside :meth:`bounded`.
        Failures are raised as in :meth:`_tx`."""
        local = self._local
        if local.conn is not None or local.deadline is not None:
            with self._tx(where) as conn:
                yield conn
            return
        if self.closed:
            raise StoreUnavailable(f"{where}: the store was closed")
        with translated(where):
            conn = self.pool.getconn(timeout=self._connect_timeout)
        watched = self.watchdog.watch(conn, self.answer_bound)  # (no nested context managers: this is per call)
        try:
            yield conn
        finally:
            self.watchdog.unwatch(watched)
            self.pool.putconn(conn)
            if local.exhausted:  # (each statement committed on its own)
                self._tell_exhausted()

    @contextmanager
    def _tx(self, where: str) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on a pooled connection (a savepoint inside the thread's open transaction): committed when
        the block ends, rolled back when it raises. Failures of the connection, the begin and the commit are raised
        as :class:`StoreError` subclasses; the block's own exceptions pass through unchanged (after the rollback).
        """
        local = self._local
        conn = local.conn
        if conn is not None:
            with translated(where):
                savepoint = conn.transaction()
                savepoint.__enter__()
            try:
                yield conn
            except BaseException as exc:
                _rollback(savepoint, exc)
                raise
            with translated(where):
                savepoint.__exit__(None, None, None)
            return
        if self.closed:
            raise StoreUnavailable(f"{where}: the store was closed")
        wait = self._connect_timeout
        left = None if local.deadline is None else local.deadline - time.monotonic()
        if left is not None:
            if left <= 0:
                raise StoreUnavailable(f"{where}: no time left (the bound of bounded() ran out)")
            wait = min(wait, left)
        with translated(where):
            conn = self.pool.getconn(timeout=wait)
        try:
            with self.watchdog.watching(conn, self.answer_bound):  # cut if the server stops answering
                with translated(where):
                    tx = conn.transaction()
                    tx.__enter__()
                    if left is not None:  # bounded(): every lock wait and statement ends by the deadline
                        ms = max(1, int(((local.deadline or 0.0) - time.monotonic()) * 1000))
                        conn.execute("SELECT set_config('lock_timeout', %s, true), "  # (a lock wait says so first)
                                     "set_config('statement_timeout', %s, true)",
                                     (f"{max(1, ms * 9 // 10)}ms", f"{ms}ms"))
                local.conn = conn
                try:
                    yield conn
                except BaseException as exc:
                    local.conn = None
                    _rollback(tx, exc)
                    raise
                local.conn = None
                with translated(where):
                    tx.__exit__(None, None, None)
            if local.exhausted:
                self._tell_exhausted()
        finally:
            local.conn = None
            local.exhausted = False
            self.pool.putconn(conn)
