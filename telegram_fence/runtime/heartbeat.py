"""The heartbeat: keeps the pool's leases, takes updates away from handlers past ``handler_timeout``.

One job: the ``fence-heartbeat`` thread. It renews every lease the pool holds, sets ``owner_lost`` on
attempts whose lease could not be kept, takes an update away from a handler that ran past
``handler_timeout`` (starting a replacement worker, so the pool keeps its capacity), asks inline mode
to hand the dispatcher's job over when an inline handler stalls, and calls the fence's supervisor
tick. May import ``runtime.attempt``, ``runtime.decisions``, ``runtime.guard``, ``runtime.state`` and the
standard library. Logs as ``telegram_fence.workers``.

Thread safety: :meth:`Heartbeat.loop` runs on its own thread; shared state is touched under the
pool's lock; the store calls it makes are thread-safe store calls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from . import decisions
from .attempt import AttemptContext, error_line, log_extra
from .guard import can_outlive, guarded
from .state import PoolState

__all__ = ["Heartbeat"]

log = logging.getLogger("telegram_fence.workers")


class Heartbeat:
    """The ``fence-heartbeat`` thread's work; owned by the pool."""

    def __init__(
        self,
        state: PoolState,
        *,
        store: Any,
        lease: float,
        handler_timeout: float,
        hand_over: Callable[[float], None],
        spawn: Callable[[], None],
        wake: Callable[[], None],
        on_tick: Callable[[], None],
    ) -> None:
        self._state = state
        self._store = store
        self._lease = lease
        self._handler_timeout = handler_timeout
        self._hand_over = hand_over
        self._spawn = spawn
        self._wake = wake
        self._on_tick = on_tick
        self._clock: Callable[[], float] = getattr(store, "clock", time.time)
        self._renew_many = getattr(store, "renew_many", None)
        self._release = getattr(store, "release", None)

    def thread(self) -> threading.Thread:
        """A new (unstarted) heartbeat thread."""
        return threading.Thread(target=guarded(self.loop, self._state.on_fatal), name="fence-heartbeat", daemon=True)

    def loop(self) -> None:
        """The heartbeat thread: beat every ``beat_interval(lease)`` until the pool's ``hb_stop`` is set."""
        interval = decisions.beat_interval(self._lease)
        next_beat = time.monotonic() + interval
        while True:
            # Wake often enough to see an inline handler stall (a lock and a comparison per wake-up):
            # inline mode may begin at any moment, so the shorter wait applies always.
            wait = min(next_beat - time.monotonic(), decisions.INLINE_STALL / 2)
            if self._state.hb_stop.wait(max(0.0, wait)):
                return
            now = time.monotonic()
            try:
                self._hand_over(now)
            except Exception:
                log.error("handing the dispatcher over failed", exc_info=True)
            if now < next_beat:
                continue
            next_beat = now + interval
            for step in (self._renew, self._check_timeouts):
                try:
                    step()
                except Exception as exc:
                    if not can_outlive(exc):
                        raise
                    log.error("heartbeat failed", exc_info=True)
            try:
                self._on_tick()
            except Exception:
                log.error("supervisor tick failed", exc_info=True)

    def _renew(self) -> None:
        state = self._state
        with state.work_cv:
            contexts = state.live()
        if not contexts:
            return
        identities = [ctx.identity for ctx in contexts]
        now = self._clock()
        try:
            if self._renew_many is not None:
                kept = self._renew_many(identities, self._lease)
            else:
                kept = {i for i in identities if self._store.renew_owned(i, self._lease)}
        except Exception:
            log.error("renewing leases failed", exc_info=True)
            for ctx in contexts:
                if now >= ctx.lease_until:
                    ctx.owner_lost.set()
            return
        missing = [ctx for ctx in contexts if ctx.identity not in kept]
        for ctx in contexts:
            if ctx.identity in kept:
                ctx.lease_until = now + self._lease
        if not missing:
            return
        with state.work_cv:
            # Settled by the dispatcher since the snapshot: done, not lost.
            still_held = {id(ctx) for ctx in state.live()}
        lost = set()
        for ctx in missing:
            if id(ctx) not in still_held:
                continue
            if not ctx.lost:
                log.warning("lease lost", extra={"update_id": ctx.update_id, "attempt": ctx.attempt,
                                                 "claim_id": ctx.identity.claim_id})
            ctx.owner_lost.set()
            lost.add(ctx.identity)
        if lost:
            with state.work_cv:
                state.queue = deque(c for c in state.queue if c.identity not in lost)
                state.finished = [c for c in state.finished if c.identity not in lost]

    def _check_timeouts(self) -> None:
        state = self._state
        now = time.monotonic()
        stuck: list[tuple[AttemptContext, bool]] = []
        with state.work_cv:
            for slot in state.slots.values():
                ctx = slot.current
                if slot.abandoned or ctx is None or not decisions.timed_out(ctx.started, now, self._handler_timeout):
                    continue
                slot.abandoned = True
                state.running -= 1
                stuck.append((ctx, slot.demoted))
        for ctx, demoted in stuck:
            state.count("timeouts")
            ctx.owner_lost.set()
            log.error("handler exceeded handler_timeout; its update is taken away and a new worker started",
                      extra={"update_id": ctx.update_id, "attempt": ctx.attempt, "claim_id": ctx.identity.claim_id,
                             "handler_timeout": self._handler_timeout})
            # The slot is abandoned already: its replacement must not depend on the store answering.
            if not state.stop.is_set() and not demoted:  # a former dispatcher was not a worker
                try:
                    self._spawn()
                except Exception as exc:  # no thread could be started: the pool cannot keep its capacity
                    log.critical("could not start a replacement worker", exc_info=True)
                    state.on_fatal(f"fence-heartbeat: could not start a replacement worker: {error_line(exc)}")
            self._end_lease(ctx)
        if stuck:
            self._wake()

    def _end_lease(self, ctx: AttemptContext) -> None:
        """End a timed-out attempt's lease now (its later writes are refused); never raises.

        When the store cannot, the lease is no longer renewed, so it lapses within ``lease``.
        """
        if self._release is None:
            return
        try:
            self._release(ctx.identity, attempt_counts=True)
        except Exception:
            log.warning("could not end the lease of a timed-out handler; its update is taken again once the lease "
                        "lapses", exc_info=True, extra=log_extra(ctx))
