"""The worker pool's parts that its threads share, each the one owner of its state, behind its own lock.

One job: the small thread-safe objects the dispatcher, the workers, inline mode and the heartbeat hand
work through: :class:`Counters` (the pool's counts), :class:`HandlerTime` (the measured handler time),
:class:`Alarm` (when the heartbeat must wake), :class:`Leases` (every attempt whose lease the pool holds),
:class:`WorkQueue` (claims waiting for a worker) and :class:`Slots` (the worker threads and what each
runs), gathered in :class:`PoolState`. May import ``runtime.attempt``, ``runtime.decisions``, ``store``
(types) and the standard library.

Thread safety: every object here is safe to call from any thread; each guards its own state with one
lock of its own (``_lock``), taken by its methods, never by a caller. Nothing outside a class writes its
attributes. Locks are taken in one order only: :class:`Leases` calls :class:`Alarm` while it holds its
own; the dispatcher's mailbox and the seat (``runtime.mailbox``, ``runtime.seat``) call these while they
hold theirs; nothing here calls back into them.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from ..records import Record
from ..store import Identity
from . import decisions
from .attempt import AttemptContext

__all__ = ["Alarm", "Counters", "HandlerTime", "Leases", "PoolState", "Slot", "Slots", "WorkQueue"]

#: The counters of the pool (``Fence.stats()["workers"]``).
COUNTERS = ("handled", "retried", "exhausted", "lost", "timeouts", "handovers", "heartbeat_wakeups",
            "dispatcher_wakeups")


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


class HandlerTime:
    """How long handlers take: the running average (how deep the queue is) and the clipped one that decides inline
    mode (see :func:`decisions.typical`). Safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._average = 0.0
        self._typical = 0.0

    def measured(self, elapsed: float) -> None:
        """Fold one handler's run time into both averages."""
        with self._lock:
            self._average = decisions.average(self._average, elapsed)
            self._typical = decisions.typical(self._typical, elapsed)

    def fold(self, elapsed: Iterable[float]) -> None:
        """:meth:`measured` each of ``elapsed`` in order, under one lock (an inline run's handlers)."""
        with self._lock:
            average, typical = self._average, self._typical
            for seconds in elapsed:
                average = decisions.average(average, seconds)
                typical = decisions.typical(typical, seconds)
            self._average, self._typical = average, typical

    def typical(self) -> float:
        """The clipped average that decides inline mode (see :meth:`inline_mode`)."""
        with self._lock:
            return self._typical

    def at_least(self, seconds: float) -> None:
        """Count handlers as taking ``seconds`` at least (a handler just stalled the dispatcher): no longer inline."""
        with self._lock:
            self._average = max(self._average, seconds)
            self._typical = max(self._typical, seconds)

    def value(self) -> float:
        """The average (0 before the first handler ran)."""
        with self._lock:
            return self._average

    def inline_mode(self) -> bool:
        """Whether the dispatcher runs the handlers itself (see :func:`decisions.inline_mode`), decided on the
        clipped average: one run the machine slowed down does not end it."""
        with self._lock:
            return decisions.inline_mode(self._typical)

    def settle_hold(self, finished_at: float, now: float) -> float:
        """How much longer finished attempts may wait for the next batch (see :func:`decisions.settle_hold`)."""
        with self._lock:
            typical = self._typical
        return decisions.settle_hold(typical, finished_at, now)

    def target(self, batch: int, workers: int) -> int:
        """How many attempts the pool should hold (see :func:`decisions.target`)."""
        with self._lock:
            average, typical = self._average, self._typical
        return decisions.target(average, batch, workers, inline=decisions.inline_mode(typical))


class Alarm:
    """When the heartbeat must wake next, and its stop.

    The heartbeat ``arm``s it with the deadline it computed and ``sleep``s; anyone who needs it sooner
    calls :meth:`by`, which costs a comparison when it will wake by then anyway. A :meth:`by` that comes
    while the heartbeat is awake (between ``sleep`` and the next ``arm``) is kept for that ``arm``.
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
            if deadline < self._asked:
                self._asked = deadline
            if deadline < self._deadline:
                self._deadline = deadline
                self._wake.set()

    def arm(self, deadline: float | None, now: float, at_least: float = 0.0) -> float | None:
        """Set the next wake-up (``None``: only when woken); returns the seconds to sleep (``None``: no limit)."""
        with self._lock:
            due = math.inf if deadline is None else deadline
            due = min(due, self._asked)
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
            held = self._held
            for ctx in contexts:
                held[ctx] = None
            self._alarm.by(time.monotonic() + self._beat)

    def drop(self, contexts: Iterable[AttemptContext]) -> None:
        """The pool no longer holds ``contexts``' leases (those it did not hold are ignored)."""
        with self._lock:
            held = self._held
            for ctx in contexts:
                held.pop(ctx, None)

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


class WorkQueue:
    """Claimed attempts waiting for a worker, oldest first; :meth:`close` ends every :meth:`take`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._items: deque[AttemptContext] = deque()
        self._closed = False

    def put(self, contexts: list[AttemptContext]) -> None:
        """Queue ``contexts`` for the workers (in order)."""
        if not contexts:
            return
        with self._lock:
            self._items.extend(contexts)
            self._ready.notify(len(contexts))

    def take(self) -> AttemptContext | None:
        """The oldest queued attempt, waiting for one; ``None`` once the queue is closed."""
        with self._lock:
            while not self._items and not self._closed:
                self._ready.wait()
            if self._closed:
                return None
            return self._items.popleft()

    def close(self) -> None:
        """End every :meth:`take` (now and later); what is queued stays for :meth:`drain`."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()

    def drain(self) -> list[AttemptContext]:
        """Take everything queued (shutdown: handed back to the store)."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            return items

    def discard(self, identities: set[Identity]) -> None:
        """Drop the queued attempts of ``identities`` (their leases were lost: nobody runs them)."""
        with self._lock:
            self._items = deque(c for c in self._items if c.identity not in identities)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class Slot:
    """One worker thread's place in :class:`Slots`; only :class:`Slots` reads or writes its fields."""

    __slots__ = ("abandoned", "current", "demoted", "gone")

    def __init__(self, current: AttemptContext | None = None, demoted: bool = False) -> None:
        self.current = current
        self.abandoned = False
        self.gone = False  # its thread is leaving (the pool stopped): no attempt of it runs any more
        #: a former dispatcher, stuck in an inline handler: it ends after that attempt (no replacement)
        self.demoted = demoted


class Slots:
    """The worker threads, the attempt each runs, and how many handlers run (not counting abandoned ones)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[threading.Thread, Slot] = {}
        self._serial = 0
        self._running = 0

    def add(self, make: Callable[[str, Slot], threading.Thread]) -> threading.Thread:
        """Register a new worker thread ``make(name, slot)`` (unstarted) and return it."""
        with self._lock:
            self._serial += 1
            slot = Slot()
            thread = make(f"fence-worker-{self._serial}", slot)
            self._slots[thread] = slot
            return thread

    def begin(self, slot: Slot, ctx: AttemptContext) -> None:
        """``slot``'s thread starts running ``ctx``."""
        with self._lock:
            slot.current = ctx
            self._running += 1

    def end(self, slot: Slot) -> bool:
        """``slot``'s attempt returned; ``False`` when it had been abandoned (its thread must end)."""
        with self._lock:
            slot.current = None
            if slot.abandoned:
                return False
            self._running -= 1
            return True

    def adopt(self, thread: threading.Thread, ctx: AttemptContext) -> None:
        """A former dispatcher ``thread``, stuck in ``ctx``, now counts as a worker running it."""
        with self._lock:
            self._slots[thread] = Slot(current=ctx, demoted=True)
            self._running += 1

    def end_adopted(self, thread: threading.Thread) -> None:
        """The former dispatcher ``thread``'s attempt returned."""
        with self._lock:
            slot = self._slots.get(thread)
            if slot is not None and slot.current is not None:
                slot.current = None
                if not slot.abandoned:
                    self._running -= 1

    def take_timed_out(self, now: float, handler_timeout: float) -> list[tuple[AttemptContext, bool]]:
        """Abandon every slot whose handler ran ``handler_timeout`` or longer: ``(attempt, demoted)`` each."""
        stuck = []
        with self._lock:
            for slot in self._slots.values():
                ctx = slot.current
                if slot.abandoned or ctx is None or not decisions.timed_out(ctx.started, now, handler_timeout):
                    continue
                slot.abandoned = True
                self._running -= 1
                stuck.append((ctx, slot.demoted))
        return stuck

    def earliest_start(self) -> float | None:
        """When the longest-running handler started (monotonic), ``None`` when none runs."""
        with self._lock:
            starts = [s.current.started for s in self._slots.values()
                      if not s.abandoned and s.current is not None and s.current.started is not None]
        return min(starts) if starts else None

    def running(self) -> int:
        with self._lock:
            return self._running

    def alive(self) -> int:
        """Worker threads alive and not abandoned (nor leaving, see :meth:`leave`)."""
        with self._lock:
            return sum(1 for t, s in self._slots.items() if t.is_alive() and not s.abandoned and not s.gone)

    def leave(self, slot: Slot) -> None:
        """``slot``'s thread ends now (the pool stopped): it no longer counts as alive, even before it returns."""
        with self._lock:
            slot.gone = True

    def threads(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._slots)


class PoolState(Record, eq=False):
    """The pool's settings and its shared parts (each thread-safe on its own; see the module docstring)."""

    __slots__ = (
        "alarm",
        "batch",
        "counters",
        "handler_time",
        "handler_timeout",
        "lease",
        "leases",
        "on_fatal",
        "queue",
        "size",
        "slots",
        "stop",
    )
    size: int
    batch: int
    lease: float
    handler_timeout: float
    #: ends the fence with a reason when a thread cannot go on (see ``runtime.guard``)
    on_fatal: Callable[[str], None]
    stop: threading.Event
    counters: Counters
    handler_time: HandlerTime
    alarm: Alarm
    leases: Leases
    queue: WorkQueue
    slots: Slots

    def __init__(self, size: int, batch: int, lease: float, handler_timeout: float, on_fatal: Callable[[str], None],
                 stop: threading.Event, counters: Counters, handler_time: HandlerTime, alarm: Alarm, leases: Leases,
                 queue: WorkQueue, slots: Slots) -> None:
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "batch", batch)
        object.__setattr__(self, "lease", lease)
        object.__setattr__(self, "handler_timeout", handler_timeout)
        object.__setattr__(self, "on_fatal", on_fatal)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "counters", counters)
        object.__setattr__(self, "handler_time", handler_time)
        object.__setattr__(self, "alarm", alarm)
        object.__setattr__(self, "leases", leases)
        object.__setattr__(self, "queue", queue)
        object.__setattr__(self, "slots", slots)

    @classmethod
    def make(cls, *, workers: int, batch_size: int, lease: float, handler_timeout: float,
             on_fatal: Callable[[str], None] = lambda reason: None) -> PoolState:
        alarm = Alarm()
        return cls(size=workers, batch=max(1, batch_size), lease=lease, handler_timeout=handler_timeout,
                   on_fatal=on_fatal, stop=threading.Event(), counters=Counters(), handler_time=HandlerTime(),
                   alarm=alarm, leases=Leases(alarm, lease), queue=WorkQueue(), slots=Slots())

    def room(self) -> int:
        """How many more attempts the pool may claim now (may be negative)."""
        return (self.handler_time.target(self.batch, self.size)
                - len(self.queue) - self.slots.running())
