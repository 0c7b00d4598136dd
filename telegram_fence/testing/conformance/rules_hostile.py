"""Conformance rules for hostile inputs: values JSON allows but UTF-8 or a 64-bit column does not come back as they
came, and an unreadable update becomes an exhaustion, never a stalled batch.
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import InvalidUpdate
from ...updates import UnreadableUpdate
from .harness import _Harness
from .helpers import _claim_one, _drain, _expect, _rule, _update


def _deep(levels: int) -> dict[str, Any]:
    """A dict nested ``levels`` deep (deeper than Python's JSON encoder goes)."""
    top: dict[str, Any] = {}
    node = top
    for _ in range(levels):
        node["a"] = {}
        node = node["a"]
    return top


@_rule("base")
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


@_rule("base")
def update_id_beyond_64_bits_is_refused(h: _Harness) -> None:
    """An update_id beyond 64 bits raises InvalidUpdate and stores nothing of the batch; the cursor stays."""
    s = h.store
    s.record([_update(1)], 2)
    try:
        s.record([_update(5), {**_update(6), "update_id": 2**63}], 2**63 + 1)
    except InvalidUpdate as exc:
        _expect(str(exc), "InvalidUpdate for a huge update_id has an empty message")
    else:
        raise AssertionError("record() accepted update_id 2**63 instead of raising InvalidUpdate")
    _expect(s.next_offset() == 2, f"a refused batch moved the cursor to {s.next_offset()}")
    _expect(_drain(s) == [1], "a refused batch stored some of its updates")


@_rule("durable")
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
