"""The writer thread: one transaction per round records the doors' batches, settles what finished, claims what is due.

Each round runs the other threads' writes (each in a savepoint), records the batches, settles the attempts whose
handler returned and claims up to the workers' room where the hints say work may be (a full scan now and then finds
what only time or another process made due); then it answers the senders and hands the claims to the workers. An
update is settled only after its handler returned.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..retry import exponential
from ..store import Claim, UpdateStore
from ..updates import chat_id_of
from .attempt import AttemptContext
from .mailbox import Hints, Mailbox, RecordRequest, Round, joined
from .state import PoolState, can_outlive, idle_scan_interval, scan_interval

__all__ = ["Dispatcher"]

log = logging.getLogger("telegram_fence.dispatcher")


class Dispatcher:
    """The writer thread's work. ``run(contexts)`` hands new claims to the workers; ``unstarted()`` takes back those
    no worker started (shutdown); ``on_claimed(contexts)`` is told each round's new attempts before any begins."""

    def __init__(self, state: PoolState, mailbox: Mailbox, store: UpdateStore, *, max_attempts: int,
                 run: Callable[[list[AttemptContext]], None], unstarted: Callable[[], list[AttemptContext]],
                 on_claimed: Callable[[Sequence[AttemptContext]], None], write: Callable[..., Any]) -> None:
        self._state = state
        self._mailbox = mailbox
        self._store = store
        self._max_attempts = max_attempts
        self._run = run
        self._unstarted = unstarted
        self._on_claimed = on_claimed
        self._write = write
        self._next_scan = 0.0  # monotonic; writer thread only
        self.flushed = False  # final_flush ran (the writer's last round is done)

    def loop(self) -> None:
        """Run rounds until the mailbox is closed; a failed round is retried after a back-off (its finished
        attempts and hints kept); an error retrying cannot fix raises."""
        failures = 0
        scan_period = self._scan_period
        while True:
            work = self._mailbox.next_round(scan_period)
            if work.closing:
                self._last_round(work)
                return
            try:
                claims = self.round(work)
            except Exception as exc:
                self._mailbox.give_back(work.finished)
                if not can_outlive(exc):
                    raise
                failures += 1
                delay = exponential(failures, 0.1, 2.0)
                log.error("a round failed; retrying in %g s", delay, exc_info=True)
                self._mailbox.pause(delay)
                continue
            failures = 0
            if claims:
                contexts = [AttemptContext(self._store, claim) for claim in claims]
                self._state.hold(contexts)
                self._on_claimed(contexts)
                self._run(contexts)

    def _scan_period(self) -> float:
        lease = self._state.lease
        return scan_interval(lease) if self._state.holding() else idle_scan_interval(lease)

    def round(self, work: Round) -> list[Claim]:
        """Write ``work`` in one transaction and return the new claims. When settling or claiming raised, nothing
        was stored: each batch and write is done again on its own and answered with its own outcome."""
        requests = work.requests
        store = self._store
        durable = bool(requests) or any(write.durable for write in work.writes)
        try:
            with joined(work.writes, lambda: store.write(durable=durable)):
                known: dict[int, Mapping[str, Any]] = {}
                for request in requests:
                    self._record(request, known)
                return self._exchange(work.finished, work.room, known)
        except Exception:
            for request in requests:  # nothing of the round was stored: each batch on its own, as each write
                self._record(request)
            raise
        except BaseException as exc:
            for request in requests:
                request.fail(exc)
            raise
        finally:
            for request in requests:
                request.finish()

    def _record(self, request: RecordRequest, known: dict[int, Mapping[str, Any]] | None = None) -> None:
        """Record ``request``'s batch (a failure is kept for its sender); its chats become hints, and when every id
        was new ``known`` gets the updates (their claims need no read-back)."""
        try:
            stored = int(self._store.record(request.updates, request.next_offset, **request.kwargs))
        except Exception as exc:
            request.fail(exc)
            return
        request.keep(stored)
        skip = request.kwargs.get("skip", ())
        fresh = [u for u in request.updates if u["update_id"] not in skip]
        self._mailbox.hint(fresh)
        if known is not None and stored == len({u["update_id"] for u in request.updates}):
            for update in fresh:  # the store keeps the first of a repeated id
                known.setdefault(update["update_id"], update)

    def _exchange(self, finished: list[AttemptContext], room: int,
                  known: Mapping[int, Mapping[str, Any]] | None = None) -> list[Claim]:
        """Settle ``finished`` and claim up to ``room`` where the hints say (everywhere when a scan is due)."""
        self._mailbox.hint((), finished)
        store, lease = self._store, self._state.lease
        if room <= 0:
            self.settle(finished)
            return []
        now = time.monotonic()
        hints = self._mailbox.take_hints(now >= self._next_scan)
        try:
            settled, claims, more = store.exchange(
                [c.identity for c in finished], lease, room, max_attempts=self._max_attempts, known=known,
                chats=None if hints.scan else hints.chats, chatless=hints.chatless)
        except BaseException:
            self._mailbox.keep_hints(hints)
            raise
        self._settled(finished, settled)
        self._note_quiet(claims, hints, known)
        if hints.scan:
            self._next_scan = now + scan_interval(lease)
        if more:  # cut off by the room: what was not served stays a candidate
            taken = {c.chat_id for c in claims}
            self._mailbox.keep_hints(hints._replace(chats=hints.chats - taken,
                                                    chatless=hints.chatless - {c.update_id for c in claims}))
        return claims

    def _note_quiet(self, claims: list[Claim], hints: Hints, known: Mapping[int, Mapping[str, Any]] | None) -> None:
        """Tell the mailbox which claimed chats have nothing known behind their claim (it is the one update of its
        chat this round recorded, no scan ran) and which hinted chats got no claim (work waits behind one)."""
        chats = {c.chat_id for c in claims if c.chat_id is not None}
        quiet: set[int] = set()
        if known and not hints.scan:
            fresh = Counter(chat_id_of(update) for update in known.values())
            quiet = {c.chat_id for c in claims if c.chat_id is not None and c.update_id in known
                     and fresh[c.chat_id] == 1}
        self._mailbox.claimed(chats, quiet, hints.chats - chats)

    def settle(self, done: list[AttemptContext]) -> None:
        """Settle ``done`` without claiming; raises what the store raised."""
        if done:
            self._settled(done, self._store.settle_many([ctx.identity for ctx in done]))

    def _settled(self, finished: list[AttemptContext], settled: int) -> None:
        """``finished`` were settled (``settled`` of them still owned): their leases end; the rest count as lost."""
        if not finished:
            return
        state = self._state
        state.let_go(finished)
        state.count("handled", settled)
        if settled != len(finished):
            state.count("lost", len(finished) - settled)
            log.warning("some finished updates were no longer owned when settled",
                        extra={"finished": len(finished), "settled": settled})

    def hand_back(self, contexts: list[AttemptContext]) -> None:
        """Return unstarted claims to the store (attempts not counted). Never raises (they lapse instead)."""
        if not contexts:
            return
        store = self._store

        def release_all() -> None:
            with store.write():
                for ctx in contexts:
                    store.release(ctx.identity, attempt_counts=False)

        try:
            self._write(release_all, durable=False)
        except Exception:
            log.warning("could not hand back claims; they are reclaimed after their lease",
                        extra={"update_ids": [ctx.update_id for ctx in contexts]}, exc_info=True)
        self._state.let_go(contexts)

    def _last_round(self, work: Round) -> None:
        """The writer's end: each write and batch on its own, then :meth:`final_flush`."""
        for write in work.writes:
            write.run()
            write.finish()
        for request in work.requests:
            self._record(request)
            request.finish()
        self.final_flush(work.finished)

    def final_flush(self, finished: list[AttemptContext]) -> None:
        """Settle ``finished`` and hand back the claims no worker started (attempt not counted)."""
        try:
            self.settle(finished)
        except Exception:
            log.error("settling finished updates at shutdown failed; they will run again", exc_info=True)
        self.hand_back(self._unstarted())
        self.flushed = True
