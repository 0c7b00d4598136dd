"""Settling finished attempts and claiming due updates in the store, looking where work may be.

One job: the store calls of a dispatcher round (``exchange``, or ``settle_many``/``claim_many`` and
the one-at-a-time fallbacks), the hints of where claimable work may be, and handing unstarted claims
back. May import ``store`` (types), ``runtime.attempt``, ``runtime.decisions``, ``runtime.mailbox``,
``runtime.state``, ``runtime.writer`` and the standard library. Logs as ``telegram_fence.exchange``.

Thread safety: :meth:`Exchanger.exchange`, :meth:`Exchanger.settle_first`, :meth:`Exchanger.offer`
and :meth:`Exchanger.settle` run on the dispatcher's thread (or, at shutdown, the joining thread once
the dispatcher ended); :meth:`Exchanger.hand_back` may run on any thread. The hints are the mailbox's,
reached through its methods.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from ..store import Claim
from . import decisions
from .attempt import AttemptContext
from .capabilities import StoreCapabilities
from .mailbox import Mailbox
from .state import PoolState
from .writer import Writer

__all__ = ["FRESH_LIMIT", "Exchanger"]

#: How many just-recorded update dicts the dispatcher keeps for its claims. The poller fetches only while fewer than
#: ``max_backlog`` (default 1000) updates wait, so one fence alone never has more than about this many recorded and
#: unclaimed; past it they are updates other processes claimed (the polling host of a fence on PostgreSQL records
#: them all), which were kept up to 4,096 before: ≈ 5.8 MB more peak RSS on such a host (docs/benchmarks.md, pgrss).
FRESH_LIMIT = 1100

log = logging.getLogger("telegram_fence.exchange")


class Exchanger:
    """The dispatcher's store calls; owned by the pool."""

    def __init__(self, state: PoolState, *, mailbox: Mailbox, writer: Writer, store: StoreCapabilities, lease: float,
                 max_attempts: int) -> None:
        self._state = state
        self._mailbox = mailbox
        self._writer = writer
        self._store = store.store
        self._batched = store.batched  # None: one attempt at a time through the fenced level
        self._nests = store.nests_writes  # its write() joins the calls made inside into one transaction
        self._lease = lease
        self._max_attempts = max_attempts
        #: update dicts the poller just recorded, by id: claims take them instead of reading payloads
        #: back (dispatcher thread only)
        self._fresh: dict[int, Mapping[str, Any]] = {}
        self._next_scan = 0.0  # when the next full scan of the backlog is due (monotonic; dispatcher thread only)

    def postpone_scan(self, until: float) -> None:
        """No full scan of the backlog before ``until`` (monotonic) unless one is asked for (dispatcher thread)."""
        self._next_scan = until

    def recorded(
        self, updates: Sequence[Mapping[str, Any]], skip: Collection[int], claims: Sequence[Claim], stored: int
    ) -> None:
        """A batch was just recorded (``stored`` new rows) and ``claims`` claimed with it (dispatcher thread): its
        updates that wait (neither in ``skip`` nor claimed; one per id, the first) are hinted to the mailbox as
        claimable work, and kept (:meth:`offer`) when the store holds them as they are, i.e. every id of the batch
        was new (an id stored before, or repeated with another payload, keeps its first payload: claims then read
        the payloads back)."""
        taken = {c.update_id for c in claims}
        fresh = decisions.first_of_each(
            u for u in updates if u["update_id"] not in skip and u["update_id"] not in taken
        )
        if not fresh:
            return
        if stored == len({u["update_id"] for u in updates}):
            self.offer(fresh)
        self._mailbox.hint(fresh)

    def offer(self, updates: list[Mapping[str, Any]]) -> None:
        """Keep update dicts just recorded, so claiming them needs no read-back of their payloads; at most
        :data:`FRESH_LIMIT`, the oldest dropped first (a claim of a dropped one reads its payload back)."""
        fresh = self._fresh
        for update in updates:
            fresh[update["update_id"]] = update
        excess = len(fresh) - FRESH_LIMIT
        if excess > 0:  # the oldest: claimed by another process (never taken from here), or next to be claimed
            for update_id in list(itertools.islice(fresh, excess)):
                del fresh[update_id]

    def settle_first(self, finished: list[AttemptContext]) -> None:
        """Settle ``finished`` (inside the round's transaction) and note their chats as freed."""
        if not finished:
            return
        if self._batched is None:
            self.settle(finished)
        else:
            settled, _claims, _more = self._batched.exchange([c.identity for c in finished], self._lease, 0)
            self.settled(finished, settled)
        self._mailbox.hint_freed(finished)

    def exchange(self, finished: list[AttemptContext], room: int, runs: bool = False) -> tuple[list[Claim], bool]:
        """Settle ``finished`` and claim up to ``room`` updates, in one transaction when the store allows.

        Returns the claims and whether more may be claimable now. Looks only where work may have
        appeared (the chats just freed or just given updates) unless a full scan is due. Raises what
        the store raised; the hints taken for the round are then kept for the next one.
        """
        mailbox = self._mailbox
        known = self._fresh
        batched = self._batched
        if batched is not None and room <= 0:  # settle only: the hints and a due scan wait for room
            if finished:
                self.settle_first(finished)
            return [], False
        if batched is None:
            self.settle(finished)
            claims = self._claim(room)
            more = bool(claims)
        else:
            now = time.monotonic()
            mailbox.hint_freed(finished)  # settled below, in the same transaction
            chats, chatless, scan = mailbox.take_hints(now >= self._next_scan)
            try:
                settled, claims, more = batched.exchange(
                    [c.identity for c in finished], self._lease, room, max_attempts=self._max_attempts,
                    known=known, chats=None if scan else chats, chatless=chatless,
                    run=decisions.INLINE_RUN if runs else 1,
                )
            except BaseException:
                mailbox.keep_hints(chats, chatless, scan)
                raise
            self.settled(finished, settled)
            if scan:
                self._next_scan = now + decisions.scan_interval(self._lease)
                if more:
                    mailbox.keep_hints(set(), set(), scan=True)
            elif more:  # cut off by the room: the chats not served yet stay candidates
                left, left_chatless = decisions.unserved(
                    chats, chatless, (c.chat_id for c in claims), (c.update_id for c in claims), runs
                )
                mailbox.keep_hints(left, left_chatless)
        for claim in claims:
            known.pop(claim.update_id, None)
        return claims, more

    def _claim(self, room: int) -> list[Claim]:
        if room <= 0:
            return []
        if self._batched is not None:
            return list(self._batched.claim_many(self._lease, room, max_attempts=self._max_attempts))
        claims = []
        for _ in range(room):
            claim = self._store.claim_owned(self._lease, max_attempts=self._max_attempts)
            if claim is None:
                break
            claims.append(claim)
        return claims

    def settle(self, done: list[AttemptContext]) -> None:
        """Settle ``done`` in the store (without claiming); raises what the store raised."""
        if not done:
            return
        identities = [ctx.identity for ctx in done]
        if self._batched is not None:
            settled = self._batched.settle_many(identities)
        else:
            settled = sum(1 for identity in identities if self._store.settle_owned(identity))
        self.settled(done, settled)

    def settled(self, finished: list[AttemptContext], settled: int) -> None:
        """``finished`` were settled (``settled`` of them still owned): their leases end; counted as handled,
        the rest as lost (with a warning)."""
        if not finished:
            return
        state = self._state
        state.leases.drop(finished)
        state.counters.add("handled", settled)
        if settled != len(finished):
            state.counters.add("lost", len(finished) - settled)
            log.warning("some finished updates were no longer owned when settled",
                        extra={"finished": len(finished), "settled": settled})

    def hand_back(self, contexts: list[AttemptContext], *, hint: bool = True) -> None:
        """Return unstarted claims to the store (attempts not counted), in one transaction when the store nests its
        writes; ``hint``: look at their chats again.

        Written by the dispatcher thread (``runtime.writer``). Never raises: claims that cannot be handed back are
        reclaimed after their lease.
        """
        batched = self._batched
        if not contexts:
            return
        if batched is not None:
            joined = self._nests and len(contexts) > 1

            def release_all() -> None:
                with batched.write() if joined else nullcontext():
                    for ctx in contexts:
                        batched.release(ctx.identity, attempt_counts=False)

            try:
                self._writer.call(release_all, durable=False)
            except Exception:
                log.warning("could not hand back claims; they are reclaimed after their lease",
                            extra={"update_ids": [ctx.update_id for ctx in contexts]}, exc_info=True)
        self._state.leases.drop(contexts)
        if hint:
            for ctx in contexts:
                self._mailbox.freed(ctx)

    def one_per_chat(self, contexts: list[AttemptContext]) -> list[AttemptContext]:
        """The first context of each chat; the others are handed back to the store (not an attempt)."""
        kept, rest = decisions.one_per_chat(contexts, lambda ctx: ctx.chat_id)
        self.hand_back(rest)
        return kept
