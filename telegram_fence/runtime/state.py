"""The worker pool's shared state: the queues, slots, hints and counters its threads hand work through.

One job: hold what the dispatcher, the workers, inline mode and the heartbeat share, with the small
operations on it that must run under its lock. May import ``runtime.attempt``, ``runtime.decisions``,
``runtime.handoff``, ``updates`` and the standard library.

Thread safety: every mutable attribute is guarded by ``lock``, the one mutex of the pool, always taken
under that name (``with state.lock:``), unless its comment says otherwise. ``claims_queued`` and
``dispatcher_wake`` are conditions on that same lock, used only to wait and notify: workers wait on the
first for queued claims, the dispatcher on the second for results and wake-ups. Methods documented
"call with the lock held" expect the caller to hold it, the others take it themselves.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..updates import chat_id_of
from . import decisions
from .attempt import AttemptContext
from .handoff import RecordRequest

__all__ = ["PoolState", "Slot"]


@dataclass(eq=False)
class Slot:
    """One worker thread and the attempt it is running (guarded by the pool's lock)."""

    current: AttemptContext | None = None
    abandoned: bool = False
    #: a former dispatcher, stuck in an inline handler: it ends after that attempt (no replacement)
    demoted: bool = False


class PoolState:
    """What the pool's threads share (see the module docstring for its locking)."""

    def __init__(
        self,
        *,
        workers: int,
        batch_size: int,
        lease: float,
        handler_timeout: float,
        on_fatal: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.size = workers
        self.lease = lease
        self.handler_timeout = handler_timeout
        #: ends the fence with a reason when a thread cannot go on (set once; see ``runtime.guard``)
        self.on_fatal = on_fatal
        self.batch = max(1, batch_size)
        self.stop = threading.Event()  # thread-safe on its own
        self.hb_stop = threading.Event()  # thread-safe on its own
        self.fetch_started = threading.Event()  # thread-safe on its own
        self.lock = threading.Lock()
        self.claims_queued = threading.Condition(self.lock)  # workers wait here for queued claims
        self.dispatcher_wake = threading.Condition(self.lock)  # the dispatcher waits here for results and wake-ups
        self.queue: deque[AttemptContext] = deque()
        self.finished: list[AttemptContext] = []
        self.finished_at = 0.0  # when the oldest of them finished
        self.woken = True
        # Where claimable work may be: the chats (and chatless updates) that were just freed or just
        # received updates. Anything else becomes claimable only by time (retries, lapsed leases) or
        # through another process, which a periodic full scan finds.
        self.scan_due = True
        self.next_scan = 0.0  # written by the dispatcher thread only
        self.hint_chats: set[int] = set()
        self.hint_chatless: set[int] = set()
        self.record_request: RecordRequest | None = None
        self.running = 0  # workers inside a handler, not abandoned
        self.dispatcher_waiting = False
        self.handler_time = 0.0
        self.slots: dict[threading.Thread, Slot] = {}
        self.serial = 0
        # Inline mode: the dispatcher's own claims, not started yet, and the one it is running.
        self.inline: deque[AttemptContext] = deque()
        self.inline_current: AttemptContext | None = None
        self.dispatcher: threading.Thread | None = None
        self.retired: list[threading.Thread] = []  # dispatchers that handed over
        self.counts = {"handled": 0, "retried": 0, "exhausted": 0, "lost": 0, "timeouts": 0, "handovers": 0,
                       "heartbeat_wakeups": 0, "dispatcher_wakeups": 0}
        # Keeping time without a tick: the heartbeat sleeps until ``hb_deadline`` (monotonic; -inf while
        # it is awake) unless ``hb_wake`` is set by one who needs it sooner (see ``heartbeat_by``).
        self.hb_wake = threading.Event()  # thread-safe on its own
        self.hb_deadline = -math.inf
        #: when retries this pool recorded become due (monotonic, a heap): the dispatcher scans then
        self.due: list[float] = []

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``key``."""
        with self.lock:
            self.counts[key] += n

    def inline_mode(self) -> bool:
        """Whether the dispatcher currently runs the handlers itself (see :func:`decisions.inline_mode`)."""
        return decisions.inline_mode(self.handler_time)

    def room(self) -> int:
        """How many more attempts the pool may claim now (may be negative; call with the lock held)."""
        return decisions.target(self.handler_time, self.batch, self.size) - len(self.queue) - self.running

    def measured(self, elapsed: float) -> None:
        """Fold one handler's run time into the average (call with the lock held)."""
        self.handler_time = decisions.average(self.handler_time, elapsed)

    def hint(self, updates: Sequence[Mapping[str, Any]]) -> None:
        """Note the chats of ``updates`` as places where claimable work may be (call with the lock held)."""
        for update in updates:
            chat_id = chat_id_of(update)
            if chat_id is None:
                self.hint_chatless.add(update["update_id"])
            else:
                self.hint_chats.add(chat_id)

    def hint_freed(self, finished: list[AttemptContext]) -> None:
        """Note the chats of ``finished`` (settled in this round) as freed (call with the lock held)."""
        for ctx in finished:
            if ctx.chat_id is not None:
                self.hint_chats.add(ctx.chat_id)

    def hint_handed_back(self, ctx: AttemptContext) -> None:
        """Note a claim handed back to the store as claimable again, and wake the dispatcher's next round."""
        with self.lock:
            if ctx.chat_id is not None:
                self.hint_chats.add(ctx.chat_id)
            else:
                self.hint_chatless.add(ctx.update_id)
            self.woken = True

    def done(self, ctx: AttemptContext, outcome: str, now: float) -> None:
        """File an attempt's outcome for the dispatcher (call with the lock held)."""
        if outcome == "settle":
            if not self.finished:
                self.finished_at = now
            self.finished.append(ctx)
        else:  # retried, exhausted, completed or lost: the chat no longer waits on this attempt
            if ctx.chat_id is not None:
                self.hint_chats.add(ctx.chat_id)
            self.woken = True

    def live(self) -> list[AttemptContext]:
        """Every attempt whose lease the pool holds (call with the lock held)."""
        running = [s.current for s in self.slots.values() if s.current is not None and not s.abandoned]
        if self.inline_current is not None:
            running.append(self.inline_current)
        return [*self.queue, *self.inline, *running, *self.finished]

    def enqueue(self, contexts: list[AttemptContext]) -> None:
        """Give ``contexts`` to the workers."""
        if not contexts:
            return
        with self.lock:
            self.queue.extend(contexts)
            self.claims_queued.notify(len(contexts))
            self.holding()

    def holding(self) -> None:
        """The pool holds new leases: the heartbeat must renew them in time (call with the lock held)."""
        self.heartbeat_by(time.monotonic() + decisions.beat_interval(self.lease))

    def heartbeat_by(self, deadline: float) -> None:
        """Make the heartbeat wake by ``deadline`` (monotonic) at the latest (call with the lock held).

        Costs a comparison when the heartbeat will wake by then anyway (or is awake).
        """
        if deadline < self.hb_deadline:
            self.hb_deadline = deadline
            self.hb_wake.set()

    def idle(self) -> bool:
        """Whether the pool holds no lease: nothing queued, running, inline or finished (call with the lock held)."""
        return not (self.queue or self.inline or self.finished or self.running or self.inline_current)

    def retry_due(self, at: float) -> None:
        """Note that an update this pool retried becomes due at ``at`` (monotonic); wakes a waiting dispatcher."""
        with self.lock:
            heapq.heappush(self.due, at)
            if self.dispatcher_waiting:
                self.dispatcher_wake.notify()

    def next_due(self, now: float) -> float | None:
        """The earliest noted retry time still ahead of ``now`` (passed ones are dropped; call with the lock held)."""
        due = self.due
        while due and due[0] <= now:
            heapq.heappop(due)
        return due[0] if due else None
