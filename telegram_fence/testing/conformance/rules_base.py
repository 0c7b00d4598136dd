"""Conformance rules of the base level: the inbox, its cursor, hostile values, claims in order, pruning."""

from __future__ import annotations

import math
from typing import Any

from ...errors import InvalidUpdate
from .harness import LEASE, _Harness, _rule
from .helpers import _claim_id, _claim_one, _drain, _expect, _renew, _settle, _update


@_rule()
def record_counts_new_updates_and_is_idempotent(h: _Harness) -> None:
    """record() returns how many updates were new; recording them again stores nothing twice."""
    s = h.store
    _expect(s.record([_update(1), _update(2), _update(3)], 4) == 3, "record() of 3 new updates did not return 3")
    got = s.record([_update(2), _update(3), _update(4)], 5)
    _expect(got == 1, f"record() of 2 known and 1 new update returned {got}, not 1")
    _expect(s.record([_update(1)], 5) == 0, "record() of an already recorded update did not return 0")
    seen = _drain(s)
    _expect(seen == [1, 2, 3, 4], f"each recorded update must be claimable exactly once, got {seen}")


@_rule()
def record_keeps_the_first_payload(h: _Harness) -> None:
    """A different payload for a recorded update_id is not stored: the first payload stays."""
    s = h.store
    _expect(s.record([_update(1, text="first")], 2) == 1, "record() of a new update did not return 1")
    _expect(s.record([_update(1, text="second")], 2) == 0, "a second payload for update 1 was counted as new")
    claim = _claim_id(h, what="update 1")
    text = claim.update.get("message", {}).get("text")
    _expect(text == "first", f"the claimed update carries {text!r}; the first payload ('first') must be kept")
    _expect(_claim_one(h.store) is None, "update 1 was stored twice")


@_rule()
def cursor_never_moves_backwards(h: _Harness) -> None:
    """next_offset() starts at 0, rises with record(), and never moves backwards."""
    s = h.store
    _expect(s.next_offset() == 0, f"an empty store's next_offset() is {s.next_offset()}, not 0")
    s.record([_update(1)], 2)
    _expect(s.next_offset() == 2, f"next_offset() is {s.next_offset()} after record(..., 2)")
    s.record([], 10)
    _expect(s.next_offset() == 10, f"next_offset() is {s.next_offset()} after an empty record(..., 10)")
    s.record([_update(3)], 4)
    _expect(s.next_offset() == 10, f"next_offset() moved back to {s.next_offset()} after record(..., 4)")
    s.record([], 0)
    _expect(s.next_offset() == 10, f"next_offset() moved back to {s.next_offset()} after record(..., 0)")
    _expect(s.record([_update(3)], 11) == 0, "an update recorded with an older cursor was lost")
    _expect(s.next_offset() == 11, "the cursor did not rise after it was held back once")


@_rule()
def invalid_batch_stores_nothing(h: _Harness) -> None:
    """A batch with any malformed item raises InvalidUpdate and stores nothing; the cursor stays."""
    s = h.store
    s.record([_update(1)], 2)
    bad_items: list[Any] = [
        "not a mapping",
        None,
        {"message": {"text": "no update_id"}},
        {"update_id": "7"},
        {"update_id": 7.0},
        {"update_id": True},
        {"update_id": 2**63},
    ]
    for bad in bad_items:
        try:
            s.record([_update(5), bad, _update(6)], 100)
        except InvalidUpdate as exc:
            _expect(str(exc), f"InvalidUpdate for {bad!r} has an empty message")
        else:
            raise AssertionError(f"record() accepted the malformed item {bad!r} instead of raising InvalidUpdate")
        _expect(s.next_offset() == 2, f"a refused batch moved the cursor to {s.next_offset()}")
    _expect(s.record([_update(5), _update(6)], 7) == 2, "a refused batch stored some of its valid updates")
    seen = _drain(s)
    _expect(seen == [1, 5, 6], f"after refused batches the store holds {seen}, not [1, 5, 6]")


@_rule()
def claims_come_in_update_id_order(h: _Harness) -> None:
    """claim() takes the oldest due update by update_id, whatever the recording order; None when none is due."""
    s = h.store
    _expect(_claim_one(h.store) is None, "an empty store returned a claim")
    s.record([_update(30), _update(10), _update(20)], 31)
    s.record([_update(5)], 31)
    seen = [_claim_id(h, what="an update").update_id for _ in range(4)]
    _expect(seen == [5, 10, 20, 30], f"claims came in the order {seen}, not [5, 10, 20, 30]")
    _expect(_claim_one(h.store) is None, "a fifth claim returned an update although all four were claimed")


@_rule()
def expired_lease_is_reclaimable(h: _Harness) -> None:
    """A live claim blocks its update; once the lease lapsed it is not renewed but claimed again as attempt 2."""
    s = h.store
    s.record([_update(1)], 2)
    start = h.clock()
    first = _claim_id(h, what="update 1")
    _expect(first.attempt == 1, f"the first claim has attempt {first.attempt}, not 1")
    _expect(
        abs(first.lease_until - (start + LEASE)) < 1e-6,
        f"lease_until is {first.lease_until}, not now + lease ({start + LEASE})",
    )
    _expect(_claim_one(h.store) is None, "an update with a live claim was claimed again")
    h.clock.advance(LEASE - 1)
    _expect(_claim_one(h.store) is None, "an update was claimed again 1 s before its lease ended")
    _expect(_renew(s, first.identity, 1), "renew_many() 1 s before the lease ended returned False")
    h.clock.advance(2)
    _expect(not _renew(s, first.identity, LEASE), "renew_many() after the lease lapsed returned True")
    _expect(not s.owns(first.identity), "a failed renewal revived the lapsed claim")
    second = _claim_id(h, what="update 1 (its lease expired)")
    _expect(second.update_id == 1 and second.attempt == 2, f"the reclaim is {second.identity}, not update 1 attempt 2")
    _expect(not _renew(s, first.identity, LEASE), "renew_many() of the reclaimed first attempt returned True")
    _expect(not _settle(s, first.identity), "settle_many() of the reclaimed first attempt returned True")
    _expect(_settle(s, second.identity), "settle_many() of the live second attempt returned False")


@_rule()
def prune_removes_only_finished_rows(h: _Harness) -> None:
    """prune() deletes settled rows older than the cutoff, never pending, live or lapsed claims."""
    s = h.store
    s.record([_update(1), _update(2), _update(3), _update(4)], 5)
    done = _claim_id(h, what="update 1")
    _expect(_settle(s, done.identity), "settle_many() of a live claim returned False")
    settled_at = h.clock()
    live = _claim_id(h, lease=100 * LEASE, what="update 2")
    lapsed = _claim_id(h, lease=LEASE, what="update 3")
    _expect(lapsed.update_id == 3, f"setup: the third claim took update {lapsed.update_id}, not 3")
    h.clock.advance(LEASE + 1)  # update 3's lease lapsed; update 4 never claimed
    _expect(s.prune(settled_at - 1) == 0, "prune() deleted a row settled after the cutoff")
    deleted = s.prune(h.clock() + 1)
    _expect(deleted == 1, f"prune() deleted {deleted} rows; only the one settled row was prunable")
    _expect(_renew(s, live.identity, LEASE), "prune() removed a live claim (it can no longer be renewed)")
    again = _claim_id(h, what="update 3 (its lease lapsed)")
    _expect((again.update_id, again.attempt) == (3, 2),
            f"after prune() the lapsed update 3 came back as {again.identity}")
    pending = _claim_id(h, what="update 4 (never claimed)")
    _expect(pending.update_id == 4, f"prune() removed the pending update 4 (claim took {pending.update_id})")
    _expect(_settle(s, live.identity), "settle_many() of the live claim failed after prune()")


@_rule()
def hostile_values_are_stored_and_handed_back(h: _Harness) -> None:
    """A lone surrogate, NaN and a chat id beyond 64 bits are stored with the rest of the batch and come back."""
    s = h.store
    surrogate = _update(1, text="\ud800 alone")
    nan = {**_update(2), "score": float("nan")}
    huge = _update(3, chat=2**70)
    got = s.record([surrogate, nan, huge, _update(4)], 5)
    _expect(got == 4, f"record() of 4 updates with hostile values stored {got}")
    _expect(s.next_offset() == 5, f"the cursor is {s.next_offset()} after the batch, not 5")
    claims: dict[int, Any] = {}
    for _ in range(4):
        claim = _claim_one(s)
        _expect(claim is not None, f"only {len(claims)} of the 4 stored updates could be claimed")
        claims[claim.update_id] = claim
    _expect(sorted(claims) == [1, 2, 3, 4], f"claims took {sorted(claims)}")
    text = claims[1].update["message"]["text"]
    _expect(text == "\ud800 alone", f"the lone surrogate came back as {text!r}")
    # NaN is not JSON: a store whose JSON has no NaN may hand it back as null, never refuse the batch.
    score = claims[2].update.get("score", "missing")
    _expect(score is None or (isinstance(score, float) and math.isnan(score)), f"NaN came back as {score!r}")
    chat = claims[3].update["message"]["chat"]["id"]
    _expect(chat == 2**70, f"the huge chat id came back as {chat!r}")
    got_chat = claims[3].chat_id
    _expect(got_chat is None or (type(got_chat) is int and got_chat == 2**70), f"the claim of the huge chat id "
            f"names chat {got_chat!r} (a {type(got_chat).__name__}), neither the id nor None")
