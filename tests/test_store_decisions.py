"""Table tests of the SQLite store's pure decisions (no file, no threads)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from telegram_fence.errors import InvalidUpdate
from telegram_fence.store import Identity
from telegram_fence.store.sqlite.claims import _pick
from telegram_fence.store.values import identities_json, key, lapsed_reason, validate


@pytest.mark.parametrize(
    ("updates", "ids"),
    [
        ([], []),
        ([{"update_id": 0}], [0]),
        ([{"update_id": 5}, {"update_id": 3}], [5, 3]),
        ((dict(update_id=7),), [7]),
    ],
)
def test_validate_returns_the_ids_in_order(updates: Any, ids: list[int]) -> None:
    """validate() returns each update's id in batch order for a well-formed batch."""
    assert validate(updates) == ids


@pytest.mark.parametrize(
    ("updates", "message"),
    [
        ("not a batch", "sequence of update dicts"),
        ({"update_id": 1}, "sequence of update dicts"),
        ([{"update_id": 1}, 5], "update #1 .* is a int, not a mapping"),
        ([{"update_id": -1}], "update #0 .* update_id=-1"),
        ([{"update_id": True}], "update_id=True"),
        ([{"update_id": "3"}], "update_id='3'"),
        ([{"message": {}}], "update_id=None"),
    ],
)
def test_validate_names_the_first_malformed_item(updates: Any, message: str) -> None:
    """validate() raises InvalidUpdate naming what is wrong and where."""
    with pytest.raises(InvalidUpdate, match=message):
        validate(updates)


# candidates (update_id, chat_id, attempt, payload), limit, max_attempts -> picked ids, lapsed ids
PICK = [
    ("one per chat", [(1, 10, 0, None), (2, 10, 0, None), (3, 20, 0, None)], 5, None, [1, 3], []),
    ("chatless all", [(1, None, 0, None), (2, None, 0, None)], 5, None, [1, 2], []),
    ("limit", [(1, 10, 0, None), (2, 20, 0, None), (3, 30, 0, None)], 2, None, [1, 2], []),
    ("spent attempts lapse", [(1, 10, 3, None), (2, 10, 0, None)], 5, 3, [2], [1]),
    ("spent under no max", [(1, 10, 9, None)], 5, None, [1], []),
]


@pytest.mark.parametrize(
    ("candidates", "limit", "max_attempts", "picked", "lapsed"),
    [case[1:] for case in PICK],
    ids=[case[0] for case in PICK],
)
def test_pick_candidates(
    candidates: list[Any], limit: int, max_attempts: int | None, picked: list[int], lapsed: list[int],
) -> None:
    """The claim takes one due row per chat up to limit and lapses rows whose attempts are spent."""
    got, spent = _pick(candidates, limit, max_attempts)
    assert [row[0] for row in got] == picked
    assert all(row[2] == dict((c[0], c[2]) for c in candidates)[row[0]] + 1 for row in got)
    assert [row[0] for row in spent] == lapsed
    assert all(reason == lapsed_reason(3, 3) for _id, reason in spent)


def test_key_takes_only_an_identity() -> None:
    """key() returns the three compared values and refuses a Step-like tuple."""
    assert key(Identity(1, 2, "ab")) == (1, 2, "ab")
    with pytest.raises(TypeError, match="expected an Identity"):
        key((1, 2, "ab"))  # type: ignore[arg-type]


def test_identities_json_reads_back_as_json_dumps_of_the_keys() -> None:
    """The settle list built as text is the array ``json.dumps`` writes of the keys, escapes and odd types included;
    an item that is no Identity is refused as before."""
    identities = [
        Identity(1, 1, "0f1e2d3c4b5a6978"),
        Identity(2**63 - 1, 7, 'quote " and \\ backslash'),
        Identity(3, 2, "lone \ud800 surrogate and é"),
        Identity(4, True, "a bool attempt"),  # type: ignore[arg-type]  # not a plain int: through json.dumps
        Identity(5, 1, 12345),  # type: ignore[arg-type]  # not a str
    ]
    text = identities_json(identities)
    assert text.isascii()
    assert json.loads(text) == json.loads(json.dumps([list(key(i)) for i in identities]))
    assert json.loads(text)[3] == [4, True, "a bool attempt"]
    assert identities_json([]) == "[]"
    with pytest.raises(TypeError):
        identities_json([(1, 1, "x")])  # type: ignore[list-item]
