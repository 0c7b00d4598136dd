"""Inline mode: the dispatcher runs fast handlers itself, and hands its job over when one of them stalls.

One job: running a round's claims on the dispatcher thread (in order, within a time budget) and the
handover: when an inline handler runs past ``INLINE_STALL`` the heartbeat starts a new dispatcher,
and the stuck thread becomes a worker for that one attempt. May import ``runtime.attempt``,
``runtime.decisions``, ``runtime.exchange``, ``runtime.mailbox``, ``runtime.seat``, ``runtime.state`` and
the standard library.
Logs as ``telegram_fence.inline``.

Thread safety: :meth:`Inline.run` runs on a dispatcher thread, :meth:`Inline.hand_over` on the
heartbeat's; they meet only in the seat (``runtime.seat``), which says which thread is the dispatcher.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from . import decisions
from .attempt import AttemptContext, error_line
from .exchange import Exchanger
from .mailbox import Mailbox
from .seat import Seat
from .state import PoolState

__all__ = ["Inline"]

log = logging.getLogger("telegram_fence.inline")


class Inline:
    """Runs claims on the dispatcher thread; owned by the dispatcher."""

    def __init__(
        self,
        state: PoolState,
        *,
        seat: Seat,
        mailbox: Mailbox,
        attempt: Callable[[AttemptContext], str],
        exchanger: Exchanger,
        make_dispatcher: Callable[[], threading.Thread],
    ) -> None:
        self._state = state
        self._seat = seat
        self._mailbox = mailbox
        self._attempt = attempt
        self._exchanger = exchanger
        self._make_dispatcher = make_dispatcher

    def run(self, contexts: list[AttemptContext], between: Callable[[], None] | None = None) -> bool:
        """Run ``contexts`` on this (the dispatcher's) thread, in order; ``False`` once it is no longer the
        dispatcher (a handler stalled and the heartbeat handed the job to a new thread). ``between()`` is called
        after each attempt was filed, while this thread is still the dispatcher (it must not raise).

        What it does not run (out of budget, handlers no longer fast, stopping) is left in
        ``contexts`` for the workers, at most one per chat; further updates of a chat are handed back.
        ``contexts`` are held in the pool's leases already.
        """
        state, seat = self._state, self._seat
        me = threading.current_thread()
        deadline = time.monotonic() + decisions.INLINE_BUDGET

        def go_on() -> bool:
            return not state.stop.is_set() and state.handler_time.inline_mode() and time.monotonic() <= deadline

        seat.load(contexts)
        contexts.clear()
        while True:
            ctx, leftover, seated = seat.next(me, go_on)
            if not seated:
                return False
            if ctx is None:
                break
            assert ctx.started is not None
            state.alarm.by(ctx.started + decisions.INLINE_STALL)  # armed only while one runs
            outcome = self._attempt(ctx)
            now = time.monotonic()
            state.handler_time.measured(now - ctx.started)
            seated = seat.finish(me)
            self._mailbox.file(ctx, outcome, now)
            if not seated:
                state.alarm.by(now)  # a former dispatcher's attempt ended: the heartbeat looks (a stopped pool ends)
                return False
            if between is not None:
                between()
        contexts.extend(self._exchanger.one_per_chat(leftover))
        return True

    def hand_over(self, now: float) -> None:
        """Heartbeat: when the dispatcher is stuck in an inline handler, start a new dispatcher.

        The stuck thread becomes a worker for that one attempt (renewed, and timed out by
        ``handler_timeout`` like any other) and ends after it; the claims it had not started go to
        the workers (one per chat, the rest handed back); handlers count as slow from now on.
        """
        state = self._state
        done = self._seat.hand_over(now, self._make_dispatcher)
        if done is None:
            return
        ctx = done.stuck
        assert ctx.started is not None
        state.handler_time.at_least(now - ctx.started)
        state.counters.add("handovers")
        log.warning("a handler has run on the dispatcher for %.1f s; a new dispatcher takes over", now - ctx.started,
                    extra={"update_id": ctx.update_id, "attempt": ctx.attempt})
        try:
            done.new.start()  # first: the hand-backs below are its writes
        except Exception as exc:  # no thread could be started: nothing would claim or settle any more
            log.critical("could not start a new dispatcher", exc_info=True)
            state.on_fatal(f"fence-heartbeat: could not start a new dispatcher: {error_line(exc)}")
        kept = self._exchanger.one_per_chat(done.leftover)
        self._exchanger.hand_back([k for k in kept if k.chat_id is not None and k.chat_id == ctx.chat_id])
        state.queue.put([k for k in kept if k.chat_id is None or k.chat_id != ctx.chat_id])
