"""The worker pool's shared parts: the counters, the heartbeat's alarm, the leases.

Also how the pool's threads are guarded (nothing they raise ends them silently) and its intervals, as functions of
the lease. Locks are taken in one order only: :class:`PoolState` calls :class:`Alarm` while it holds its own.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

from ..errors import ConfigurationError, SchemaError, StoreCorrupt
from .attempt import AttemptContext, error_line

__all__ = ["Alarm", "PoolState", "beat_interval", "can_outlive", "guarded_thread", "idle_scan_interval",
           "scan_interval"]

log = logging.getLogger("telegram_fence.guard")

#: The counters of the pool (``Fence.stats()["workers"]``).
COUNTERS = ("handled", "retried", "exhausted", "lost", "timeouts", "heartbeat_wakeups", "dispatcher_wakeups")


def beat_interval(lease: float) -> float:
    """Seconds between lease renewals: a third of the lease (at least 50 ms), so two renewals may fail."""
    return max(0.05, lease / 3)


def scan_interval(lease: float) -> float:
    """Seconds between the writer's full scans of the backlog: a quarter lease, at most one second."""
    return min(1.0, lease / 4)


def idle_scan_interval(lease: float) -> float:
    """Seconds between full scans while the pool holds nothing: a quarter lease, at most five seconds."""
    return min(5.0, lease / 4)


def can_outlive(error: BaseException) -> bool:
    """Whether a loop may log ``error``, back off and go on: ``False`` for a damaged or too new database, a setting
    that cannot work, and what is not an ``Exception``."""
    return isinstance(error, Exception) and not isinstance(error, (StoreCorrupt, SchemaError, ConfigurationError))


class Alarm:
    """When the heartbeat must wake next, and its stop: it ``arm``s the deadline it computed and ``sleep``s; anyone
    who needs it sooner calls :meth:`by` (one asked while it is awake is kept for the next ``arm``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadline = -math.inf  # monotonic; -inf while the heartbeat is awake
        self._asked = math.inf  # the earliest deadline asked for while it was awake
        self._wake = threading.Event()
        self._stop = threading.Event()

    def by(self, deadline: float) -> None:
        """Make the heartbeat wake by ``deadline`` (monotonic) at the latest."""
        with self._lock:
            self._asked = min(self._asked, deadline)
            if deadline < self._deadline:
                self._deadline = deadline
                self._wake.set()

    def arm(self, deadline: float | None, now: float, at_least: float = 0.0) -> float | None:
        """Set the next wake-up (``None``: only when woken); returns the seconds to sleep (``None``: no limit)."""
        with self._lock:
            due = min(math.inf if deadline is None else deadline, self._asked)
            self._asked = math.inf
            wait = None if due == math.inf else max(at_least, due - now)
            self._deadline = math.inf if wait is None else now + wait
            self._wake.clear()
            return wait

    def sleep(self, wait: float | None) -> bool:
        """Sleep up to ``wait`` seconds, or until woken; ``True`` when the heartbeat must stop."""
        if self._stop.is_set():
            return True
        self._wake.wait(wait)
        with self._lock:
            self._deadline = -math.inf
        return self._stop.is_set()

    def stop(self) -> None:
        """Tell the heartbeat to end (it wakes now)."""
        self._stop.set()
        self._wake.set()

    def stopped(self) -> bool:
        return self._stop.is_set()


class PoolState:
    """The pool's settings, its counters (:data:`COUNTERS`), its alarm and the attempts whose lease it holds, from
    their claim until they were settled, retried, exhausted, completed, handed back, taken away or found lost (the
    heartbeat renews these). Thread-safe; the attributes are never rebound. ``on_fatal(reason)`` ends the fence
    when one of the pool's threads cannot go on."""

    __slots__ = ("_beat", "_counts", "_held", "_lock", "alarm", "handler_timeout", "lease", "on_fatal", "stop")

    def __init__(self, lease: float, handler_timeout: float, on_fatal: Callable[[str], None]) -> None:
        self.lease = lease
        self.handler_timeout = handler_timeout
        self.on_fatal = on_fatal
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._held: dict[AttemptContext, None] = {}
        self._beat = beat_interval(lease)
        self.alarm = Alarm()

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``key`` (one of :data:`COUNTERS`; ``KeyError`` otherwise)."""
        with self._lock:
            self._counts[key] += n

    def counts(self) -> dict[str, int]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._counts)

    def hold(self, contexts: Iterable[AttemptContext]) -> None:
        """The pool now holds ``contexts``' leases: the heartbeat renews them in time."""
        with self._lock:
            self._held.update(dict.fromkeys(contexts))
            self.alarm.by(time.monotonic() + self._beat)

    def let_go(self, contexts: Iterable[AttemptContext]) -> None:
        """The pool no longer holds ``contexts``' leases (those it did not hold are ignored)."""
        with self._lock:
            for ctx in contexts:
                self._held.pop(ctx, None)

    def held(self) -> list[AttemptContext]:
        """The attempts whose lease the pool holds."""
        with self._lock:
            return list(self._held)

    def holding(self) -> int:
        """How many leases the pool holds."""
        with self._lock:
            return len(self._held)


def guarded_thread(body: Callable[[], None], name: str, on_fatal: Callable[[str], None]) -> threading.Thread:
    """A daemon thread ``name`` (not started) running ``body``: whatever escapes it is logged and ends the fence
    through ``on_fatal(reason)`` with a reason naming the thread and the error."""

    def run() -> None:
        try:
            body()
        except BaseException as exc:
            log.critical("%s cannot go on: %s", name, error_line(exc), exc_info=exc)
            try:
                on_fatal(f"{name} cannot go on: {error_line(exc)}")
            except Exception:
                log.error("ending the fence failed", exc_info=True)

    return threading.Thread(target=run, name=name, daemon=True)
