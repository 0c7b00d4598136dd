"""Conformance rules of the durable level: exhaustions (unreadable updates too) and their acknowledgement."""

from __future__ import annotations

import functools
from typing import Any

from ...updates import UnreadableUpdate
from .harness import LEASE, _Harness, _rule
from .helpers import _claim_id, _claim_one, _expect, _refuses_stale, _settle, _update


@_rule()
def exhaust_needs_the_exact_live_claim(h: _Harness) -> None:
    """exhaust() turns exactly the live claim into an exhaustion holding the error; it is never claimed again."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    claim = _claim_id(h, what="update 1")
    ident = claim.identity
    _refuses_stale(ident, lambda other: s.exhaust(other, "boom"), "exhaust()")
    _expect(s.due_exhaustions() == [], "a refused exhaust() left an exhaustion")
    _expect(s.exhaust(ident, "boom"), "exhaust() of the exact live claim returned False")
    due = s.due_exhaustions()
    _expect(len(due) == 1 and due[0].identity == ident, f"due_exhaustions() is {due}, not the exhausted claim")
    _expect(due[0].error == "boom", f"the exhaustion's error is {due[0].error!r}, not 'boom'")
    _expect(due[0].update.get("update_id") == 1, "the exhaustion does not carry its update")
    _expect(not s.owns(ident), "owns() is still True after exhaust()")
    _expect(not s.exhaust(ident, "again"), "a second exhaust() returned True")
    _expect(not _settle(s, ident), "settle_many() of an exhausted claim returned True")
    expiring = _claim_id(h, what="update 2").identity
    h.clock.advance(10 * LEASE)
    _expect(not s.exhaust(expiring, "late"), "exhaust() of an expired claim returned True")
    again = _claim_id(h, what="update 2 (expired)")
    _expect(again.update_id == 2, f"the claim took update {again.update_id}; exhausted update 1 must stay out")
    _expect(_claim_one(s) is None, "an exhausted update was claimed again")


@_rule()
def exhaustions_page_in_update_id_order(h: _Harness) -> None:
    """due_exhaustions() pages in update_id order, each page strictly after the last item's identity."""
    s = h.store
    s.record([_update(50), _update(10), _update(40), _update(20), _update(30)], 51)
    identities = {}
    for _ in range(5):
        claim = _claim_id(h, what="an update")
        identities[claim.update_id] = claim.identity
        _expect(s.exhaust(claim.identity, f"failed {claim.update_id}"), "exhaust() of a live claim returned False")
    order = [e.identity.update_id for e in s.due_exhaustions()]
    _expect(order == [10, 20, 30, 40, 50], f"due_exhaustions() is in the order {order}")
    pages: list[list[int]] = []
    after = None
    for _ in range(10):
        page = s.due_exhaustions(after=after, limit=2)
        pages.append([e.identity.update_id for e in page])
        if not page:
            break
        _expect(len(page) <= 2, f"due_exhaustions(limit=2) returned {len(page)} items")
        if len(pages) == 1:  # acknowledging an item already seen must not shift later pages
            _expect(s.acknowledge_exhaustion(identities[10]), "acknowledge_exhaustion() of a due exhaustion failed")
        after = page[-1].identity
    _expect(pages == [[10, 20], [30, 40], [50], []], f"paging with limit=2 gave {pages}")
    _expect(
        [e.identity.update_id for e in s.due_exhaustions()] == [20, 30, 40, 50],
        "an acknowledged exhaustion is still due",
    )


@_rule()
def acknowledgement_needs_the_full_identity(h: _Harness) -> None:
    """Only acknowledge_exhaustion() with the exact identity removes an exhaustion from the due list."""
    s = h.store
    s.record([_update(1)], 2)
    ident = _claim_id(h, what="update 1").identity
    _expect(not s.acknowledge_exhaustion(ident), "acknowledge_exhaustion() of a live claim returned True")
    _expect(s.exhaust(ident, "boom"), "exhaust() of the live claim returned False")
    _refuses_stale(ident, s.acknowledge_exhaustion, "acknowledge_exhaustion()")
    _expect([e.identity for e in s.due_exhaustions()] == [ident], "a refused acknowledgement removed the exhaustion")
    _expect(s.acknowledge_exhaustion(ident), "acknowledge_exhaustion() of the exact identity returned False")
    _expect(s.due_exhaustions() == [], "an acknowledged exhaustion is still due")
    _expect(not s.acknowledge_exhaustion(ident), "a second acknowledgement returned True")


@_rule()
def prune_keeps_unacknowledged_exhaustions(h: _Harness) -> None:
    """prune() never deletes an unacknowledged exhaustion; once acknowledged it is prunable like a settled row."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    failed = _claim_id(h, what="update 1").identity
    done = _claim_id(h, what="update 2").identity
    s.exhaust(failed, "boom")
    _settle(s, done)
    h.clock.advance(10 * LEASE)
    deleted = s.prune(h.clock() + 1)
    _expect(deleted == 1, f"prune() deleted {deleted} rows; only the settled one was prunable")
    _expect([e.identity for e in s.due_exhaustions()] == [failed], "prune() removed an unacknowledged exhaustion")
    _expect(s.acknowledge_exhaustion(failed), "acknowledge_exhaustion() after prune() failed")
    h.clock.advance(1)
    _expect(s.prune(h.clock() + 1) == 1, "prune() did not delete the acknowledged exhaustion")
    # update_id reuse: the re-recorded update is a new line; the old identity acknowledges nothing.
    _expect(s.record([_update(1)], 3) == 1, "the pruned exhaustion's update_id recorded again was not new")
    new = _claim_id(h, what="the re-recorded update 1").identity
    _expect(s.exhaust(new, "again"), "exhaust() of the new claim failed")
    _expect(not s.acknowledge_exhaustion(failed), "the pruned exhaustion's identity acknowledged the new one")
    _expect([e.identity for e in s.due_exhaustions()] == [new], "the new exhaustion is not due")


@_rule()
def spent_attempts_become_an_exhaustion(h: _Harness) -> None:
    """With max_attempts, an update whose last lease lapsed is exhausted by the claim, never claimed again."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    first = _claim_one(s, max_attempts=2)
    _expect(first is not None and first.update_id == 1, "a claim with max_attempts=2 did not take update 1")
    h.clock.advance(LEASE + 1)
    second = _claim_one(s, max_attempts=2)
    _expect(second is not None and (second.update_id, second.attempt) == (1, 2),
            "update 1 was not reclaimed as attempt 2")
    _expect(_settle(s, _claim_id(h, what="update 2").identity), "settle_many() of update 2 failed")
    h.clock.advance(LEASE + 1)
    _expect(_claim_one(s, max_attempts=2) is None, "an update was claimed after its attempts were spent")
    due = s.due_exhaustions()
    _expect(
        [e.identity for e in due] == [second.identity],
        f"due_exhaustions() is {[str(e.identity) for e in due]}, not the last attempt {second.identity}",
    )
    _expect(due[0].error, "the exhaustion of a lapsed last attempt has no error text")
    _expect(not s.owns(second.identity), "the exhausted attempt still owns its update")
    _expect(not _settle(s, second.identity), "settle_many() of a lapsed, exhausted attempt returned True")
    h.clock.advance(10 * LEASE)
    _expect(_claim_one(s) is None, "an exhausted update was claimed again")
    _expect(s.acknowledge_exhaustion(second.identity), "the exhaustion could not be acknowledged")


@_rule()
def a_retry_holds_its_chat_until_it_ran_or_was_exhausted(h: _Harness) -> None:
    """A retried update runs before its chat's later updates, which follow in order once it was exhausted."""
    s = h.store
    s.record([_update(1, 7), _update(2, 7), _update(3, 7)], 4)
    first = _claim_id(h, what="update 1").identity
    _expect(s.retry_owned(first, h.clock() + 60, "boom"), "retry_owned() of the live claim of update 1 failed")
    h.clock.advance(60)
    again = _claim_id(h, what="the retried update 1 (now due)").identity
    _expect((again.update_id, again.attempt) == (1, 2),
            f"the claim once the retry is due is {again}, not update 1 attempt 2")
    _expect(s.retry_owned(again, h.clock() + 60, "boom again"), "retry_owned() of update 1's second attempt failed")
    h.clock.advance(60)
    spent = _claim_one(s, max_attempts=2)  # exhausts update 1 (and may claim the next at once)
    _expect([e.identity.update_id for e in s.due_exhaustions()] == [1], "update 1 (attempts spent) is not exhausted")
    nxt = (spent or _claim_id(h, what="update 2 (the update before it was exhausted)")).identity
    _expect(nxt.update_id == 2, f"after update 1 was exhausted the claim is update {nxt.update_id}, not 2")
    _expect(s.exhaust(nxt, "refused"), "exhaust() of update 2 failed")
    last = _claim_id(h, what="update 3 (the update before it was exhausted)")
    _expect(last.update_id == 3, f"after update 2 was exhausted the claim is update {last.update_id}, not 3")


def _deep(levels: int) -> dict[str, Any]:
    """A dict nested ``levels`` deep (deeper than Python's JSON encoder goes)."""
    return functools.reduce(lambda inner, _: {"a": inner}, range(levels), {})


@_rule()
def unreadable_updates_become_exhaustions(h: _Harness) -> None:
    """An update that could not be read, or nests too deep to encode, is kept as an exhaustion; the rest is stored."""
    s = h.store
    batch = [UnreadableUpdate(1, "the update nests too deep to read"), {**_update(2), "deep": _deep(100_000)},
             _update(3)]
    got = s.record(batch, 4)
    _expect(got == 3, f"record() of a batch with two unusable updates stored {got} of 3")
    _expect(s.next_offset() == 4, f"the cursor is {s.next_offset()}, not 4: the batch would be fetched again")
    claim = _claim_one(s)
    _expect(claim is not None and claim.update_id == 3, "the readable update of the batch was not claimable")
    _expect(_claim_one(s) is None, "an unusable update was claimed as if it could be handled")
    due = s.due_exhaustions()
    _expect([e.identity.update_id for e in due] == [1, 2], f"due_exhaustions() holds "
            f"{[e.identity.update_id for e in due]}, not the two unusable updates [1, 2]")
    _expect(all(e.error for e in due), "an exhaustion of an unusable update does not say why")
    _expect(all(e.update.get("update_id") == e.identity.update_id for e in due), "an exhaustion of an unusable "
            "update lost its update_id")
    _expect(all(s.acknowledge_exhaustion(e.identity) for e in due), "the exhaustions could not be acknowledged")
    _expect(s.record(batch[:2], 4) == 0, "recording the unusable updates again counted them as new")
