"""The worker pool: the writer thread records, settles and claims; worker threads run handlers; a heartbeat keeps
leases.

One job: assemble the pool's parts and give the fence one object to start, stop and observe. The parts:
:mod:`.dispatcher` (the writer thread's rounds), :mod:`.workers` (the elastic handler threads), :mod:`.outcomes`
(one attempt and its retry or exhaustion), :mod:`.heartbeat` (leases, handler timeouts), sharing :mod:`.state`
and the writer's :mod:`.mailbox`. May import ``retry``, ``store`` (types) and its ``runtime`` siblings except
``fence``.

Thread safety: ``wake``, ``stop``, ``alive``, ``running``, ``in_flight`` and ``counts`` may be called from any
thread; ``start`` and ``join`` by the owner.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from ..retry import RetryPolicy
from .attempt import AttemptContext
from .capabilities import StoreCapabilities
from .dispatcher import Dispatcher
from .guard import guarded
from .heartbeat import Heartbeat
from .outcomes import Attempts, Handler, Parser
from .state import PoolState
from .workers import Workers
from .writer import Writer

__all__ = ["WorkerPool"]


class WorkerPool:
    """Threads ``fence-dispatcher`` (the writer), ``fence-worker-N`` and ``fence-heartbeat``; owned by the fence.

    ``writer``: the fence's, whose mailbox this pool's writer thread serves; ``workers``: at most this many handler
    threads. ``on_tick()`` is the supervisor's tick, called on the heartbeat (it returns when it wants to be called
    again, monotonic, or ``None``); ``on_fatal(reason)`` is called when one of the pool's threads cannot go on;
    ``on_claimed(contexts)`` is told each round's new attempts before any of them begins; ``on_drained()``: a stopped
    pool ended its threads on its own (on the heartbeat's thread, without :meth:`join`).
    """

    def __init__(
        self,
        capabilities: StoreCapabilities,
        writer: Writer,
        *,
        handle: Handler,
        parse: Parser,
        workers: int,
        lease: float,
        max_attempts: int,
        retry: RetryPolicy,
        handler_timeout: float,
        on_exhausted: Callable[[], None] = lambda: None,
        on_tick: Callable[[], float | None] = lambda: None,
        on_fatal: Callable[[str], None] = lambda reason: None,
        on_claimed: Callable[[Sequence[AttemptContext]], None] = lambda contexts: None,
        on_drained: Callable[[], None] = lambda: None,
    ) -> None:
        self.capabilities = capabilities
        self.state = state = PoolState(lease, handler_timeout, on_fatal)
        self.writer = writer
        self.mailbox = mailbox = writer.mailbox
        self.attempts = Attempts(state, mailbox=mailbox, writer=writer, store=capabilities, handle=handle,
                                 parse=parse, max_attempts=max_attempts, retry=retry, on_exhausted=on_exhausted)
        self.workers = Workers(state, cap=workers, run=self._attempt, done=self._done)
        mailbox.attach(state.stop, self.workers.room, lambda: state.counters.add("dispatcher_wakeups"))
        self.dispatcher = Dispatcher(state, mailbox, capabilities, max_attempts=max_attempts, run=self.workers.put,
                                     unstarted=self.workers.drain, on_claimed=on_claimed, write=writer.call)
        self.heartbeat = Heartbeat(state, workers=self.workers, mailbox=mailbox, writer=writer, store=capabilities,
                                   lease=lease, handler_timeout=handler_timeout, wake=self.wake, on_tick=on_tick,
                                   on_drained=on_drained)
        self._writer_thread = threading.Thread(target=guarded(self.dispatcher.loop, on_fatal),
                                               name="fence-dispatcher", daemon=True)
        self._heartbeat = self.heartbeat.thread()

    def _attempt(self, ctx: AttemptContext) -> bool:
        """Run ``ctx`` on this worker thread; whether the writer settles it."""
        return self.attempts.run(ctx) == "settle"

    def _done(self, ctx: AttemptContext, settle: bool) -> None:
        """``ctx`` ended: settled by a coming round, or (retried, exhausted, completed, lost) let go now."""
        if not settle:
            self.state.leases.drop((ctx,))
        self.mailbox.file(ctx, settle)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer and the heartbeat; worker threads start as claims come."""
        self.writer.serve(self._writer_thread)
        self._writer_thread.start()
        self._heartbeat.start()
        self.wake()

    def wake(self) -> None:
        """Tell the writer that new work may be due anywhere (it looks at the whole backlog)."""
        self.mailbox.wake(scan=True)

    def stop(self) -> None:
        """Stop claiming; running handlers finish (see :meth:`join`). Safe from any thread, a handler included."""
        self.state.stop.set()
        self.workers.close()
        self.mailbox.wake()
        self.state.alarm.by(time.monotonic())  # the heartbeat looks whether the pool drained already

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for running handlers, settle what finished, hand back what never started (a stopped
        pool does that on its own too, once no handler runs). In this order: the workers end (the heartbeat renews
        their leases meanwhile), the heartbeat ends, then the writer's last round. ``True`` when every thread ended.
        A handler still running after ``timeout`` is abandoned: its lease is no longer renewed, so its update is
        reclaimed after the lease and its fenced writes are refused from then on."""
        deadline = time.monotonic() + timeout
        ok = self.workers.join(deadline)
        self.state.alarm.stop()
        if self._heartbeat.ident is not None:
            self._heartbeat.join(max(0.5, deadline - time.monotonic()))
            ok = ok and not self._heartbeat.is_alive()
        self.mailbox.close()
        if self._writer_thread.ident is not None:
            self._writer_thread.join(max(0.5, deadline - time.monotonic()))
            ok = ok and not self._writer_thread.is_alive()
        if not self.dispatcher.flushed and not self._writer_thread.is_alive():
            self.dispatcher.final_flush(self.mailbox.take_finished())  # no writer ran to the end: done here
        return ok

    # --- observation ----------------------------------------------------------------------------

    @property
    def alive(self) -> int:
        """Worker threads alive and not abandoned."""
        return self.workers.alive()

    def running(self) -> int:
        """Handlers running now."""
        return self.workers.running()

    def threads(self) -> dict[str, bool]:
        """Whether the writer and the heartbeat threads are alive."""
        return {"dispatcher": self._writer_thread.is_alive(), "heartbeat": self._heartbeat.is_alive()}

    def in_flight(self) -> int:
        """Attempts whose lease the pool holds."""
        return len(self.state.leases)

    @property
    def counts(self) -> dict[str, int]:
        """The pool's counters (handled, retried, exhausted, lost, timeouts, wake-ups): a copy."""
        return self.state.counters.snapshot()
