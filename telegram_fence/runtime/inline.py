"""Inline mode: the dispatcher runs fast handlers itself, and hands its job over when one of them stalls.

One job: running a round's claims on the dispatcher thread (in order, within a time budget) and the
handover: when an inline handler runs past ``INLINE_STALL`` the heartbeat starts a new dispatcher,
and the stuck thread becomes a worker for that one attempt. May import ``runtime.attempt``,
``runtime.decisions``, ``runtime.exchange``, ``runtime.state`` and the standard library.
Logs as ``telegram_fence.inline``.

Thread safety: :meth:`Inline.run` runs on a dispatcher thread, :meth:`Inline.hand_over` on the
heartbeat's; they meet only under the pool's lock (``state.dispatcher`` says which thread is the
dispatcher).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from . import decisions
from .attempt import AttemptContext, error_line
from .exchange import Exchanger
from .state import PoolState, Slot

__all__ = ["Inline"]

log = logging.getLogger("telegram_fence.inline")


class Inline:
    """Runs claims on the dispatcher thread; owned by the dispatcher."""

    def __init__(
        self,
        state: PoolState,
        *,
        attempt: Callable[[AttemptContext], str],
        exchanger: Exchanger,
        make_dispatcher: Callable[[], threading.Thread],
    ) -> None:
        self._state = state
        self._attempt = attempt
        self._exchanger = exchanger
        self._make_dispatcher = make_dispatcher

    def run(self, contexts: list[AttemptContext]) -> bool:
        """Run ``contexts`` on this (the dispatcher's) thread, in order; ``False`` once it is no longer the
        dispatcher (a handler stalled and the heartbeat handed the job to a new thread).

        What it does not run (out of budget, handlers no longer fast, stopping) is left in
        ``contexts`` for the workers, at most one per chat; further updates of a chat are handed back.
        """
        state = self._state
        me = threading.current_thread()
        deadline = time.monotonic() + decisions.INLINE_BUDGET
        with state.lock:
            state.inline.extend(contexts)
            state.holding()
        contexts.clear()
        while True:
            with state.lock:
                if state.dispatcher is not me:
                    return False
                if not state.inline:
                    return True
                if state.stop.is_set() or not state.inline_mode() or time.monotonic() > deadline:
                    leftover = list(state.inline)
                    state.inline.clear()
                    break
                ctx = state.inline.popleft()
                ctx.started = time.monotonic()
                state.inline_current = ctx
                state.heartbeat_by(ctx.started + decisions.INLINE_STALL)  # armed only while one runs
            outcome = self._attempt(ctx)
            elapsed = time.monotonic() - ctx.started
            with state.lock:
                demoted = state.dispatcher is not me
                if demoted:
                    slot = state.slots.get(me)
                    if slot is not None and not slot.abandoned:
                        slot.current = None
                        state.running -= 1
                else:
                    state.inline_current = None
                state.measured(elapsed)
                state.done(ctx, outcome, time.monotonic())
                if demoted:
                    return False
        contexts.extend(self._exchanger.one_per_chat(leftover))
        return True

    def hand_over(self, now: float) -> None:
        """Heartbeat: when the dispatcher is stuck in an inline handler, start a new dispatcher.

        The stuck thread becomes a worker for that one attempt (renewed, and timed out by
        ``handler_timeout`` like any other) and ends after it; the claims it had not started go to
        the workers (one per chat, the rest handed back); handlers count as slow from now on.
        """
        state = self._state
        with state.lock:
            ctx = state.inline_current
            old = state.dispatcher
            if ctx is None or old is None or not decisions.stalled(ctx.started, now):
                return
            assert ctx.started is not None
            state.slots[old] = Slot(current=ctx, demoted=True)
            state.running += 1
            state.inline_current = None
            busy = {ctx.chat_id}
            leftover = list(state.inline)
            state.inline.clear()
            state.handler_time = max(state.handler_time, now - ctx.started)
            new = self._make_dispatcher()
            state.dispatcher = new
            state.retired.append(old)
            state.counts["handovers"] += 1
        log.warning("a handler has run on the dispatcher for %.1f s; a new dispatcher takes over", now - ctx.started,
                    extra={"update_id": ctx.update_id, "attempt": ctx.attempt})
        queued = []
        for kept in self._exchanger.one_per_chat(leftover):
            if kept.chat_id is not None and kept.chat_id in busy:
                self._exchanger.hand_back(kept)
            else:
                queued.append(kept)
        state.enqueue(queued)
        try:
            new.start()
        except Exception as exc:  # no thread could be started: nothing would claim or settle any more
            log.critical("could not start a new dispatcher", exc_info=True)
            state.on_fatal(f"fence-heartbeat: could not start a new dispatcher: {error_line(exc)}")
