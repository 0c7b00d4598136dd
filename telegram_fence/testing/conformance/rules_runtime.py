"""Conformance rules of the runtime level (``exchange`` with its hints, ``release``, the exhaustion
listener), and concurrent claimers: each due update is claimed by exactly one, and none is told "nothing is due"
while an update it could take is due."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace
from typing import Any

from ...updates import UnreadableUpdate
from .harness import LEASE, RACE_ROUNDS, RACE_TIMEOUT, RACERS, _Harness, _rule
from .helpers import _claim_id, _claim_one, _expect, _race, _settle, _update


def _ids(claims: Any) -> list[int]:
    return [c.update_id for c in claims]


@_rule()
def exchange_settles_and_claims_in_one_step(h: _Harness) -> None:
    """exchange() settles exactly the live claims given and claims the next due updates, honouring its hints."""
    s = h.store
    s.record([_update(1, 7), _update(2, 7), _update(3, 8), _update(4, 9), _update(5, -1)], 6)
    first = _claim_id(h, what="update 1")
    stale = replace(first.identity, claim_id=first.identity.claim_id + "0")
    settled, claims, _more = s.exchange([stale], LEASE, 0)
    _expect(settled == 0 and claims == [], f"exchange() of a stale identity settled {settled}, claimed {claims}")
    _expect(s.owns(first.identity), "exchange() of a stale identity ended the live claim")
    settled, claims, _more = s.exchange([first.identity], LEASE, 1, chats=[7], chatless=[])
    _expect(settled == 1, f"exchange() settled {settled} of 1 live claim")
    _expect(_ids(claims) == [2], f"exchange(chats=[7]) claimed {_ids(claims)}, not chat 7's next update 2")
    settled, claims, _more = s.exchange([], LEASE, 10, chats=[9], chatless=[5])
    _expect(sorted(_ids(claims)) == [4, 5], f"exchange(chats=[9], chatless=[5]) claimed {_ids(claims)}, not [4, 5]")
    settled, rest, more = s.exchange([c.identity for c in claims], LEASE, 10)
    _expect(settled == 2 and _ids(rest) == [3], f"exchange() settled {settled} and claimed {_ids(rest)}, not 2 and [3]")
    settled, nothing, more = s.exchange([rest[0].identity], LEASE, 10)
    _expect((settled, nothing) == (1, []), f"the last exchange() settled {settled} and claimed {_ids(nothing)}")
    _expect(not more, "exchange() said more was claimable while nothing was due")
    _expect(not s.owns(rest[0].identity), "a claim exchange() settled is still owned")


@_rule()
def release_ends_a_claim_now(h: _Harness) -> None:
    """release() ends exactly this live claim at once; attempt_counts=False gives the attempt back."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    a = _claim_id(h, what="update 1")
    _expect(not s.release(replace(a.identity, claim_id=a.identity.claim_id + "0")), "release() of a stale "
            "identity returned True")
    _expect(s.owns(a.identity), "release() of a stale identity ended the live claim")
    _expect(s.release(a.identity), "release() of a live claim returned False")
    _expect(not s.owns(a.identity), "a released claim is still owned")
    again = _claim_id(h, what="the released update 1")
    _expect(again.identity.update_id == 1 and again.identity.attempt == 2, f"the released update came back as "
            f"{again.identity}, not update 1 attempt 2")
    _expect(not s.release(a.identity), "release() of the old claim succeeded after a reclaim")
    _expect(s.release(again.identity, attempt_counts=False), "release(attempt_counts=False) returned False")
    back = _claim_id(h, what="update 1 handed back")
    _expect(back.identity.update_id == 1 and back.identity.attempt == 2, f"after a hand-back the update came "
            f"back as {back.identity}, not attempt 2 again")


@_rule()
def exhaustion_listener_hears_spent_attempts(h: _Harness) -> None:
    """The exhaustion listener is told when a claim exhausts an update whose attempts are spent."""
    s = h.store
    heard = threading.Event()
    remove = s.add_exhaustion_listener(heard.set)
    try:
        s.record([_update(1)], 2)
        _claim_id(h, what="update 1")
        h.clock.advance(LEASE + 1)
        _expect(_claim_one(s, max_attempts=1) is None, "an update was claimed after its attempts were spent")
        _expect(heard.wait(RACE_TIMEOUT), f"the listener was not told of the exhaustion within {RACE_TIMEOUT:g} s")
        _expect([e.identity.update_id for e in s.due_exhaustions()] == [1], "the exhaustion is not due")
    finally:
        remove()
    # Stale control: a listener removed is not told; one added after it is.
    later = threading.Event()
    remove_later = s.add_exhaustion_listener(later.set)
    heard.clear()
    try:
        s.record([UnreadableUpdate(5, "too deep to read")], 6)
        _expect(later.wait(RACE_TIMEOUT), "the listener was not told of an update that could not be read")
        _expect(not heard.is_set(), "a removed listener was still told")
    finally:
        remove_later()


@_rule()
def a_retry_holds_its_chat_on_every_claim_path(h: _Harness) -> None:
    """exchange() claims nothing of a chat while its update waits for a retry: scanning, claiming one or hinted."""
    s = h.store
    s.record([_update(1, 7), _update(2, 7), _update(3, 7), _update(4, 8)], 5)
    _settled, heads, _more = s.exchange([], LEASE, 10, chats=[7, 8])
    _expect(_ids(heads) == [1, 4], f"exchange(chats=[7, 8]) claimed {_ids(heads)}, not [1, 4]")
    _settled, second, _more = s.exchange([c.identity for c in heads], LEASE, 10, chats=[7])
    _expect(_ids(second) == [2], f"after settling update 1, exchange(chats=[7]) claimed {_ids(second)}, not [2]")
    _expect(s.retry_owned(second[0].identity, h.clock() + 60, "boom"), "retry_owned() of update 2 failed")
    s.record([_update(5, 7), _update(6, 9)], 7)
    fresh = _claim_one(s)
    _expect(fresh is not None and fresh.update_id == 6, "exchange() of one update did not take update 6 of chat 9 "
            "(chat 7 waits for update 2)")
    _expect(_claim_one(s) is None, "exchange() of one update claimed an update behind its chat's retry")
    _settled, scanned, _more = s.exchange([], LEASE, 10)
    _expect(scanned == [], f"a scan claimed {_ids(scanned)} behind chat 7's retry")
    _settled, held, _more = s.exchange([fresh.identity], LEASE, 10, chats=[7, 9])
    _expect(held == [], f"exchange() with chat 7 hinted claimed {_ids(held)} while update 2 waited for its retry")
    h.clock.advance(60)
    _settled, resumed, _more = s.exchange([], LEASE, 10, chats=[7])
    _expect(_ids(resumed) == [2], f"once update 2 is due exchange() claimed {_ids(resumed)}, not the retried 2")
    attempt = resumed[0].identity.attempt
    _expect(attempt == 2, f"the retried update was claimed as attempt {attempt}")


#: Due updates per racer in the rules where every racer claims several.
_EACH = 3


def _record_lines(h: _Harness, first: int, count: int) -> list[int]:
    """Record ``count`` updates from ``first`` on, each in its own chat; return their ids."""
    ids = list(range(first, first + count))
    h.store.record([_update(i) for i in ids], first + count)
    return ids


def _no_duplicates(round_: int, claimed: list[int]) -> None:
    twice = sorted(u for u, n in Counter(claimed).items() if n > 1)
    _expect(not twice, f"round {round_}: updates {twice} were claimed by two racing claimers at once")


@_rule()
def racing_owned_claims_leave_no_claimer_empty(h: _Harness) -> None:
    """8 threads claim one update at once over 8 due updates: each thread gets one, no update goes to two."""
    s = h.store
    first = 1
    for round_ in range(1, RACE_ROUNDS + 1):
        ids = _record_lines(h, first, RACERS)
        first += RACERS
        results = _race(RACERS, lambda: _claim_one(s))
        empty = sum(1 for r in results if r is None)
        _expect(empty == 0, f"round {round_}: {empty} of {RACERS} claimers got None while {RACERS} updates were due")
        claimed = [r.update_id for r in results]
        _no_duplicates(round_, claimed)
        _expect(sorted(claimed) == ids, f"round {round_}: the claimers took {sorted(claimed)}, not {ids}")
        for claim in results:
            _expect(_settle(s, claim.identity), f"round {round_}: a racing claim could not be settled")
    _expect(_claim_one(s) is None, "an update was claimable after every one was claimed and settled")


@_rule()
def racing_exchanges_leave_no_claimer_empty(h: _Harness) -> None:
    """8 threads exchange() at once (settle their claim, claim more): each settles its own and none claims nothing."""
    s = h.store
    held = [c for c in (_claim_one(s) for _ in _record_lines(h, 1, RACERS)) if c is not None]
    _expect(len(held) == RACERS, f"only {len(held)} of {RACERS} updates could be claimed one after another")
    ids = _record_lines(h, RACERS + 1, RACERS * (_EACH + 1))
    lock = threading.Lock()

    def exchange() -> tuple[int, list[Any], bool]:
        with lock:
            own = held.pop()
        return s.exchange([own.identity], LEASE, _EACH)  # type: ignore[no-any-return]

    results = _race(RACERS, exchange)
    _expect([r[0] for r in results] == [1] * RACERS, f"exchange() settled {[r[0] for r in results]}, not 1 each")
    empty = sum(1 for r in results if not r[1])
    _expect(empty == 0, f"{empty} of {RACERS} exchange() calls claimed nothing while {len(ids)} updates were due")
    claims = [c for r in results for c in r[1]]
    _no_duplicates(1, [c.update_id for c in claims])
    _expect(all(c.update_id in ids for c in claims), "exchange() claimed an update that was already settled")
