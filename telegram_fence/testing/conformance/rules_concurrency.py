"""Conformance rules for concurrent claimers: each due update is claimed by exactly one, and no claimer is
told "nothing is due" while an update it could take is due.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from .harness import LEASE, RACE_ROUNDS, RACERS, _Harness
from .helpers import _claim_one, _expect, _race, _rule, _settle, _update

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


@_rule("fenced")
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


@_rule("fenced")
def racing_claimers_drain_the_backlog_exactly_once(h: _Harness) -> None:
    """8 threads claiming and settling until nothing is due take every update exactly once between them."""
    s = h.store
    ids = _record_lines(h, 1, RACERS * 6)

    def drain() -> list[int]:
        taken: list[int] = []
        while True:
            claim = _claim_one(s)
            if claim is None:
                return taken
            taken.append(claim.update_id)
            _expect(_settle(s, claim.identity), f"the live claim of update {claim.update_id} could not settle")

    per_thread = _race(RACERS, drain)
    claimed = [u for taken in per_thread for u in taken]
    _no_duplicates(1, claimed)
    _expect(sorted(claimed) == ids, f"the claimers took {len(set(claimed))} of {len(ids)} updates between them")


@_rule("runtime")
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
