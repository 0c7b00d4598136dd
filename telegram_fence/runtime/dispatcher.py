"""The dispatcher: one thread that records the poller's batches and runs the pool's settle-and-claim rounds.

One job: the ``fence-dispatcher`` loop. In a single transaction per round it records the poller's
batch (handed over by :meth:`Dispatcher.record`), settles every update whose handler returned since
the last round and claims due updates for the workers about to be free (or, in inline mode, runs
them itself through :class:`~telegram_fence.runtime.inline.Inline`). So the store's write lock is
taken by one thread, and a transaction covers many updates. An update is acknowledged only after its
handler returned. May import ``retry``, ``store`` (types), ``runtime.attempt``, ``runtime.decisions``,
``runtime.guard``, ``runtime.handoff``, ``runtime.inline``, ``runtime.rounds`` (the parts it
works with), ``runtime.workers`` and the standard library. Logs as ``telegram_fence.dispatcher``.

Thread safety: :meth:`Dispatcher.fetching` is called on the poller's thread; :meth:`Dispatcher.loop`
runs on the (current) dispatcher thread, the one writer: the others reach it through
:class:`~telegram_fence.runtime.writer.Writer`, which posts to its mailbox; :meth:`Dispatcher.final_flush`
runs in its last round (or on the joining thread when no dispatcher ran). It reaches the other threads only through the
mailbox, the seat and the pool's parts (``runtime.state``), each thread-safe on its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from ..retry import exponential
from ..store import Claim
from . import decisions
from .attempt import AttemptContext
from .guard import can_outlive, guarded
from .handoff import PulledRecord, RecordRequest, Writes, sealed
from .inline import Inline
from .rounds import FetchSignal, RoundParts
from .workers import Workers

__all__ = ["Dispatcher"]

log = logging.getLogger("telegram_fence.dispatcher")


class Dispatcher:
    """The ``fence-dispatcher`` thread's work; owned by the pool."""

    def __init__(self, parts: RoundParts, *, workers: Workers) -> None:
        """``parts``: what the rounds work with (see :class:`~telegram_fence.runtime.rounds.RoundParts`, whose
        ``on_claimed`` is told each round's new attempts before any of them begins); ``workers``: whose
        ``attempt`` runs a claim inline."""
        self._parts = parts
        self._state = parts.state
        self._mailbox = parts.mailbox
        self._caps = parts.store
        self._store = parts.store.store
        self._lease = parts.lease
        self._exchanger = parts.exchanger
        self._fetch = FetchSignal()
        self._hooked = False  # a round took a webhook group (dispatcher thread only)
        self._flushed = threading.Event()  # final_flush ran (on the dispatcher's last round, or the joining thread)
        self.inline = Inline(parts.state, seat=parts.seat, mailbox=parts.mailbox, attempt=workers.attempt,
                             exchanger=parts.exchanger, make_dispatcher=self.thread)

    def thread(self) -> threading.Thread:
        """A new (unstarted) dispatcher thread."""
        return threading.Thread(target=guarded(self.loop, self._state.on_fatal), name="fence-dispatcher", daemon=True)

    # --- the poller's hand-off --------------------------------------------------------------------

    def fetching(self) -> None:
        """The poller is about to call ``getUpdates`` (called on the poller's thread)."""
        self._fetch.fetching()

    def _serve_record(self, request: RecordRequest, claim: int = 0, run: int = decisions.INLINE_RUN) -> list[Claim]:
        """Record the poller's batch (dispatcher thread); an error is kept for the poller, not raised.

        With ``claim`` > 0 (and a store that can) up to that many of the new updates are claimed as
        they are stored (see ``record_and_claim``; up to ``run`` of a chat) and returned. Does not ``finish`` the
        request: when the write joins a round's transaction, the batch is recorded only once that transaction
        committed.
        """
        claims: list[Claim] = []
        batched = self._caps.batched
        try:
            if claim > 0 and batched is not None:
                result, claims = batched.record_and_claim(
                    request.updates, request.next_offset, lease=self._lease, limit=claim, run=run,
                    **request.kwargs,
                )
            else:
                result = int(self._store.record(request.updates, request.next_offset, **request.kwargs))
        except Exception as exc:
            request.fail(exc)
            return []
        request.keep(result)
        if claims:  # claimed as they were stored: their chats had nothing open (see Mailbox.claimed_fresh)
            self._mailbox.claimed_fresh(c.chat_id for c in claims)
        self._exchanger.recorded(request.updates, request.kwargs.get("skip", ()), claims, result)
        return claims

    # --- rounds -----------------------------------------------------------------------------------

    def _scan_period(self, idle: bool) -> float:
        """How long the waiting dispatcher may go without a full scan (longer while the pool holds nothing)."""
        return decisions.idle_scan_interval(self._lease) if idle else decisions.scan_interval(self._lease)

    def loop(self) -> None:
        """The dispatcher thread: wait for work, run rounds, until the writer closes or this thread hands over.

        Each round runs the other threads' writes (:class:`~telegram_fence.runtime.handoff.WriteRequest`), records
        the batches, settles and claims in one transaction (see :meth:`round`). Once the pool stops it claims
        nothing but goes on writing and settling; the writer's last round (the mailbox closed) settles what
        finished and hands back what never started.
        """
        state, mailbox = self._state, self._mailbox
        more_due = True
        failures = 0  # consecutive failed rounds
        while True:
            work = mailbox.next_round(more_due, self._scan_period)
            writes = Writes(work.writes)
            # The webhook's groups are taken (sealed) only inside the round, after its settle and claim: what arrives
            # meanwhile joins them, and a delivery waits for the insert and the commit only.
            late = [r for r in work.requests if type(r) is PulledRecord] if not work.closing else []
            requests = sealed([r for r in work.requests if type(r) is not PulledRecord] if late else work.requests)
            finished, room = work.finished, work.room
            more_due = work.more_due
            if requests:
                self._fetch.sent()
            if work.closing:  # the last round: each on its own, as it comes (nothing to gain from joining them)
                writes.alone()
                for request in requests:
                    self._serve_record(request)
                    request.finish()
                self.final_flush(finished)
                return
            if not finished and room <= 0:
                # Only writes or batches to record: nothing to settle or claim (one transaction for them all).
                try:
                    self.round(requests, [], 0, writes=writes, late=late)
                except Exception as exc:  # its writes and batches were answered (failed, or done on their own)
                    if not can_outlive(exc):
                        raise
                    log.error("recording failed", exc_info=True)
                continue
            # Fast handlers run here, in runs of a chat, behind either door (not on a host that only claims what others
            # record). Behind the webhook this beats the workers (docs/benchmarks.md, hookapp): the next group waits
            # for the handlers (microseconds each), but no worker thread then competes for the interpreter lock
            # with the request threads and this one's statements.
            self._hooked = self._hooked or bool(late)
            runs = (not work.stopping and (self._hooked or self._fetch.polling)
                    and state.handler_time.inline_mode())
            try:
                claims, more_due = self.round(requests, finished, max(0, room), runs, writes, late)
            except Exception as exc:
                mailbox.give_back(finished)
                if not can_outlive(exc):
                    raise  # the guard ends the fence with the reason
                failures += 1
                delay = exponential(failures, 0.1, 2.0)
                log.error("settling or claiming failed; retrying in %g s", delay, exc_info=True)
                mailbox.pause(delay)
                continue
            failures = 0
            if claims:
                contexts = self._parts.adopt(claims)
                if runs and requests:
                    self._fetch.wait()
                if runs and not self.inline.run(contexts):
                    return  # handed over: another thread is the dispatcher now
                state.queue.put(contexts)
            if finished:
                self._parts.on_progress()

    def round(
        self, requests: Sequence[RecordRequest], finished: list[AttemptContext], room: int, runs: bool = False,
        writes: Writes | None = None, late: Sequence[RecordRequest] = (),
    ) -> tuple[list[Claim], bool]:
        """Run the other threads' ``writes``, record the batches of ``requests`` (if any), settle ``finished`` and
        claim up to ``room``; then take (seal) and record the webhook groups of ``late`` (``PulledRecord``s not sealed
        yet), so what the intake queued while the round settled and claimed joins them: their deliveries wait for
        the insert and the commit, not for the whole round. Their new updates are claimed as they are stored, in the
        room the round's other claims left.

        With a store whose calls nest (``nests_writes``) all of it is one transaction: one commit
        (one fsync) per round instead of one per step; each write runs in a savepoint of its own (one that raises
        fails only its request) and is answered after the commit (see :meth:`Writes.joined`); the transaction
        commits durably when it records a batch or a write asks for it. Each request is finished once its batch is
        committed, or failed (the poller then asks Telegram for the same offset again). In inline
        mode (``runs``) ``finished`` is settled first and the first batch's updates whose chats are then
        free are claimed as they are stored: no second write of those rows to claim them.
        Raises what settling or claiming raised (nothing of the round is then stored; a group of ``late`` not taken
        yet is then taken and failed, so its deliveries are recorded one by one, as for a failed commit).
        """
        exchanger = self._exchanger
        writes = writes or Writes(())
        store = self._caps.batched
        if late and (store is None or not self._caps.nests_writes):
            requests, late = [*requests, *sealed(list(late))], ()
        if store is None or not self._caps.nests_writes:  # nothing to join: each write, each batch on its own
            writes.alone()
            for request in requests:
                self._serve_record(request)
                request.finish()
            return exchanger.exchange(finished, room, runs)
        if not requests and not writes and not late:
            return exchanger.exchange(finished, room, runs)
        early = runs and room > 0 and bool(requests)
        durable = bool(requests) or bool(late) or writes.durable
        unsealed = list(late)
        taken: list[RecordRequest] = []

        def record_late(claims: list[Claim], more: bool) -> tuple[list[Claim], bool]:
            """Seal and record ``late``, claiming their new updates as they are stored (in the room left after
            ``claims``, one chat's run at a time when inline): no later round just to claim them."""
            while unsealed:
                request = unsealed.pop(0)
                if not request.seal():
                    request.finish()
                    continue
                taken.append(request)
                fresh = self._serve_record(request, claim=room - len(claims), run=decisions.INLINE_RUN if runs else 1)
                if fresh:  # a chat just given a claim has nothing else claimable now
                    self._mailbox.unhint(c.chat_id for c in fresh)
                    claims = claims + fresh  # the older updates (other chats) first
            return claims, more

        try:
            with writes.joined(lambda: store.write(durable=durable)):
                if not early:
                    for request in requests:
                        self._serve_record(request)
                    return record_late(*exchanger.exchange(finished, room, runs))
                exchanger.settle_first(finished)
                fresh = self._serve_record(requests[0], claim=room)
                for request in requests[1:]:
                    self._serve_record(request)
                if fresh:  # a chat just given a claim has nothing else claimable now
                    self._mailbox.unhint(c.chat_id for c in fresh)
                claims, more = exchanger.exchange([], room - len(fresh), runs)
                return record_late(claims + fresh, more)  # the older updates (other chats) first
        except BaseException as exc:
            # The commit (or the round) failed: nothing of it was stored, the batches included. A webhook group not
            # taken yet is taken now, so its deliveries learn it (they are then recorded one by one).
            taken.extend(sealed(unsealed))
            for request in (*requests, *taken):
                request.fail(exc)
            raise
        finally:
            for request in (*requests, *taken):
                request.finish()

    def final_flush(self, finished: list[AttemptContext]) -> None:
        """The writer's end: settle ``finished``, hand back claims that never started (attempt not counted).

        Runs on the dispatcher thread in its last round (or on the joining thread when no dispatcher ran).
        """
        unstarted = self._state.queue.drain()
        try:
            self._exchanger.settle(finished)
        except Exception:
            log.error("settling finished updates at shutdown failed; they will run again", exc_info=True)
        self._exchanger.hand_back(unstarted, hint=False)
        if finished:
            self._parts.on_progress()
        self._flushed.set()

    @property
    def flushed(self) -> bool:
        """Whether :meth:`final_flush` ran (the writer's last round is done)."""
        return self._flushed.is_set()

