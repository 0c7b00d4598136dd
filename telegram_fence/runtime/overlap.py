"""Overlap: the dispatcher runs committed claims inline while the store works on the next round.

One job: inline mode on a store with the split round (:class:`~telegram_fence.store.PipelinedUpdateStore`, the
PostgreSQL store). As soon as the poller's next batch is posted, between two inline handlers, the round that
settles what finished, records that batch and claims some of it is sent (``begin_round``); the handlers go on
running while the server works; once they are done the round's answer is read and its claims run next, and so on
while batches come. The updates of a chat whose claims are still to run here are claimed behind them (``held``),
so a chat's updates still run one after another, in order. May import ``store`` (types), ``runtime.attempt``,
``runtime.decisions``, ``runtime.guard``, ``runtime.handoff``, ``runtime.inline``, ``runtime.rounds``, ``errors`` and
the standard library. Logs as
``telegram_fence.overlap``.

The rules the durable path keeps: a claim runs only after the round that made it committed (its answer was
read); the poller's request is answered only then, so its next ``getUpdates`` confirms only a committed batch; a
round that fails stores nothing, its batch is failed (fetched again) and its finished attempts wait for the next
round. (A round whose connection failed as its answer was read may have committed all the same: the batch is then
found stored when fetched again, the settles are made again and count nothing, and the round's claims, never run
here, are taken again after their lease; nothing is lost or run twice.)

Thread safety: :meth:`Overlap.run` runs on the dispatcher thread; the round in flight belongs to the thread that
began it until it is taken (:meth:`Overlap.reclaim`: a new dispatcher after a hand-over), under one lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from ..errors import ConfigurationError
from ..records import Record
from ..store import PendingRound
from . import decisions
from .attempt import AttemptContext
from .guard import can_outlive
from .handoff import RecordRequest
from .inline import Inline
from .rounds import FetchSignal, RoundParts

__all__ = ["Overlap"]

log = logging.getLogger("telegram_fence.overlap")

#: How often (in runs) to wait for the poller's batch again once batches came too slowly to wait for.
PROBE_EVERY = 16
#: The ``record`` keywords a round can carry (a hook, ``on_record``, needs the synchronous record).
_CARRIED = frozenset({"skip", "generation", "body"})


class _InFlight(Record):
    """A round sent: the poller's request, the store's pending round, the attempts it settles, who began it."""

    __slots__ = ("finished", "pending", "request", "stamp", "thread")
    request: RecordRequest
    pending: PendingRound
    finished: list[AttemptContext]
    thread: threading.Thread
    stamp: int | None  # the conversations' stamp of a round that asks which chats converse

    def __init__(self, request: RecordRequest, pending: PendingRound, finished: list[AttemptContext],
                 thread: threading.Thread, stamp: int | None = None) -> None:
        object.__setattr__(self, "request", request)
        object.__setattr__(self, "pending", pending)
        object.__setattr__(self, "finished", finished)
        object.__setattr__(self, "thread", thread)
        object.__setattr__(self, "stamp", stamp)


class Overlap:
    """Inline runs overlapped with the next round (see the module docstring); owned by the dispatcher."""

    def __init__(self, parts: RoundParts, *, inline: Inline, fetch: FetchSignal) -> None:
        """``parts``: the dispatcher's (its store must have the split round, ``parts.store.pipelined``, else
        :class:`~telegram_fence.errors.ConfigurationError`); ``inline`` runs the claims; ``fetch``: the poller's
        word that it fetches (a round with a batch sent awaits its next fetch; its claims run once it was sent)."""
        pipelined = parts.store.pipelined
        if pipelined is None:
            raise ConfigurationError("an overlap needs a store with the split round (begin_round)")
        self._parts = parts
        self._seat = parts.seat
        self._mailbox = parts.mailbox
        self._pipelined = pipelined
        self._lease = parts.lease
        self._exchanger = parts.exchanger
        self._inline = inline
        self._fetch = fetch
        self._lock = threading.Lock()
        self._flight: _InFlight | None = None
        self._declined = False  # the store would not begin the waiting batch's round: the next round takes it
        # Whether the poller's batches come within BATCH_WAIT (a backlog at a near server): then the dispatcher waits
        # for the next one before it runs handlers, which would keep the poller from reading its answer (the
        # interpreter lock), and sends its round first. Tried again every PROBE_EVERY runs when they did not.
        self._fetches_fast = True
        self._runs = 0

    def run(self, contexts: list[AttemptContext]) -> bool:
        """Run ``contexts`` inline (as :meth:`Inline.run`) and, one after another, the claims of the rounds begun
        meanwhile; ``False`` once this thread is no longer the dispatcher. What is left in ``contexts`` is for the
        workers (at most one per chat)."""
        self._declined = False
        batch = contexts
        while True:
            self._await_batch(batch)
            seated = self._inline.run(batch, between=self._between)
            # A thread demoted while its handler stalled leaves its round to the new dispatcher (its reclaim() takes
            # it): ending it here would touch the exchanger's dicts, which only the dispatcher's thread may use.
            flight = self._take(threading.current_thread()) if seated else None
            if flight is None:
                return self._left(contexts, batch, seated)
            claims = self._end(flight)
            if batch:
                # Cut short: a chat with an attempt not run here keeps it first; claims behind it are handed back.
                busy = {c.chat_id for c in batch}
                keep = [c for c in claims if c.chat_id is None or c.chat_id not in busy]
                self._exchanger.hand_back([c for c in claims if c not in keep])
                batch.extend(self._exchanger.one_per_chat(keep))
                return self._left(contexts, batch, seated)
            if not claims:
                return True
            self._fetch.wait()
            batch = claims

    @staticmethod
    def _left(contexts: list[AttemptContext], batch: list[AttemptContext], seated: bool) -> bool:
        if batch is not contexts:
            contexts.extend(batch)
        return seated

    def reclaim(self) -> None:
        """On a (new) dispatcher: read the round a former dispatcher began and could not end (it is stuck in a
        handler, or came back from it after the hand-over and left the round here): its request is answered, its
        claims handed back (their chats' earlier claims went elsewhere)."""
        if self._flight is None:  # (read without the lock: a round in flight is taken under it)
            return
        me = threading.current_thread()
        with self._lock:
            flight = self._flight
            if flight is None or flight.thread is me:
                return
            self._flight = None
        self._exchanger.hand_back(self._end(flight))

    def _take(self, me: threading.Thread) -> _InFlight | None:
        with self._lock:
            flight = self._flight
            if flight is None or flight.thread is not me:
                return None
            self._flight = None
            return flight

    def _await_batch(self, batch: list[AttemptContext]) -> None:
        """Before a run: when batches come fast, wait (at most ``BATCH_WAIT``) for the poller's next one and send
        its round, so the server works on it while the handlers run."""
        self._runs += 1
        if self._flight is not None or not self._fetch.pending():  # (no fetch in flight: the poller has no room)
            return
        if not (self._fetches_fast or self._runs % PROBE_EVERY == 0):
            return
        self._fetches_fast = self._mailbox.wait_for_batch(decisions.BATCH_WAIT)
        self._begin(lambda: batch)

    def _between(self) -> None:
        """Between two inline handlers: the claims not started yet are held."""
        self._begin(self._seat.unstarted)

    def _begin(self, held: Callable[[], Sequence[AttemptContext]]) -> None:
        """Send the next round when the poller's batch is waiting and none is in flight; ``held()``: the claims that
        run here before any claim of that round."""
        if self._flight is not None or self._declined:
            return
        taken = self._mailbox.take_batch()
        if taken is None:
            return
        request, finished, room = taken
        if not _CARRIED.issuperset(request.kwargs):
            self._decline(request, finished)
            return
        self._fetch.sent()
        reads = self._parts.reads
        stamp = None if reads is None else reads.open_round()  # (before the send: changes from now on void it)
        try:
            pending = self._pipelined.begin_round(
                [ctx.identity for ctx in finished], request.updates, request.next_offset, lease=self._lease,
                limit=max(0, room), run=decisions.INLINE_RUN, held=[ctx.identity for ctx in held()],
                conversations=stamp is not None, **request.kwargs,
            )
        except Exception as exc:  # nothing was sent: the batch is fetched again, the attempts wait for a round
            self._failed(request, finished, exc, "could not begin a round; its batch is fetched again")
            return
        if pending is None:
            self._decline(request, finished)
            return
        with self._lock:
            self._flight = _InFlight(request, pending, finished, threading.current_thread(), stamp)

    def _failed(self, request: RecordRequest, finished: list[AttemptContext], exc: Exception, what: str) -> None:
        """A round that stored nothing: ``finished`` waits for a later round, ``request`` is answered with ``exc``
        (its batch is fetched again) and ``what`` is logged; ``exc`` is raised again when the dispatcher cannot
        outlive it."""
        self._mailbox.give_back(finished)
        request.fail(exc)
        request.finish()
        if not can_outlive(exc):
            raise exc
        log.error(what, exc_info=exc)

    def _decline(self, request: RecordRequest, finished: list[AttemptContext]) -> None:
        self._declined = True
        self._mailbox.put_back(request, finished)

    def _end(self, flight: _InFlight) -> list[AttemptContext]:
        """Read ``flight``'s answer: answer its request, note what it settled and where work may be; its claims,
        held by the pool (``[]`` when it failed: nothing of it was stored)."""
        request, finished = flight.request, flight.finished
        try:
            outcome = flight.pending.result()
        except Exception as exc:
            self._failed(request, finished, exc, "a round failed; its batch is fetched again")
            return []
        self._exchanger.settled(finished, outcome.settled)
        self._mailbox.hint_freed(finished)
        if outcome.refused is not None:
            request.fail(outcome.refused)
        else:
            request.keep(outcome.new)
            self._parts.carried.offer(outcome.backlog, outcome.cursor)  # (before the poller wakes)
        request.finish()
        if finished:
            self._parts.on_progress()
        claims = outcome.claims
        if outcome.refused is None:
            self._exchanger.recorded(request.updates, request.kwargs.get("skip", ()), claims, outcome.new)
            if claims:
                self._mailbox.unhint(c.chat_id for c in claims)
        return self._parts.adopt(claims, None if flight.stamp is None else (flight.stamp, outcome.conversing))
