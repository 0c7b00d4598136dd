"""Conformance rules of the fenced level: claim identities, ownership, fenced transactions."""

from __future__ import annotations

from dataclasses import replace

from .harness import LEASE, _Harness, _rule
from .helpers import _claim_id, _claim_one, _commits, _expect, _refuses_stale, _renew, _settle, _update


@_rule()
def every_claim_gets_a_fresh_claim_id(h: _Harness) -> None:
    """Every claim persists a new claim_id: other updates and later attempts never share one."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    a = _claim_id(h, what="update 1").identity
    b = _claim_id(h, what="update 2").identity
    _expect(isinstance(a.claim_id, str) and a.claim_id, f"claim_id {a.claim_id!r} is not a non-empty str")
    _expect(a.claim_id != b.claim_id, "two claims of different updates got the same claim_id")
    _expect((a.update_id, a.attempt) == (1, 1), f"the first claim is {a}, not update 1 attempt 1")
    _expect(s.owns(a) and s.owns(b), "owns() denied a fresh live claim")
    h.clock.advance(LEASE + 1)
    c = _claim_id(h, what="update 1 (expired)").identity
    _expect((c.update_id, c.attempt) == (1, 2), f"the reclaim of update 1 is {c}, not attempt 2")
    _expect(c.claim_id not in (a.claim_id, b.claim_id), "a reclaim reused an earlier claim_id")


@_rule()
def owns_only_the_exact_live_identity(h: _Harness) -> None:
    """owns() is True only for the exact (update_id, attempt, claim_id) of a claim live at the asked time."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    claim = _claim_id(h, what="update 1")
    _claim_id(h, what="update 2")
    ident = claim.identity
    _expect(s.owns(ident), "owns() denied the exact live identity")
    _expect(s.owns(ident, claim.lease_until - 1), "owns(at=1 s before the lease ends) returned False")
    _refuses_stale(ident, s.owns, "owns()")
    _expect(not s.owns(ident, claim.lease_until + 1), "owns(at=after the lease ends) returned True")
    h.clock.advance(LEASE + 1)
    _expect(not s.owns(ident), "owns() accepted an identity whose lease expired")


@_rule()
def renewal_needs_the_exact_live_claim(h: _Harness) -> None:
    """renew_many() extends exactly the live claims given, never shortens one, and returns exactly those."""
    s = h.store
    s.record([_update(1)], 2)
    claim = _claim_id(h, what="update 1")
    ident = claim.identity
    _refuses_stale(ident, lambda other: _renew(s, other, 10 * LEASE), "renew_many()")
    _expect(not s.owns(ident, claim.lease_until + 1), "renew_many() of a wrong identity extended the claim")
    _expect(_renew(s, ident, 2 * LEASE), "renew_many() of the exact live claim returned False")
    _expect(s.owns(ident, claim.lease_until + LEASE - 1), "renew_many() did not extend the lease")
    _expect(_renew(s, ident, 1), "renew_many() with a short lease of a live claim returned False")
    _expect(s.owns(ident, claim.lease_until + LEASE - 1), "renew_many() with a shorter lease shortened the claim")
    s.record([_update(2)], 3)
    other = _claim_id(h, what="update 2").identity
    live = s.renew_many([other, replace(ident, attempt=ident.attempt + 1)], LEASE)
    _expect(live == {other}, f"renew_many() returned {live}, not the one live identity given")
    _expect(s.renew_many([], LEASE) == set(), "renew_many([]) did not return an empty set")


@_rule()
def settling_needs_the_exact_live_claim(h: _Harness) -> None:
    """settle_many() finishes exactly the live claims given, once, and counts them; other identities stay."""
    s = h.store
    s.record([_update(1)], 2)
    ident = _claim_id(h, what="update 1").identity
    _refuses_stale(ident, lambda other: _settle(s, other), "settle_many()")
    _expect(s.owns(ident), "a refused settle_many() ended the live claim")
    _expect(_settle(s, ident), "settle_many() of the exact live claim returned False")
    _expect(not s.owns(ident), "owns() is still True after settle_many()")
    _expect(not _settle(s, ident), "a second settle_many() returned True")
    s.record([_update(2), _update(3)], 4)
    b, c = (_claim_id(h, what=f"update {i}").identity for i in (2, 3))
    _expect(s.settle_many([b, replace(c, claim_id=c.claim_id + "0")]) == 1, "settle_many() of one live and one "
            "stale identity did not return 1")
    _expect(not s.owns(b) and s.owns(c), "settle_many() settled the wrong claim")
    _expect(s.settle_many([]) == 0, "settle_many([]) did not return 0")
    _expect(_settle(s, c), "settle_many() of the claim left live failed")
    h.clock.advance(10 * LEASE)
    _expect(_claim_one(s) is None, "a settled update was claimed again")


@_rule()
def retry_owned_reschedules_the_exact_claim(h: _Harness) -> None:
    """retry_owned() puts exactly the live claim back, due at the given time, as the next attempt."""
    s = h.store
    s.record([_update(1)], 2)
    ident = _claim_id(h, what="update 1").identity
    due = h.clock() + 60
    _refuses_stale(ident, lambda other: s.retry_owned(other, due, "boom"), "retry_owned()")
    _expect(s.owns(ident), "a refused retry_owned() ended the live claim")
    _expect(s.retry_owned(ident, due, "boom"), "retry_owned() of the exact live claim returned False")
    _expect(not s.owns(ident), "owns() is still True after retry_owned()")
    h.clock.advance(59)
    _expect(_claim_one(s) is None, "a retried update was claimed before it was due")
    h.clock.advance(1)
    again = _claim_id(h, what="the retried update 1 (now due)").identity
    _expect(again.attempt == 2 and again.claim_id != ident.claim_id, f"the retry was claimed as {again}")
    _expect(not s.retry_owned(ident, due, "late"), "retry_owned() of the earlier attempt returned True")
    _expect(s.owns(again), "a stale retry_owned() ended the new claim")


@_rule()
def reclaim_fences_the_old_identity(h: _Harness) -> None:
    """After another worker reclaims an expired update, every fenced call with the old identity fails."""
    s = h.store
    s.record([_update(1)], 2)
    old = _claim_id(h, what="update 1").identity
    h.clock.advance(LEASE + 1)
    new = _claim_id(h, what="update 1 (expired)")
    _expect(not s.owns(old), "owns() accepted the reclaimed identity")
    _expect(not _renew(s, old, 10 * LEASE), "renew_many() accepted the reclaimed identity")
    _expect(not _settle(s, old), "settle_many() accepted the reclaimed identity")
    _expect(not s.retry_owned(old, h.clock(), "stale"), "retry_owned() accepted the reclaimed identity")
    _expect(not s.exhaust(old, "stale"), "exhaust() accepted the reclaimed identity")
    _expect(s.due_exhaustions() == [], "a stale exhaust() left an exhaustion")
    _expect(not _commits(s, old), "transaction() with the reclaimed identity committed")
    _expect(s.owns(new.identity), "calls with the old identity ended the new claim")
    _expect(not s.owns(new.identity, new.lease_until + 1), "calls with the old identity extended the new claim")
    _expect(_settle(s, new.identity), "the new owner could not settle")


@_rule()
def update_id_reuse_fences_the_old_identity(h: _Harness) -> None:
    """A pruned update_id recorded again is new, claimed from attempt 1; no identity from before the prune matches."""
    s = h.store
    s.record([_update(1)], 2)
    old = _claim_id(h, what="update 1").identity
    _expect(_settle(s, old), "settle_many() of the live claim returned False")
    _expect(s.record([_update(1)], 2) == 0, "a settled, unpruned update was recorded again as new")
    h.clock.advance(1)
    _expect(s.prune(h.clock()) == 1, "prune() did not delete the settled update")
    _expect(s.record([_update(1)], 2) == 1, "the pruned update_id recorded again was not new")
    new = _claim_id(h, what="the re-recorded update 1").identity
    _expect((new.update_id, new.attempt) == (1, 1), f"the re-recorded update was claimed as {new}")
    _expect(new.claim_id != old.claim_id, "the re-recorded update got the claim_id of the pruned one")
    _expect(not s.owns(old), "owns() accepted an identity from before the prune")
    _expect(not _renew(s, old, LEASE), "renew_many() accepted an identity from before the prune")
    _expect(not s.retry_owned(old, h.clock(), "stale"), "retry_owned() accepted an identity from before the prune")
    _expect(not _settle(s, old), "settle_many() accepted an identity from before the prune")
    _expect(not _commits(s, old), "transaction() with an identity from before the prune committed")
    _expect(s.owns(new), "calls with the old identity ended the new claim")


@_rule()
def one_live_owned_claim_per_chat(h: _Harness) -> None:
    """A claim never holds two updates of one chat at once; an update without a chat is its own line."""
    s = h.store
    # Updates 1 and 2 share chat 7; 3 is in chat 8; 4 and 5 have no chat (each its own line).
    s.record([_update(1, 7), _update(2, 7), _update(3, 8), _update(4, -1), _update(5, -1)], 6)
    first = _claim_id(h, what="update 1")
    others = [_claim_id(h, what="an update of another line") for _ in range(3)]
    order = [first.update_id] + [c.update_id for c in others]
    _expect(order == [1, 3, 4, 5], f"claims took {order}; update 2 shares chat 7 with the live update 1")
    _expect(_claim_one(h.store) is None, "update 2 was claimed while update 1 of the same chat was live")
    _expect(first.chat_id == 7, f"the claim of update 1 reports chat {first.chat_id}, not 7")
    for claim in others:
        _expect(_settle(s, claim.identity), f"settling the live claim of update {claim.update_id} failed")
    # Stale control: after update 1's lease lapses, update 1 (older) comes back before update 2,
    # and its new claim blocks update 2 again.
    h.clock.advance(LEASE + 1)
    again = _claim_id(h, what="update 1 (expired)")
    _expect(again.update_id == 1, f"after update 1's lease lapsed the claim took {again.update_id}, not 1")
    _expect(_claim_one(h.store) is None, "update 2 was claimed while the reclaimed update 1 of the same chat was live")
    _expect(_settle(s, again.identity), "settling the live claim of update 1 failed")
    nxt = _claim_id(h, what="update 2 (update 1 is settled)")
    _expect(nxt.update_id == 2, f"after update 1 was settled the claim took {nxt.update_id}, not 2")


@_rule()
def transaction_refuses_a_stale_identity(h: _Harness) -> None:
    """transaction() runs for the live owner (complete=True settles) and raises OwnershipLost for any other."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    claim = _claim_id(h, what="update 1")
    ident = claim.identity
    ran = []
    with s.transaction(ident):
        ran.append(1)
    _expect(ran == [1], "the block of a live owner's transaction() did not run")
    _expect(s.owns(ident), "transaction() without complete=True ended the claim")
    _refuses_stale(ident, lambda other: _commits(s, other, complete=True), "transaction(complete=True)")
    _expect(s.owns(ident), "a refused transaction() ended the live claim")
    with s.transaction(ident, complete=True):
        pass
    _expect(not s.owns(ident), "transaction(complete=True) did not settle the update")
    _expect(not _settle(s, ident), "the update was still live after transaction(complete=True)")
    _expect(not _commits(s, ident), "transaction() with a settled identity committed")
    expiring = _claim_id(h, what="update 2").identity
    h.clock.advance(LEASE + 1)
    _expect(not _commits(s, expiring, complete=True), "transaction(complete=True) with an expired identity committed")
    again = _claim_id(h, what="update 2 (expired)")
    _expect(again.update_id == 2, "an expired transaction(complete=True) settled its update")


@_rule(probe=True)
def transaction_commits_write_and_settle_together(h: _Harness) -> None:
    """A write through transaction(complete=True) commits with the settlement; an error in the block undoes both."""
    s, probe = h.store, h.probe
    s.record([_update(1)], 2)
    ident = _claim_id(h, what="update 1").identity
    with s.transaction(ident) as handle:
        probe.write(handle, "kept-open")
    _expect(probe.exists(s, "kept-open"), "a write through transaction() was not committed")
    _expect(s.owns(ident), "transaction() without complete=True ended the claim")
    try:
        with s.transaction(ident, complete=True) as handle:
            probe.write(handle, "undone")
            raise _BlockFailed
    except _BlockFailed:
        pass
    else:  # pragma: no cover - a store cannot swallow the block's exception silently
        raise AssertionError("transaction() swallowed the exception raised in its block")
    _expect(not probe.exists(s, "undone"), "a write of a block that raised was committed")
    _expect(s.owns(ident), "a block that raised still settled the update")
    with s.transaction(ident, complete=True) as handle:
        probe.write(handle, "done")
    _expect(probe.exists(s, "done"), "the write of transaction(complete=True) was not committed")
    _expect(not s.owns(ident), "transaction(complete=True) committed the write but did not settle")


class _BlockFailed(Exception):
    """Raised inside a transaction block by a rule, to see it roll back."""


@_rule(probe=True)
def stale_transaction_write_is_absent(h: _Harness) -> None:
    """A stale worker's transaction() raises OwnershipLost and its write is absent; the new owner's commits."""
    s, probe = h.store, h.probe
    s.record([_update(1)], 2)
    old = _claim_id(h, what="update 1").identity
    h.clock.advance(LEASE + 1)
    _expect(not _commits(s, old, True, lambda handle: probe.write(handle, "expired")), "transaction(complete=True) "
            "with an expired identity committed")
    _expect(not probe.exists(s, "expired"), "the write of an expired attempt was committed")
    new = _claim_id(h, what="update 1 (expired)").identity
    _expect(not _commits(s, old, True, lambda handle: probe.write(handle, "stale")), "transaction(complete=True) "
            "with a reclaimed identity committed")
    _expect(not probe.exists(s, "stale"), "the write of a stale attempt was committed after the reclaim")
    _expect(s.owns(new), "the stale transaction ended the new owner's claim")
    with s.transaction(new, complete=True) as handle:
        probe.write(handle, "fresh")
    _expect(probe.exists(s, "fresh"), "the new owner's write was not committed")


