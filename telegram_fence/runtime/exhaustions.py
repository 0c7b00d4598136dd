"""The ``fence-exhaustions`` thread: every unacknowledged exhaustion reaches ``on_exhausted`` at least once.

An exhaustion is acknowledged only after ``on_exhausted`` returned, so a crash between the two delivers it again;
the operator channel hears of each one once per process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from ..retry import exponential
from ..store import Exhaustion, Identity, UpdateStore
from .state import guarded_thread

__all__ = ["ExhaustionDelivery"]

#: How long the idle thread waits for a wake-up before it looks at the store anyway (another process may exhaust).
_RECHECK = 60.0


class ExhaustionDelivery:
    """Delivers the store's due exhaustions on its own thread until ``stop`` is set; ``wake()`` (any thread, and the
    store's exhaustion listener) makes it look now. ``tell(text)`` posts to the operator channel and never raises;
    ``on_fatal(what, reason)`` ends the fence; ``write(fn)`` runs the acknowledgement through the writer.
    """

    def __init__(self, store: UpdateStore, on_exhausted: Callable[[Exhaustion], Any] | None, *, stop: threading.Event,
                 tell: Callable[[str], None], on_fatal: Callable[[str, str], None], log: logging.Logger,
                 write: Callable[[Callable[[], bool]], bool] = lambda fn: fn()) -> None:
        self._store = store
        self._write = write
        self._unlisten: Callable[[], None] | None = None
        self._on_exhausted = on_exhausted
        self._stop = stop
        self._tell = tell
        self._log = log
        self._wake = threading.Event()
        self._told: set[Identity] = set()
        self._thread = guarded_thread(self._run, "fence-exhaustions", partial(on_fatal, "exhaustions thread"))

    def wake(self) -> None:
        """Look for due exhaustions now (also used to let the thread see the stop)."""
        self._wake.set()

    def start(self) -> None:
        """Listen to the store and start the thread."""
        self._unlisten = self._store.add_exhaustion_listener(self.wake)
        self._thread.start()
        self._wake.set()

    @property
    def alive(self) -> bool:
        """Whether the ``fence-exhaustions`` thread runs."""
        return self._thread.is_alive()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the thread, then stop listening to the store; ``True`` when it ended."""
        if self._thread.ident is not None:
            self._thread.join(timeout)
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        return not self._thread.is_alive()

    def _run(self) -> None:
        """Deliver until stopped; a failure is logged and tried again after a growing pause (0.5 s doubling up to
        60 s); anything else that escapes ends the fence (the thread is guarded)."""
        failures = 0
        while True:
            if not failures:
                self._wake.wait(_RECHECK)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                failed = self._deliver_pages()
            except Exception:
                self._log.error("delivering exhaustions failed; trying again", exc_info=True)
                failed = True
            failures = failures + 1 if failed else 0
            if failed and self._stop.wait(exponential(failures, 0.5, 60.0)):
                return

    def _deliver_pages(self) -> bool:
        """One pass over the due exhaustions; ``True`` when something failed (try again after a pause)."""
        store = self._store
        after: Identity | None = None
        while not self._stop.is_set():
            try:
                page = store.due_exhaustions(after=after, limit=100)
            except Exception:
                self._log.error("reading exhaustions failed", exc_info=True)
                return True
            if not page:
                return False
            for exhaustion in page:
                after = exhaustion.identity
                if self._deliver(exhaustion):
                    return True
        return False

    def _deliver(self, exhaustion: Exhaustion) -> bool:
        """Tell the operator (once), call ``on_exhausted``, acknowledge; ``True`` when a step failed."""
        identity = exhaustion.identity
        if identity not in self._told:
            self._told.add(identity)
            last_line = exhaustion.error.strip().splitlines()[-1:] or [""]
            self._tell(
                f"telegram_fence: update {identity.update_id} exhausted after "
                f"{identity.attempt} attempts: {last_line[0][:500]}"
            )
        if self._on_exhausted is None:
            return False
        try:
            self._on_exhausted(exhaustion)
        except Exception:
            self._log.error("on_exhausted raised; the exhaustion will be delivered again",
                            exc_info=True, extra={"update_id": identity.update_id})
            return True
        try:
            store = self._store
            self._write(lambda: store.acknowledge_exhaustion(identity))
        except Exception:
            # on_exhausted already ran: it will run again for this one (at least once, as promised).
            self._log.error("acknowledging an exhaustion failed; it will be delivered again",
                            exc_info=True, extra={"update_id": identity.update_id})
            return True
        return False
