"""The pool of sessions a ``PostgresUpdateStore`` opens itself from a connection string: at most ``max_size``
connections, each opened in the thread that needs one when none is free; most recently returned reused first; none
kept past ``max_lifetime``, those unused for ``max_idle`` closed (one stays). No thread of its own.

May import psycopg and the standard library. Thread safety: every method may be called from any thread.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.conninfo
import psycopg.pq

__all__ = ["PoolTimeout", "SessionPool"]

_IDLE = psycopg.pq.TransactionStatus.IDLE
_IN_TRANSACTION = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)


class PoolTimeout(psycopg.OperationalError):
    """No connection of the pool became free, and none could be opened, within the wait ``getconn`` was given."""


class SessionPool:
    """Up to ``max_size`` psycopg connections to ``conninfo``, opened with ``kwargs`` and handed to
    ``configure(conn)`` once each before first use (``conninfo`` and ``kwargs`` stay readable)."""

    def __init__(self, conninfo: str, *, max_size: int, kwargs: dict[str, Any],
                 configure: Callable[[psycopg.Connection[Any]], None], max_idle: float = 600.0,
                 max_lifetime: float = 3600.0) -> None:
        self.conninfo = conninfo
        self.kwargs = dict(kwargs)
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
        try:
            named = psycopg.conninfo.conninfo_to_dict(conninfo)
        except psycopg.Error:  # libpq refuses it when connecting, with its own message
            named = {}
        self._timeout_given = "connect_timeout" in named or "connect_timeout" in self.kwargs

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
