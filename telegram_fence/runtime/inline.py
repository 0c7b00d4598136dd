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

        The run is one frame, not one per update: the attempts' outcomes are kept in the seat and filed to the
        mailbox once, when the run ends (or before each ``between()``; a hand-over takes those of a run cut short
        by a stalled handler), the handlers' times are folded into the pool's measure once, and the heartbeat's
        alarm is armed only when it does not know the stall deadline of the handler starting (see
        :meth:`Seat.step`). The decision to go on (budget, stop, handlers still fast) is taken before each
        attempt, on the times measured so far in this run: the clipped average that decides inline mode
        (``decisions.typical``) is folded only from the first handler of the run that took longer than ``INLINE_MAX`` on
        (an average of times no longer than that, starting from one that allows inline mode, still allows it).
        """
        state, seat, mailbox = self._state, self._seat, self._mailbox
        attempt, stop, clock = self._attempt, state.stop, time.monotonic
        me = threading.current_thread()
        deadline = clock() + decisions.INLINE_BUDGET
        typical = start_typical = state.handler_time.typical()
        fast, exact = decisions.INLINE_MAX, False
        elapsed: list[float] = []
        seat.load(contexts)
        contexts.clear()
        done: AttemptContext | None = None
        outcome, now = "", 0.0
        seated = True
        try:
            while True:
                if done is not None and between is not None:
                    seated = seat.finished(me, done, outcome, now)
                    if not seated:
                        return self._demoted(done, outcome, now, elapsed)
                    done = None
                    mailbox.file_many(seat.take_done())
                    between()
                go_on = not stop.is_set() and decisions.inline_mode(typical) and clock() <= deadline
                ctx, leftover, seated, poke = seat.step(me, done, outcome, now, go_on)
                if not seated:
                    return self._demoted(done, outcome, now, elapsed) if done is not None else False
                if ctx is None:
                    break
                started = ctx.started
                assert started is not None
                if poke:
                    state.alarm.by(started + decisions.INLINE_STALL)  # the heartbeat wakes if this one stalls
                outcome = attempt(ctx)
                now = clock()
                took = now - started
                elapsed.append(took)
                if outcome in ("retried", "lost"):  # the chat's later updates wait behind this one (in the store)
                    self._exchanger.hand_back(seat.withdraw_chat(ctx.chat_id))
                if exact:
                    typical = decisions.typical(typical, took)
                elif took > fast:  # only a handler slower than inline mode allows can end it (see the docstring)
                    exact = True  # from now on folded after each one
                    typical = start_typical
                    for seconds in elapsed:
                        typical = decisions.typical(typical, seconds)
                done = ctx
        finally:
            if elapsed:
                state.handler_time.fold(elapsed)
            if seated:  # (a demoted thread's were taken by the hand-over; the seat's list is the new dispatcher's)
                mailbox.file_many(seat.take_done())
        contexts.extend(self._exchanger.one_per_chat(leftover))
        return True

    def _demoted(self, done: AttemptContext, outcome: str, now: float, elapsed: list[float]) -> bool:
        """This thread was demoted while ``done`` ran (it stalled): the attempts before it went with the hand-over,
        their times are dropped (the hand-over counted handlers as slow), ``done`` is measured and filed here."""
        state = self._state
        state.handler_time.measured(elapsed.pop())
        elapsed.clear()
        self._mailbox.file(done, outcome, now)
        state.alarm.by(now)  # a former dispatcher's attempt ended: the heartbeat looks (a stopped pool ends)
        return False

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
        self._mailbox.file_many(done.done)  # finished before the stall: settled by the new dispatcher
        kept = self._exchanger.one_per_chat(done.leftover)
        self._exchanger.hand_back([k for k in kept if k.chat_id is not None and k.chat_id == ctx.chat_id])
        state.queue.put([k for k in kept if k.chat_id is None or k.chat_id != ctx.chat_id])
