"""The heartbeat: keeps the pool's leases, takes updates away from handlers past ``handler_timeout``.

The ``fence-heartbeat`` thread renews every lease the pool holds (through the writer), sets ``owner_lost`` on attempts
whose lease could not be kept, and runs the fence's housekeeping (the poller watchdog, pruning of old rows).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TypeVar

from ..conversation.backends import STEP_RETENTION, prune_steps
from ..ingress.poller import Poller
from ..store import Identity, UpdateStore
from .attempt import AttemptContext, log_extra
from .mailbox import Abandoned, Writer
from .state import PoolState, beat_interval, can_outlive
from .workers import Workers

__all__ = ["Heartbeat", "Housekeeping"]

T = TypeVar("T")

log = logging.getLogger("telegram_fence.heartbeat")


class Heartbeat:
    """The ``fence-heartbeat`` thread's work; owned by the pool."""

    def __init__(self, state: PoolState, *, workers: Workers, writer: Writer, store: UpdateStore,
                 wake: Callable[[], None], on_tick: Callable[[], float | None],
                 on_drained: Callable[[], None] = lambda: None) -> None:
        self._state = state
        self._workers = workers
        self._mailbox = writer.mailbox
        self._writer = writer
        self._store = store
        self._wake = wake
        self._on_tick = on_tick
        self._on_drained = on_drained
        self._clock = store.clock

    def loop(self) -> None:
        """Run until the alarm is stopped or, once the pool stopped, until no handler runs: it then closes the
        writer's mailbox (its last round) and calls ``on_drained()``. Sleeps until the next renewal (while leases are
        held), handler timeout or tick."""
        state = self._state
        alarm = state.alarm
        interval = beat_interval(state.lease)
        next_beat: float | None = None  # the next renewal, while the pool holds leases
        next_tick: float | None = time.monotonic() + interval
        failed = False  # a step failed last time: wait a little, even for a deadline already passed
        while True:
            if state.stop.is_set() and self._workers.alive() == 0 and self._workers.running() == 0:
                # no handler runs or can start any more: so a pool stopped but never joined ends every thread
                self._mailbox.close()
                self._on_drained()
                return
            now = time.monotonic()
            if not state.holding():
                next_beat = None
            elif next_beat is None:
                next_beat = now + interval
            earliest = self._workers.earliest_start()
            timeout = None if earliest is None else earliest + state.handler_timeout
            deadlines = [d for d in (next_beat, next_tick, timeout) if d is not None]
            wait = alarm.arm(min(deadlines) if deadlines else None, now, 0.1 if failed else 0.0)
            if alarm.sleep(wait):
                return
            now = time.monotonic()
            state.count("heartbeat_wakeups")
            failed = False
            steps = [self._check_timeouts]
            if next_beat is not None and now >= next_beat:
                next_beat = now + interval
                steps.insert(0, self._renew)
            for step in steps:
                try:
                    step()
                except Exception as exc:
                    if not can_outlive(exc):
                        raise
                    failed = True
                    log.error("heartbeat failed", exc_info=True)
            if next_tick is not None and now >= next_tick:
                next_tick = now + interval
                try:
                    next_tick = self._on_tick()
                except Exception:
                    log.error("supervisor tick failed", exc_info=True)

    def _renew(self) -> None:
        state = self._state
        contexts = state.held()
        if not contexts:
            return
        identities = [ctx.identity for ctx in contexts]
        now = self._clock()
        store, lease = self._store, state.lease

        def renew() -> set[Identity]:
            return store.renew_many(identities, lease)

        try:
            kept = self.write(renew, durable=False)
        except Abandoned:
            return  # the pool stops
        except Exception:
            log.error("renewing leases failed", exc_info=True)
            for ctx in contexts:
                if now >= ctx.lease_until:
                    ctx.owner_lost.set()
            return
        missing = []
        for ctx in contexts:
            if ctx.identity in kept:
                ctx.lease_until = now + lease
            else:
                missing.append(ctx)
        # (those let go since the snapshot are done, not lost)
        held = set(state.held())
        lost = [ctx for ctx in missing if ctx in held]
        if not lost:
            return
        for ctx in lost:
            if not ctx.lost:
                log.warning("lease lost", extra=log_extra(ctx))
            ctx.owner_lost.set()
        identities_lost = {ctx.identity for ctx in lost}
        state.let_go(lost)
        self._workers.discard(set(lost))
        self._mailbox.discard(identities_lost)

    def write(self, fn: Callable[[], T], durable: bool = True) -> T:
        """``fn()`` done by the writer; raises :class:`Abandoned` once the heartbeat must stop."""
        alarm = self._state.alarm
        return self._writer.call(fn, while_waiting=lambda: not alarm.stopped(), durable=durable)

    def _check_timeouts(self) -> None:
        state = self._state
        stuck = self._workers.take_timed_out(time.monotonic())
        for ctx in stuck:
            state.count("timeouts")
            state.let_go((ctx,))
            ctx.owner_lost.set()
            log.error("handler exceeded handler_timeout; its update is taken away",
                      extra={**log_extra(ctx), "handler_timeout": state.handler_timeout})
            self._end_lease(ctx)
        if stuck:
            self._wake()

    def _end_lease(self, ctx: AttemptContext) -> None:
        """End a timed-out attempt's lease now (its later writes are refused); never raises (it lapses instead)."""
        store = self._store
        try:
            self.write(lambda: store.release(ctx.identity, attempt_counts=True), durable=False)
        except Exception:
            log.warning("could not end the lease of a timed-out handler; its update is taken again once the lease "
                        "lapses", exc_info=True, extra=log_extra(ctx))


class Housekeeping:
    """The watchdog over a stuck ``getUpdates`` and the pruning of settled rows, next-step handlers and delivered
    captures. ``poller()`` gives the current poller (or ``None``); ``on_stuck(reason)`` ends the fence when a long
    poll outlived ``long_poll + watchdog_margin``; ``write(fn)`` runs a store write (through the writer). Called
    from the heartbeat thread only, but :meth:`release_dead_claims`, by the starting thread.
    """

    def __init__(self, store: UpdateStore, *, retention: float, long_poll: float, watchdog_margin: float,
                 captures: bool, conversations: bool = False, poller: Callable[[], Poller | None],
                 stopping: Callable[[], bool], tell: Callable[[str], None], on_stuck: Callable[[str], None],
                 log: logging.Logger, write: Callable[[Callable[[], int]], int] = lambda fn: fn()) -> None:
        self._store = store
        self._write = write
        self._retention = retention
        self._limit = long_poll + watchdog_margin
        self._captures = captures
        self._conversations = conversations
        self._poller = poller
        self._stopping = stopping
        self._tell = tell
        self._on_stuck = on_stuck
        self._log = log
        self._last_prune = -math.inf  # the first tick prunes (monotonic time may start near 0: a fresh boot)

    def release_dead_claims(self) -> None:
        """At start: end the live claims of this host's processes that are gone (a killed run), so their updates
        run now rather than after their leases. Never raises (a failure is logged)."""
        try:
            released = self._store.release_dead_claims()
        except Exception:
            self._log.warning("could not look for the claims of a process that is gone; they run after their "
                              "leases", exc_info=True)
            return
        for owner, count in released.items():
            pid = int(owner.split(".")[1], 16)
            self._log.warning("released %s claim(s) of process %s, which is gone; their updates run now", count,
                              pid, extra={"claims": count, "owner_pid": pid})

    def tick(self) -> float:
        """The watchdog and, when due, pruning; returns when (monotonic) to be called again."""
        now = time.monotonic()
        prune_every = min(600.0, max(1.0, self._retention / 10))
        limit = self._limit
        poller = self._poller()
        # The watchdog looks again just after the call in hand (or one starting now) passed its limit.
        next_look = now + limit
        if poller is not None and not self._stopping():
            started = poller.call_started
            if started is not None and now - started > limit:
                self._tell(f"telegram_fence watchdog: getUpdates has not returned for {limit:.0f} s")
                self._on_stuck(f"watchdog: getUpdates has not returned for more than {limit:.0f} s")
                return now + prune_every
            if started is not None:
                next_look = started + limit + 0.01
        if now - self._last_prune >= prune_every:
            self._last_prune = now
            self.prune()
        return min(next_look, self._last_prune + prune_every)

    def prune(self) -> None:
        """Delete settled rows and delivered captures older than ``retention``, and next-step and reply handlers
        older than ``STEP_RETENTION``. Never raises (logged)."""
        store = self._store
        try:
            before = store.clock() - self._retention
        except Exception:
            self._log.warning("pruning failed: the store's clock raised", exc_info=True)
            return
        jobs: list[tuple[str, Callable[[], int]]] = [("finished updates", lambda: store.prune(before))]
        if self._conversations:
            steps_before = time.time() - STEP_RETENTION
            jobs.append(("next-step and reply handlers never taken", lambda: prune_steps(store, steps_before)))
        if self._captures:  # only a fence that captures loads the outbox
            from ..delivery.outbox import prune_delivered

            jobs.append(("delivered captures", lambda: prune_delivered(store, before)))
        for what, job in jobs:
            try:
                pruned = self._write(job)
                if pruned:
                    self._log.info("pruned %s", what, extra={"pruned": pruned})
            except Exception:
                self._log.warning("pruning %s failed", what, exc_info=True)

