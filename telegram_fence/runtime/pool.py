"""The worker pool: the writer thread, the elastic worker threads and the heartbeat, assembled and started, stopped
and observed as one.

The parts: :mod:`.dispatcher` (the writer's rounds), :mod:`.workers` (the handler threads), :mod:`.outcomes` (one
attempt and its retry or exhaustion), :mod:`.heartbeat` (leases, handler timeouts), sharing :mod:`.state` and the
writer's :mod:`.mailbox`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..retry import RetryPolicy
from ..store import UpdateStore
from .attempt import AttemptContext
from .dispatcher import Dispatcher
from .heartbeat import Heartbeat
from .mailbox import Writer
from .outcomes import Attempts, Handler, Parser
from .state import PoolState, guarded_thread
from .workers import Workers

__all__ = ["WorkerPool"]


class WorkerPool:
    """Threads ``fence-dispatcher`` (the writer), ``fence-worker-N`` and ``fence-heartbeat``; owned by the fence.

    ``writer``: the fence's, whose mailbox this pool's writer thread serves. ``on_tick()`` is the fence's tick on the
    heartbeat (it returns when to call it again, monotonic, or ``None``); ``on_fatal(reason)``: a thread cannot go
    on; ``on_claimed(contexts)`` is told each round's new attempts before any begins; ``on_drained()``: a stopped
    pool ended its threads on its own (on the heartbeat's thread). ``start`` and ``join`` are the owner's; the rest
    may be called from any thread.
    """

    def __init__(self, store: UpdateStore, writer: Writer, *, handle: Handler, parse: Parser, workers: int,
                 lease: float, max_attempts: int, retry: RetryPolicy, handler_timeout: float,
                 on_exhausted: Callable[[], None] = lambda: None, on_tick: Callable[[], float | None] = lambda: None,
                 on_fatal: Callable[[str], None] = lambda reason: None,
                 on_claimed: Callable[[Sequence[AttemptContext]], None] = lambda contexts: None,
                 on_drained: Callable[[], None] = lambda: None) -> None:
        self.state = state = PoolState(lease, handler_timeout, on_fatal)
        self.writer = writer
        self.mailbox = mailbox = writer.mailbox
        self.attempts = Attempts(state, writer=writer, store=store, handle=handle, parse=parse,
                                 max_attempts=max_attempts, retry=retry, on_exhausted=on_exhausted)
        self.workers = Workers(state, cap=workers, run=lambda ctx: self.attempts.run(ctx) == "settle", done=self._done)
        mailbox.attach(state.stop, self.workers.room, lambda: state.count("dispatcher_wakeups"))
        self.dispatcher = Dispatcher(state, mailbox, store, max_attempts=max_attempts, run=self.workers.put,
                                     unstarted=self.workers.drain, on_claimed=on_claimed, write=writer.call)
        self.heartbeat = Heartbeat(state, workers=self.workers, writer=writer, store=store, wake=self.wake,
                                   on_tick=on_tick, on_drained=on_drained)
        self._writer_thread = guarded_thread(self.dispatcher.loop, "fence-dispatcher", on_fatal)
        self._heartbeat = guarded_thread(self.heartbeat.loop, "fence-heartbeat", on_fatal)

    def _done(self, ctx: AttemptContext, settle: bool, ended: Callable[[], None]) -> None:
        """``ctx`` ended: settled by a coming round, or (retried, exhausted, completed, lost) let go now."""
        if not settle:
            self.state.let_go((ctx,))
        self.mailbox.file(ctx, settle, ended)

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
        """Wait up to ``timeout`` for running handlers (their leases renewed meanwhile), then end the heartbeat and run
        the writer's last round (settle what finished, hand back what never started); ``True`` when every thread
        ended. A handler still running after ``timeout`` is abandoned: its lease lapses, its writes are refused."""
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

    def threads(self) -> dict[str, bool]:
        """Whether the writer and the heartbeat threads are alive."""
        return {"dispatcher": self._writer_thread.is_alive(), "heartbeat": self._heartbeat.is_alive()}

    def stats(self) -> dict[str, int]:
        """Worker threads ``alive`` (not abandoned), attempts held (``in_flight``), handlers ``running`` and the
        pool's counters (handled, retried, exhausted, lost, timeouts, wake-ups)."""
        return {"alive": self.workers.alive(), "in_flight": self.state.holding(), "running": self.workers.running(),
                **self.state.counts()}
