"""The worker pool: the dispatcher, its one writer, claims and settles; workers run handlers; a heartbeat keeps leases.

One job: assemble the pool's parts and give the fence one object to start, feed, stop and observe.
The parts: :mod:`.dispatcher` (records the poller's batches, settles and claims in one transaction
per round, through :mod:`.exchange`), :mod:`.inline` (fast handlers run on the dispatcher itself),
:mod:`.workers` (the handler threads, retries, exhaustions), :mod:`.heartbeat` (leases, handler
timeouts), sharing the parts of :mod:`.state`, the dispatcher's :mod:`.mailbox` and :mod:`.seat`;
their decisions are the plain functions of :mod:`.decisions`.
May import ``retry``, ``store`` (types) and its ``runtime`` siblings except ``fence``.

Thread safety: ``record``, ``fetching`` (the poller's), ``wake``, ``stop``, ``alive``, ``in_flight``,
``inline`` and ``counts`` may be called from any thread; ``start`` and ``join`` by the owner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import ConfigurationError
from ..retry import RetryPolicy
from ..store import FencedUpdateStore
from .attempt import AttemptContext
from .capabilities import StoreCapabilities
from .dispatcher import Dispatcher
from .exchange import Exchanger
from .heartbeat import Heartbeat
from .mailbox import Mailbox
from .rounds import RoundParts
from .seat import Seat
from .state import PoolState
from .workers import Handler, Parser, Workers
from .writer import Writer

__all__ = ["WorkerPool"]


class WorkerPool:
    """Threads ``fence-dispatcher``, ``fence-worker-N`` and ``fence-heartbeat``.

    Owned by the fence; ``stop()`` and ``wake()`` may be called from any thread. Its parts are
    attributes for the fence's internals and benchmarks: ``state``, ``seat``, ``mailbox``, ``workers``,
    ``exchanger``, ``dispatcher`` (with ``dispatcher.inline``) and ``heartbeat``.
    """

    def __init__(
        self,
        *,
        store: FencedUpdateStore,
        handle: Handler,
        parse: Parser,
        workers: int,
        lease: float,
        max_attempts: int,
        retry: RetryPolicy,
        handler_timeout: float,
        batch_size: int = 16,
        on_exhausted: Callable[[], None] = lambda: None,
        on_progress: Callable[[], None] = lambda: None,
        on_tick: Callable[[], float | None] = lambda: None,
        on_fatal: Callable[[str], None] = lambda reason: None,
        on_claimed: Callable[[Sequence[AttemptContext]], None] = lambda contexts: None,
        capabilities: StoreCapabilities | None = None,
        on_drained: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_tick()`` is the supervisor's tick, called on the heartbeat: it returns the monotonic time it
        wants to be called again by (``None``: not by time). ``on_fatal(reason)`` is called (once per
        thread) when one of the pool's threads cannot go on. ``on_claimed(contexts)`` is told each round's new
        attempts before any of them begins (see :class:`~.dispatcher.Dispatcher`). ``capabilities``: what
        ``store`` can do, as the fence already looked at it (``StoreCapabilities.of(store)`` when not given; when
        given, it must be of this ``store``, else :class:`ConfigurationError`). ``on_drained()``: a stopped pool
        ended its threads on its own, no handler runs any more (see :class:`~.heartbeat.Heartbeat`; on the
        heartbeat's thread, without :meth:`join`)."""
        if capabilities is None:
            capabilities = StoreCapabilities.of(store)
        elif capabilities.store is not store:
            raise ConfigurationError("capabilities= were looked up for another store than store=")
        #: what the store can do, looked at once; the parts call its typed views, never probe the store
        self.capabilities = capabilities
        self.state = state = PoolState.make(workers=workers, batch_size=batch_size, lease=lease,
                                            handler_timeout=handler_timeout, on_fatal=on_fatal)
        self.seat = Seat(state.slots)
        self.mailbox = mailbox = Mailbox(state)
        self.writer = writer = Writer(self.seat, mailbox, capabilities.store.record)
        self.workers = Workers(state, mailbox=mailbox, writer=writer, store=capabilities, handle=handle, parse=parse,
                               max_attempts=max_attempts, retry=retry, on_exhausted=on_exhausted)
        self.exchanger = Exchanger(state, mailbox=mailbox, writer=writer, store=capabilities, lease=lease,
                                   max_attempts=max_attempts)
        parts = RoundParts(state, self.seat, mailbox, capabilities, lease, self.exchanger, on_progress, on_claimed)
        self.dispatcher = Dispatcher(parts, workers=self.workers)
        self.heartbeat = Heartbeat(state, seat=self.seat, mailbox=mailbox, writer=writer, store=capabilities,
                                   lease=lease, handler_timeout=handler_timeout,
                                   hand_over=self.dispatcher.inline.hand_over, spawn=self.workers.spawn,
                                   wake=self.wake, on_tick=on_tick, on_drained=on_drained)
        self.seat.seat(self.dispatcher.thread())
        self._heartbeat = self.heartbeat.thread()

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers, the dispatcher and the heartbeat."""
        for _ in range(self.state.size):
            self.workers.spawn()
        dispatcher = self.seat.holder()
        assert dispatcher is not None
        dispatcher.start()
        self._heartbeat.start()

    def record(self, updates: Sequence[Mapping[str, Any]], next_offset: int, **kwargs: Any) -> int:
        """``store.record`` run on the dispatcher thread (see :meth:`Writer.record`)."""
        return self.writer.record(updates, next_offset, **kwargs)

    def fetching(self) -> None:
        """The poller is about to call ``getUpdates`` (called on the poller's thread)."""
        self.dispatcher.fetching()

    def wake(self) -> None:
        """Tell the dispatcher that new work may be due anywhere (it looks at the whole backlog)."""
        self.mailbox.wake(scan=True)

    def stop(self) -> None:
        """Stop claiming; running handlers finish (see :meth:`join`). Safe from any thread, a handler included."""
        self.state.stop.set()
        self.state.queue.close()
        self.mailbox.notify_all()
        self.state.alarm.by(time.monotonic())  # the heartbeat looks whether the pool drained already

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for running handlers, settle what finished, hand back what never started.
        (A stopped pool does that on its own too, once no handler runs: :meth:`join` then finds it done.)

        In this order: the workers end (the heartbeat renews their leases meanwhile), the heartbeat ends,
        then the writer (the dispatcher) serves what is left, settles and hands back in its last round.
        Returns ``True`` when every thread ended. A handler still running after ``timeout`` is abandoned:
        its lease is no longer renewed, so its update is reclaimed after the lease and its fenced writes
        are refused from then on.
        """
        state = self.state
        deadline = time.monotonic() + timeout
        ok = True
        for thread in state.slots.threads():
            thread.join(max(0.0, deadline - time.monotonic()))
            ok = ok and not thread.is_alive()
        state.alarm.stop()
        if self._heartbeat.ident is not None:
            self._heartbeat.join(max(0.5, deadline - time.monotonic()))
            ok = ok and not self._heartbeat.is_alive()
        self.mailbox.close()  # the writer's last round: what finished is settled, what never started handed back
        for dispatcher in self.seat.everyone():
            if dispatcher.ident is not None:
                dispatcher.join(max(0.5, deadline - time.monotonic()))
                ok = ok and not dispatcher.is_alive()
        holder = self.seat.holder()
        if not self.dispatcher.flushed and (holder is None or not holder.is_alive()):
            self.dispatcher.final_flush(self.mailbox.take_finished())  # no dispatcher ran to the end: done here
        return ok

    # --- observation ----------------------------------------------------------------------------

    @property
    def alive(self) -> int:
        """Worker threads alive and not abandoned."""
        return self.state.slots.alive()

    def running(self) -> int:
        """Handlers running now (on workers or the dispatcher)."""
        return self.state.slots.running()

    def threads(self) -> dict[str, bool]:
        """Whether the dispatcher (the current one) and the heartbeat threads are alive."""
        dispatcher = self.seat.holder()
        return {"dispatcher": dispatcher is not None and dispatcher.is_alive(),
                "heartbeat": self._heartbeat.is_alive()}

    def in_flight(self) -> int:
        """Attempts whose lease the pool holds."""
        return len(self.state.leases)

    @property
    def inline(self) -> bool:
        """Whether the dispatcher currently runs the handlers itself (they measured as fast)."""
        return self.state.handler_time.inline_mode()

    @property
    def counts(self) -> dict[str, int]:
        """The pool's counters (handled, retried, exhausted, lost, timeouts, handovers, wake-ups): a copy."""
        return self.state.counters.snapshot()
