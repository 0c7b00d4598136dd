"""The dispatcher's seat: which thread is the dispatcher now, and the inline claims it runs itself.

One job: who holds the dispatcher's job (a stuck dispatcher hands it to a new thread and is retired),
the claims inline mode has not started yet and the one it is running, and the hand-over between the
two threads. May import ``runtime.attempt``, ``runtime.decisions``, ``runtime.state`` and the standard
library.

Thread safety: one lock (``_lock``) guards it, taken by the methods; while it is held the seat calls
:class:`~telegram_fence.runtime.state.Slots` (a former dispatcher becomes a worker), never the other way.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from ..records import Record
from . import decisions
from .attempt import AttemptContext
from .state import Slots

__all__ = ["HandOver", "Seat"]


class HandOver(Record):
    """A hand-over done by :meth:`Seat.hand_over`: the stuck attempt, the old and the new dispatcher thread,
    the claims the old one had not started, and the attempts it had finished but not filed yet (``done``:
    ``(context, outcome, when)`` each, for the mailbox)."""

    __slots__ = ("done", "leftover", "new", "old", "stuck")
    stuck: AttemptContext
    old: threading.Thread
    new: threading.Thread
    leftover: list[AttemptContext]
    done: list[tuple[AttemptContext, str, float]]

    def __init__(self, stuck: AttemptContext, old: threading.Thread, new: threading.Thread,
                 leftover: list[AttemptContext], done: list[tuple[AttemptContext, str, float]] | None = None) -> None:
        object.__setattr__(self, "stuck", stuck)
        object.__setattr__(self, "old", old)
        object.__setattr__(self, "new", new)
        object.__setattr__(self, "leftover", leftover)
        object.__setattr__(self, "done", [] if done is None else done)


class Seat:
    """Which thread is the dispatcher, and what it runs inline (see the module docstring)."""

    def __init__(self, slots: Slots) -> None:
        self._lock = threading.Lock()
        self._slots = slots
        self._holder: threading.Thread | None = None
        self._retired: list[threading.Thread] = []
        self._pending: deque[AttemptContext] = deque()
        self._current: AttemptContext | None = None
        #: inline attempts finished and not filed yet: ``(context, outcome, when)``, filed once per run
        self._done: list[tuple[AttemptContext, str, float]] = []
        #: the heartbeat looked while no inline handler ran: the next one to start must arm its alarm
        self._poke = True

    def seat(self, thread: threading.Thread) -> None:
        """Make ``thread`` the (first) dispatcher."""
        with self._lock:
            self._holder = thread

    def holder(self) -> threading.Thread | None:
        """The dispatcher thread now."""
        with self._lock:
            return self._holder

    def everyone(self) -> list[threading.Thread]:
        """The dispatcher and every former one (to join)."""
        with self._lock:
            return [t for t in (self._holder, *self._retired) if t is not None]

    def load(self, contexts: list[AttemptContext]) -> None:
        """Claims for the dispatcher to run itself, in order."""
        with self._lock:
            self._pending.extend(contexts)

    def withdraw_chat(self, chat_id: int | None) -> list[AttemptContext]:
        """Take the unstarted claims of ``chat_id`` out of the run (none for ``None``: a chatless update is its own
        line), in order: an earlier update of the chat did not settle, so they must not run before it does."""
        if chat_id is None:
            return []
        with self._lock:
            taken = [ctx for ctx in self._pending if ctx.chat_id == chat_id]
            if taken:
                self._pending = deque(ctx for ctx in self._pending if ctx.chat_id != chat_id)
            return taken

    def unstarted(self) -> list[AttemptContext]:
        """The inline claims loaded and not started yet, in the order they will run."""
        with self._lock:
            return list(self._pending)

    def step(
        self, me: threading.Thread, done: AttemptContext | None, outcome: str, when: float, go_on: bool
    ) -> tuple[AttemptContext | None, list[AttemptContext], bool, bool]:
        """One step of ``me``'s inline run, under one lock: file ``done`` (the attempt ``me`` just ran, ``None`` at
        the start of a run) as finished with ``outcome`` at ``when``, then take the next claim.

        Returns ``(ctx, [], True, poke)`` with the claim to run (begun now: ``ctx.started`` set); else ``(None,
        leftover, seated, False)``: nothing left, or (``go_on`` false) the unstarted claims for the workers.
        ``seated`` is ``False`` once ``me`` is no longer the dispatcher; ``done`` is then not kept here (the
        caller files it; the attempts finished before the demotion went with the hand-over). ``poke``: the
        heartbeat looked while no inline handler ran, so it does not know this one's stall deadline: the caller
        arms the alarm (``ctx.started + INLINE_STALL``)."""
        with self._lock:
            if done is not None and not self._keep(me, done, outcome, when):
                return None, [], False, False
            if self._holder is not me:
                return None, [], False, False
            if not self._pending:
                return None, [], True, False
            if not go_on:
                leftover = list(self._pending)
                self._pending.clear()
                return None, leftover, True, False
            ctx = self._pending.popleft()
            ctx.begin_run()
            self._current = ctx
            poke, self._poke = self._poke, False
            return ctx, [], True, poke

    def finished(self, me: threading.Thread, done: AttemptContext, outcome: str, when: float) -> bool:
        """``me``'s inline attempt ``done`` returned: kept to be filed (as in :meth:`step`); ``False`` when ``me``
        was demoted meanwhile (it must end, and file ``done`` itself)."""
        with self._lock:
            return self._keep(me, done, outcome, when)

    def _keep(self, me: threading.Thread, done: AttemptContext, outcome: str, when: float) -> bool:
        if self._holder is not me:
            self._slots.end_adopted(me)
            return False
        self._current = None
        self._done.append((done, outcome, when))
        return True

    def take_done(self) -> list[tuple[AttemptContext, str, float]]:
        """The inline attempts finished and not filed yet (see :meth:`step`), in the order they ran; cleared."""
        with self._lock:
            done, self._done = self._done, []
            return done

    def stall_deadline(self) -> float | None:
        """When the inline handler running now counts as stalled (monotonic), ``None`` when none runs."""
        with self._lock:
            ctx = self._current
            if ctx is None or ctx.started is None:
                self._poke = True  # the next inline handler to start arms the alarm itself
                return None
            return ctx.started + decisions.INLINE_STALL

    def hand_over(self, now: float, make: Callable[[], threading.Thread]) -> HandOver | None:
        """When the running inline handler stalled: seat ``make()`` (unstarted) as the dispatcher, the stuck
        thread becomes a worker for that attempt (see :meth:`Slots.adopt`); ``None`` when nothing stalled."""
        with self._lock:
            ctx, old = self._current, self._holder
            if ctx is None or old is None or not decisions.stalled(ctx.started, now):
                return None
            self._slots.adopt(old, ctx)
            self._current = None
            leftover = list(self._pending)
            self._pending.clear()
            done, self._done = self._done, []
            self._poke = True
            new = make()
            self._holder = new
            self._retired.append(old)
            return HandOver(ctx, old, new, leftover, done)
