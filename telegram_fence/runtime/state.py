"""The worker pool's shared parts, each behind its own lock: the counters, the heartbeat's alarm, the leases.

May import ``runtime.attempt``, ``runtime.decisions`` and the standard library.

Thread safety: every object here is safe to call from any thread; each guards its own state with one lock of its
own, taken by its methods. Locks are taken in one order only: :class:`Leases` calls :class:`Alarm` while it holds
its own; nothing here calls back into the writer or the workers.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable

from . import decisions
from .attempt import AttemptContext

__all__ = ["Alarm", "Counters", "Leases", "PoolState"]

#: The counters of the pool (``Fence.stats()["workers"]``).
COUNTERS = ("handled", "retried", "exhausted", "lost", "timeouts", "heartbeat_wakeups", "dispatcher_wakeups")


class Counters:
    """The pool's counters (see :data:`COUNTERS`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)

    def add(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``key`` (one of :data:`COUNTERS`; ``KeyError`` otherwise)."""
        with self._lock:
            self._counts[key] += n

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._counts)


class Alarm:
    """When the heartbeat must wake next, and its stop.

    The heartbeat ``arm``s it with the deadline it computed and ``sleep``s; anyone who needs it sooner calls
    :meth:`by`, which costs a comparison when it wakes by then anyway. A :meth:`by` that comes while the heartbeat
    is awake (between ``sleep`` and the next ``arm``) is kept for that ``arm``.
    """

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
        """Sleep up to ``wait`` seconds (armed first), or until woken; ``True`` when the heartbeat must stop."""
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
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()


class Leases:
    """Every attempt whose lease the pool holds: from its claim until it was settled, retried, exhausted,
    completed, handed back, taken away (``handler_timeout``) or found lost. The heartbeat renews these."""

    def __init__(self, alarm: Alarm, lease: float) -> None:
        self._lock = threading.Lock()
        self._held: dict[AttemptContext, None] = {}
        self._alarm = alarm
        self._beat = decisions.beat_interval(lease)

    def add(self, contexts: Iterable[AttemptContext]) -> None:
        """The pool now holds ``contexts``' leases: the heartbeat renews them in time."""
        with self._lock:
            self._held.update(dict.fromkeys(contexts))
            self._alarm.by(time.monotonic() + self._beat)

    def drop(self, contexts: Iterable[AttemptContext]) -> None:
        """The pool no longer holds ``contexts``' leases (those it did not hold are ignored)."""
        with self._lock:
            for ctx in contexts:
                self._held.pop(ctx, None)

    def held(self) -> list[AttemptContext]:
        """The attempts held now."""
        with self._lock:
            return list(self._held)

    def holds(self, ctx: AttemptContext) -> bool:
        with self._lock:
            return ctx in self._held

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


class PoolState:
    """The pool's settings and its shared parts (each thread-safe on its own; the attributes are never rebound)."""

    __slots__ = ("alarm", "counters", "handler_timeout", "lease", "leases", "on_fatal", "stop")

    def __init__(self, lease: float, handler_timeout: float, on_fatal: Callable[[str], None]) -> None:
        self.lease = lease
        self.handler_timeout = handler_timeout
        #: ends the fence with a reason when a thread cannot go on (see ``runtime.guard``)
        self.on_fatal = on_fatal
        self.stop = threading.Event()
        self.counters = Counters()
        self.alarm = Alarm()
        self.leases = Leases(self.alarm, lease)
