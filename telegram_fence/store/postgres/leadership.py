"""Poller leadership on PostgreSQL: one process at a time polls Telegram.

The leader holds a session-level advisory lock on a dedicated connection and, on taking it, raises the **epoch** in
``{table}_leader``. The store's ``record`` checks, under a share lock of that row, that the epoch is still the one
this process took: a deposed leader cannot move the cursor, and a new leader's epoch update waits for a record in
flight. When the leader's process dies or its session is cut, the server releases the lock at once; the others try
every ``check_interval`` seconds.

May import psycopg, the standard library and :mod:`telegram_fence.errors`. Thread safety: a :class:`PollLeadership`
may be used from several threads (its session under a lock); it runs one thread, ``fence-leadership``, while held,
to notice a lost session or epoch.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from typing import Any

import psycopg

__all__ = ["PollLeadership"]

log = logging.getLogger("telegram_fence.leadership")


class PollLeadership:
    """The right to poll Telegram, shared by every process on one table: ``acquire``, ``held``, ``epoch`` (the one
    taken), ``release``. Lost on its own when the dedicated session breaks or another process raised the epoch
    (``held`` turns ``False`` within ``check_interval``)."""

    def __init__(
        self,
        connect: Callable[[float], psycopg.Connection[Any]],
        *,
        table: str,
        namespace: int,
        lock_timeout: float = 5.0,
        check_interval: float = 1.0,
        clock: Callable[[], float | None] = lambda: None,
        watch: Callable[[psycopg.Connection[Any], float], AbstractContextManager[None]],
    ) -> None:
        self._open = connect
        self._watch = watch
        self._table = table
        self._ns = namespace
        self._lock_ms = max(1, int(lock_timeout * 1000))
        #: how long a statement of the session may go unanswered before the session is cut (by ``watch``):
        #: twice the server's statement timeout of the session, itself twice ``lock_timeout``
        self.answer_bound = 4 * self._lock_ms / 1000
        self.check_interval = check_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._session: psycopg.Connection[Any] | None = None
        self._held = False
        self.epoch: int | None = None
        #: whether this process ever led (from then on, the store's record checks the epoch)
        self.acquired_once = False
        #: why the last attempt to take the leadership could not reach the database (``None`` when it did,
        #: whether it took the leadership or found that another process holds it)
        self.last_error: str | None = None
        self._keeper: threading.Thread | None = None
        self._keeper_stop = threading.Event()
        self._wake = threading.Event()

    @property
    def held(self) -> bool:
        """Whether this process leads now (as far as the last check every ``check_interval`` knows)."""
        return self._held

    def acquire(self, timeout: float) -> bool:
        """Take the leadership, trying every ``check_interval`` for up to ``timeout`` seconds (at least libpq's 2 s
        connect, plus :attr:`answer_bound` for a server that stopped answering): ``True`` when this process leads (a
        new epoch was written), ``False`` when another kept it or the database could not be reached. Never raises
        for a database failure (logged, kept in :attr:`last_error`, tried again)."""
        deadline = time.monotonic() + max(0.0, timeout)
        self._wake.clear()
        while True:
            if self._held or self._try(max(0.0, deadline - time.monotonic())):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._wake.wait(min(self.check_interval, remaining)):
                return self._held

    def _connect(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        """The dedicated session, opened when needed within ``timeout`` seconds; its statements bounded by
        ``lock_timeout`` and a statement timeout of twice that."""
        session = self._session
        if session is None or session.closed:
            session = self._open(self._lock_ms / 1000 if timeout is None else timeout)
            with self._watch(session, self.answer_bound):
                session.execute("SELECT set_config('lock_timeout', %s, false), "
                                "set_config('statement_timeout', %s, false)",
                                (f"{self._lock_ms}ms", f"{2 * self._lock_ms}ms"))
            self._session = session
        return session

    def _try(self, timeout: float | None = None) -> bool:
        with self._lock:
            if self._held:
                return True
            try:
                session = self._connect(timeout)
                with self._watch(session, self.answer_bound):
                    row = session.execute("SELECT pg_try_advisory_lock(%s::integer, 0)", (self._ns,)).fetchone()
                if row is None or not row[0]:
                    self.last_error = None  # the database answered: another process leads
                    return False
                with self._watch(session, self.answer_bound):
                    epoch = session.execute(
                        f"UPDATE {self._table}_leader SET epoch = epoch + 1, pid = %s, host = %s, "
                        "since = coalesce(%s::float8, extract(epoch from clock_timestamp())::float8), "
                        "backend_pid = pg_backend_pid() "
                        "WHERE id = 1 RETURNING epoch",
                        (os.getpid(), socket.gethostname(), self._clock()),
                    ).fetchone()
                if epoch is None:
                    raise psycopg.ProgrammingError(f"{self._table}_leader has no row; apply the schema")
            except psycopg.Error as exc:
                self.last_error = f"{type(exc).__name__}: {exc}".strip()
                log.warning("could not take the poll leadership; trying again", extra={"err": self.last_error})
                self._close_session()
                return False
            self.last_error = None
            self.epoch = int(epoch[0])
            self._held = True
            self.acquired_once = True
            self._keeper_stop = threading.Event()
            self._keeper = threading.Thread(
                target=self._keep, args=(self._keeper_stop,), name="fence-leadership", daemon=True
            )
            self._keeper.start()
        log.info("poll leadership taken", extra={"epoch": self.epoch, "pid": os.getpid(), "host": socket.gethostname()})
        return True

    def _keep(self, stop: threading.Event) -> None:
        """While held, check the session and the epoch every ``check_interval``; drop the leadership when either is
        gone."""
        while not stop.wait(self.check_interval):
            with self._lock:
                if not self._held or stop.is_set():
                    return
                reason = None
                try:
                    session = self._connect()
                    with self._watch(session, self.answer_bound):
                        row = session.execute(f"SELECT epoch FROM {self._table}_leader WHERE id = 1").fetchone()
                    if row is None or int(row[0]) != self.epoch:
                        reason = f"another process took epoch {None if row is None else row[0]}"
                except psycopg.Error as exc:
                    reason = f"the leadership session broke: {exc}"
                if reason is not None:
                    self._held = False
                    self._close_session()
                    log.warning("poll leadership lost", extra={"epoch": self.epoch, "reason": reason})
                    return

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            with suppress(psycopg.Error):  # closing is best effort
                session.close()

    def release(self) -> None:
        """Give the leadership up (another process may take it at once); idempotent."""
        self._keeper_stop.set()
        self._wake.set()
        keeper = self._keeper
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join()
        with self._lock:
            was_held, self._held = self._held, False
            self._close_session()  # ending the session releases the advisory lock
        if was_held:
            log.info("poll leadership released", extra={"epoch": self.epoch})
