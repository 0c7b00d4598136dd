"""Exhaustion notices on PostgreSQL: the store announces with ``NOTIFY`` every exhaustion it finds itself (sent in
the transaction that made it, so delivered when, and only if, it commits), and a dedicated session listens for them
(``LISTEN``) and tells the store's exhaustion listeners, on every host. A session that was cut loses what was sent
meanwhile: after every (re)connect the listeners are told once, so whoever pages the exhaustions looks again.

May import psycopg and the standard library. Thread safety: an :class:`ExhaustionNotices` may be used from any
thread; it runs one thread, ``fence-pg-notices``, from the first :meth:`add` until :meth:`close` (joined).
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from typing import Any

import psycopg

__all__ = ["ExhaustionNotices", "channel_of"]

log = logging.getLogger("telegram_fence.store.postgres.notices")

#: How long one wait for notifications lasts before the thread checks its stop signal.
_POLL = 0.5
#: Waits between attempts to open the listening session again after it failed (the last one repeats).
_BACKOFF = (0.5, 1.0, 2.0, 5.0)


def channel_of(table: str) -> str:
    """The ``NOTIFY`` channel of ``table``'s exhaustions: a plain lower-case identifier (no quoting needed)."""
    return f"telegram_fence_exhausted_{zlib.crc32(table.encode()):08x}"


class ExhaustionNotices:
    """Listens for the exhaustion notices on ``channel`` and calls the listeners added. ``connect()`` opens a new
    autocommit session (on the listening thread); ``watch(session, bound)`` bounds the ``LISTEN`` statement."""

    def __init__(
        self, connect: Callable[[], psycopg.Connection[Any]], channel: str, *,
        watch: Callable[[psycopg.Connection[Any], float], AbstractContextManager[None]], answer_bound: float,
    ) -> None:
        self._connect = connect
        self._watch = watch
        self._answer_bound = answer_bound
        self.channel = channel
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._session: psycopg.Connection[Any] | None = None

    def add(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` on the ``fence-pg-notices`` thread for each batch of notices (quick, not raising: an
        exception is logged and ignored). Returns a function that removes it."""
        with self._lock:
            self._listeners = [*self._listeners, listener]
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="fence-pg-notices", daemon=True)
                self._thread.start()

        def remove() -> None:
            with self._lock:
                self._listeners = [fn for fn in self._listeners if fn is not listener]

        return remove

    def close(self) -> None:
        """Stop listening and join the thread (within about half a second); idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _tell(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.error("an exhaustion listener raised; ignored", exc_info=True)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                session = self._connect()
                self._session = session
                with self._watch(session, self._answer_bound):  # a server that stopped answering is cut
                    session.execute(f"LISTEN {self.channel}")
                failures = 0
                self._tell()  # what was announced while no session listened is found by whoever looks now
                while not self._stop.is_set():
                    heard = False
                    for _notice in session.notifies(timeout=_POLL):
                        heard = True
                        break
                    if heard:
                        self._tell()
            except psycopg.Error as exc:
                log.warning("the exhaustion notice session failed; opening it again",
                            extra={"err": f"{type(exc).__name__}: {exc}"})
                self._stop.wait(_BACKOFF[min(failures, len(_BACKOFF) - 1)])
                failures += 1
            finally:
                opened, self._session = self._session, None
                if opened is not None:
                    with suppress(psycopg.Error):
                        opened.close()
