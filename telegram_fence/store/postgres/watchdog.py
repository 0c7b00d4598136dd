"""A client-side bound on every statement the PostgreSQL store runs: a server that stops answering is noticed.

The server's ``statement_timeout`` cannot help when the server (or a proxy, a frozen VM, a partition) stops
answering, and TCP keepalives miss a peer whose kernel still acknowledges. :class:`Watchdog` samples the connections
the store has lent out every :data:`SAMPLE` seconds; one whose statement has been in progress at the server (libpq's
``ACTIVE``) at every sample over its bound has its socket shut down: the waiting call fails at once with psycopg's
``OperationalError`` (the store raises :class:`~telegram_fence.errors.StoreUnavailable`). Time the application's code
spends inside an open transaction is never counted.

May import psycopg and the standard library. Thread safety: shared by every thread of a store; it runs one daemon
thread, ``fence-pg-watchdog``, from the first watch until :meth:`Watchdog.close` (joined).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

__all__ = ["SAMPLE", "Watchdog"]

log = logging.getLogger("telegram_fence.store.postgres.watchdog")

#: How often (seconds) the watchdog looks at the connections it watches.
SAMPLE = 0.1


@dataclass
class _Watch:
    conn: psycopg.Connection[Any]
    bound: float
    busy_since: float | None = None


class Watchdog:
    """Cuts a watched connection whose statement the server has not answered within its bound (``cuts`` counts
    them)."""

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
                            log.error("the database did not answer a statement for %.1f s; its connection is cut "
                                      "(the call fails with StoreUnavailable)", waited,
                                      extra={"waited": round(waited, 1), "bound": watch.bound})


def _in_progress(conn: psycopg.Connection[Any]) -> bool:
    """Whether a statement of ``conn`` waits for the server now."""
    try:
        return bool(conn.pgconn.transaction_status == TransactionStatus.ACTIVE)
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
