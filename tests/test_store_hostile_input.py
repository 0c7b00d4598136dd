"""Hostile input has one outcome on every backend: each test runs unchanged on SQLite and on PostgreSQL.

An update the store cannot keep as it is becomes an exhaustion (``on_exhausted`` is told), the rest of its
batch is stored and the cursor moves: no input makes ``record`` refuse a batch that Telegram will send again.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import eventually, needs_recursion_bound_json
from pg_support import DSN, store_of
from store_helpers import claim_up_to, settle_one

from telegram_fence.store import Identity
from telegram_fence.store.values import MAX_DEPTH, TOO_DEEP_TO_DECODE
from telegram_fence.testing.conformance import ManualClock
from telegram_fence.updates import UnreadableUpdate

BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.skipif(DSN is None, reason="TELEGRAM_FENCE_PG_DSN is not set")),
]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh store of each backend, on a manual clock."""
    with store_of(request.param, tmp_path, "tf_hostile", clock=ManualClock()) as store:
        yield store


def message(update_id: int, chat: int, text: str = "hi") -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {"message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"}, "text": text},
    }


def nested(depth: int) -> Any:
    """A list nested ``depth`` levels deep."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def claimed(store: Any, limit: int = 50) -> dict[int, Any]:
    """Every update claimable now, by id."""
    return {claim.update_id: claim for claim in claim_up_to(store, 30.0, limit)}


def test_a_lone_surrogate_is_stored_and_handled_as_sent(store: Any) -> None:
    """An update whose text holds a lone surrogate is stored with the rest of its batch and decodes as it came."""
    assert store.record([message(1, 10, "a\ud800b"), message(2, 20)], 3) == 2
    claims = claimed(store)
    assert store.next_offset() == 3 and sorted(claims) == [1, 2]
    assert claims[1].update["message"]["text"] == "a\ud800b"


def test_nan_and_infinity_are_stored_as_null_and_infinity(store: Any) -> None:
    """NaN is stored as null and the infinities as ±9e999 (±inf again), never refusing the batch."""
    hostile = {**message(1, 10), "x": [math.nan, math.inf, -math.inf, 1.5]}
    assert store.record([hostile, message(2, 20)], 3) == 2
    claims = claimed(store)
    assert sorted(claims) == [1, 2]
    assert claims[1].update["x"] == [None, math.inf, -math.inf, 1.5]


def test_a_chat_id_beyond_64_bits_is_stored_without_a_chat(store: Any) -> None:
    """A chat id no 64-bit column holds leaves the update chatless (its own line); payload and batch are kept."""
    assert store.record([message(1, 2**70), message(2, -(2**70)), message(3, 30)], 4) == 3
    claims = claimed(store)
    assert sorted(claims) == [1, 2, 3]
    assert claims[1].chat_id is None and claims[1].update["message"]["chat"]["id"] == 2**70
    assert claims[3].chat_id == 30


def test_an_unreadable_update_becomes_an_exhaustion_and_the_batch_is_stored(store: Any) -> None:
    """An item the answer's reader could not parse is kept as an exhaustion with its reason, never handled."""
    seen: list[int] = []
    batch = [message(1, 10), UnreadableUpdate(2, "the update nests too deep to be read"), message(3, 30)]
    new = store.record(batch, 4, on_record=lambda conn, fresh: seen.extend(u["update_id"] for u in fresh))
    assert new == 3 and store.next_offset() == 4 and seen == [1, 3]
    assert sorted(claimed(store)) == [1, 3]
    (exhaustion,) = store.due_exhaustions()
    assert exhaustion.identity.update_id == 2 and dict(exhaustion.update) == {"update_id": 2}
    assert exhaustion.error == "the update nests too deep to be read"


def test_an_update_deeper_than_the_bound_becomes_an_exhaustion(store: Any) -> None:
    """An update nesting deeper than MAX_DEPTH is an exhaustion on every backend; the batch is stored and claimed."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        new = store.record(
            [{"update_id": 7, "deep": nested(MAX_DEPTH + 1), "message": {"chat": {"id": 9}}}, message(8, 8)], 9
        )
        claims = claim_up_to(store, 30.0, 5)
    finally:
        sys.setrecursionlimit(limit)
    assert new == 2 and [c.update_id for c in claims] == [8]
    (exhaustion,) = store.due_exhaustions()
    assert exhaustion.identity.update_id == 7 and dict(exhaustion.update) == {"update_id": 7}
    assert f"nests too deep to be stored (at most {MAX_DEPTH} levels are kept)" in exhaustion.error


def test_an_update_at_the_bound_is_stored_and_handled(store: Any) -> None:
    """An update exactly MAX_DEPTH levels deep (counting the update itself) is stored and claimed with its payload."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        assert store.record([{"update_id": 7, "deep": nested(MAX_DEPTH - 1)}], 8) == 1
        (claim,) = claim_up_to(store, 30.0, 5)
    finally:
        sys.setrecursionlimit(limit)
    assert claim.update_id == 7 and "deep" in claim.update
    assert store.due_exhaustions() == []


@needs_recursion_bound_json
def test_a_payload_too_deep_to_decode_at_claim_time_becomes_an_exhaustion(store: Any) -> None:
    """A stored payload Python cannot decode where it is claimed is exhausted (TOO_DEEP_TO_DECODE), not raised."""
    assert store.record([{"update_id": 5, "deep": nested(600)}, message(6, 60)], 7) == 2
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)  # the claiming thread's stack is now too shallow for the payload
    try:
        claims = claim_up_to(store, 30.0, 5)
    finally:
        sys.setrecursionlimit(limit)
    assert [c.update_id for c in claims] == [6]
    (exhaustion,) = store.due_exhaustions()
    assert exhaustion.identity.update_id == 5 and exhaustion.error == TOO_DEEP_TO_DECODE
    assert claim_up_to(store, 30.0, 5) == []


def test_error_texts_with_lone_surrogates_are_kept(store: Any) -> None:
    """retry_owned, exhaust and end_generation keep an error text holding a lone surrogate (escaped), never raise."""
    store.record([message(1, 10), message(2, 20)], 3)
    first, second = sorted(claim_up_to(store, 30.0, 5), key=lambda c: c.update_id)
    assert store.retry_owned(first.identity, 0.0, "bad \ud800 text")
    assert store.exhaust(second.identity, "worse \udfff text")
    (exhaustion,) = store.due_exhaustions()
    assert exhaustion.error == "worse \\udfff text"
    generation = store.begin_generation()
    store.end_generation(generation, "ended \ud800")
    assert store.stats()["generation"]["end_reason"] == "ended \\ud800"


def test_an_update_id_again_with_another_payload_is_kept_first_counted_and_warned(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The first payload of an update id is kept; each later different one counts in stats() and logs the id."""
    store.record([message(41, 10, "first")], 42)
    with caplog.at_level(logging.WARNING, logger="telegram_fence.store"):
        assert store.record([message(41, 10, "second"), message(43, 10)], 44) == 1
        assert store.record([message(41, 10, "first")], 44) == 0  # the same payload again: no conflict
        assert store.record([message(41, 10, "third")], 44) == 0
    warnings = [r.getMessage() for r in caplog.records if "different payload" in r.getMessage()]
    assert warnings == ["update 41 recorded again with a different payload; the first is kept"] * 2
    assert store.stats()["payload_conflicts"] == 2
    claims = claimed(store)
    assert claims[41].update["message"]["text"] == "first"


def test_an_update_id_twice_in_one_batch_with_another_payload_is_kept_first_counted_and_warned(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """One batch holding an update id twice with different payloads (and once more exactly repeated) stores the
    first, counts one conflict in stats() and logs the id once (before: repeats inside a batch went uncounted)."""
    batch = [message(51, 10, "first"), message(52, 20), message(51, 10, "second"), message(52, 20)]
    with caplog.at_level(logging.WARNING, logger="telegram_fence.store"):
        new = store.record(batch, 53)
    assert new == 2
    warnings = [r.getMessage() for r in caplog.records if "different payload" in r.getMessage()]
    assert warnings == ["update 51 recorded again with a different payload; the first is kept"]
    assert store.stats()["payload_conflicts"] == 1
    assert claimed(store)[51].update["message"]["text"] == "first"


def test_a_batch_meeting_stored_ids_inside_one_write_block_stores_only_the_new_ones(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Inside one write block, a batch whose ids interleave ids stored earlier in the block (one with another
    payload) stores only its new ids, warns about and counts the conflict once, and leaves the block's
    earlier writes as they were."""
    with store.write(durable=True):
        assert store.record([message(10, 1), message(12, 2, "first")], 0) == 2
        with caplog.at_level(logging.WARNING, logger="telegram_fence.store"):
            new = store.record([message(11, 3), message(12, 2, "second"), message(13, 4)], 0)
    assert new == 2
    warnings = [r.getMessage() for r in caplog.records if "different payload" in r.getMessage()]
    assert warnings == ["update 12 recorded again with a different payload; the first is kept"]
    assert store.stats()["payload_conflicts"] == 1
    claims = claimed(store)
    assert sorted(claims) == [10, 11, 12, 13]
    assert claims[12].update["message"]["text"] == "first"


def test_stats_have_one_shape(store: Any) -> None:
    """stats() has the same keys on every backend (PostgreSQL adds its poll leader)."""
    store.record([message(1, 10)], 2)
    keys = set(store.stats()) - {"leader"}
    assert keys == {
        "pending", "claimed", "settled", "skipped", "exhausted", "acknowledged", "cursor", "oldest_open_age",
        "generation", "schema_version", "payload_conflicts", "backend",
    }


def test_identities_of_another_type_are_refused_alike(store: Any) -> None:
    """A fenced call given something other than an Identity raises TypeError on every backend."""
    with pytest.raises(TypeError, match="expected an Identity"):
        settle_one(store, (1, 1, "x"))
    assert settle_one(store, Identity(1, 1, "x")) is False


def test_exhaustions_found_while_recording_are_announced_after_the_commit(store: Any) -> None:
    """An exhaustion the store makes of an update it cannot keep tells its listeners after the commit (a listener
    may also be told at other times, e.g. when PostgreSQL's notice session connects: it then finds nothing new)."""
    told: list[int] = []
    remove = store.add_exhaustion_listener(lambda: told.append(len(store.due_exhaustions())))
    store.record([message(1, 10)], 2)
    assert set(told) <= {0}
    store.record([UnreadableUpdate(3, "unreadable"), message(4, 40)], 5)
    assert eventually(lambda: 1 in told)  # told after the commit: the listener already sees the exhaustion
    remove()
