"""The thread that sends again, while the fence runs, the queued calls whose send after their commit never left.

May import ``retry`` (layer 1). Thread safety: any thread may add calls; one thread (``fence-calls-resend``) sends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from ..retry import exponential

__all__ = ["FIRST", "Deliver", "Resender"]

#: Seconds before a call's first try again (doubling with each failure to ``_CAP``).
FIRST, _CAP = 0.5, 30.0


#: ``deliver(update_id, seq, claim_id)``: ``None`` when the call is done with, else the seconds before another try;
#: raises when its send certainly never left (it is queued again).
Deliver = Callable[[int, int, str], "float | None"]


class Resender:
    """The thread (``fence-calls-resend``) that sends again, while the fence runs, the queued calls whose send after
    their commit certainly never left or met a 429 longer than a handler sits out: with backoff (``FIRST`` seconds
    doubling to ``_CAP``), in each update's order, until done or stopped (they stay queued for the next start). Each
    try takes the row with a fresh claim id first: whoever loses that race sends nothing."""

    def __init__(self, deliver: Deliver, logger: logging.Logger) -> None:
        self._deliver = deliver
        self._log = logger
        self._cond = threading.Condition()
        self._due: dict[tuple[int, int], tuple[float, int]] = {}  # (update_id, seq) -> (monotonic due, failures)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._in_hand: int | None = None  # the update of the call being tried
        self.resent = 0  # how many tries this thread made (for stats)

    def start(self) -> None:
        """Start the thread (``fence-calls-resend``). Idempotent."""
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="fence-calls-resend", daemon=True)
        self._thread.start()

    def add(self, update_id: int, seq: int, delay: float = 0.0) -> None:
        """Try ``(update_id, seq)`` again ``delay`` seconds from now (sooner if it was already due sooner)."""
        key = (update_id, seq)
        due = time.monotonic() + max(0.0, delay)
        with self._cond:
            current = self._due.get(key)
            if current is None or current[0] > due:
                self._due[key] = (due, current[1] if current is not None else 0)
            self._cond.notify_all()

    def waiting_for(self, update_id: int) -> bool:
        """Whether a call of ``update_id`` waits for another try (a later call of it must queue behind)."""
        with self._cond:
            return any(key[0] == update_id for key in self._due) or self._in_hand == update_id

    def pending(self) -> int:
        """How many calls wait for another try (the one being tried counted)."""
        with self._cond:
            return len(self._due) + (self._in_hand is not None)

    def stop(self) -> None:
        """Ask the thread to end after the try in hand (the calls waiting stay queued). Idempotent."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; ``True`` when it has (or never started)."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    @property
    def stopping(self) -> threading.Event:
        """Set once :meth:`stop` was called (a send waiting for the rate limits gives up then)."""
        return self._stop

    def _next(self) -> tuple[tuple[int, int], int] | None:
        """The next due call and its failures so far, waiting for it; ``None`` once stopped."""
        with self._cond:
            while not self._stop.is_set():
                if self._due:
                    # The calls of one update go in their order: only its lowest waiting position is a candidate.
                    firsts: dict[int, tuple[int, int]] = {}
                    for candidate in self._due:
                        if candidate[0] not in firsts or candidate < firsts[candidate[0]]:
                            firsts[candidate[0]] = candidate
                    key = min(firsts.values(), key=lambda k: self._due[k][0])
                    due, failures = self._due[key]
                    wait = due - time.monotonic()
                    if wait <= 0:
                        del self._due[key]
                        self._in_hand = key[0]
                        return key, failures
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
        return None

    def _run(self) -> None:
        while True:
            item = self._next()
            if item is None:
                return
            (update_id, seq), failures = item
            self.resent += 1
            try:
                later = self._deliver(update_id, seq, f"resend-{os.urandom(6).hex()}")
            except Exception as exc:  # Transient: it never left and is queued again; anything else: a bug or the store
                failures += 1
                wait = exponential(failures, FIRST, _CAP)
                self._log.warning("update %s: queued call %s could not be sent (%s); trying again in %.1f s",
                                  update_id, seq, exc, wait, extra={"update_id": update_id, "seq": seq})
                self._again(update_id, seq, wait, failures)
                continue
            if later is not None:
                self._again(update_id, seq, max(later, exponential(failures + 1, FIRST, _CAP)),
                            failures + 1)
            else:
                with self._cond:
                    self._in_hand = None

    def _again(self, update_id: int, seq: int, delay: float, failures: int) -> None:
        with self._cond:
            self._due[(update_id, seq)] = (time.monotonic() + delay, failures)
            self._in_hand = None
