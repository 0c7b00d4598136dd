"""The store against hostile answers and odd settings: every accepted setting runs, a poison
update never stalls the inbox, the cursor never passes an unstored update, claims keep per-chat order,
renewals match the full identity, refused updates are never captured."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
import telebot
from helpers import eventually, make_fence, needs_recursion_bound_json, rows, stop
from store_helpers import claim_one, claim_up_to

from telegram_fence import Fence
from telegram_fence.errors import InvalidUpdate
from telegram_fence.store.sqlite import SqliteUpdateStore
from telegram_fence.testing import FakeBotAPI
from telegram_fence.testing.conformance import ManualClock

LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")


def run_fence(bot: telebot.TeleBot, store: Any, **options: Any) -> Fence:
    options.setdefault("lease", 5.0)
    return make_fence(bot, store, **options)


def message(update_id: int, chat: int, text: str = "hi") -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {"message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"}, "text": text},
    }


# --- item 1: every synchronous combination the constructor accepts runs ----------------------------


@pytest.mark.parametrize(("synchronous", "work_synchronous"), list(itertools.product(LEVELS, LEVELS)))
def test_every_accepted_synchronous_combination_handles_updates(
    api: FakeBotAPI, bot: telebot.TeleBot, tmp_path: Path, synchronous: str, work_synchronous: str
) -> None:
    """A fence on a store with any pair of synchronous levels records its batches and handles every update."""
    store = SqliteUpdateStore(tmp_path / "bot.db", synchronous=synchronous, work_synchronous=work_synchronous)
    handled: list[int] = []

    @bot.message_handler(func=lambda m: True)
    def echo(message: telebot.types.Message) -> None:
        handled.append(message.message_id)

    ids = api.push_messages(12, chats=[1, 2, 3])
    fence = run_fence(bot, store)
    fence.start()
    try:
        assert eventually(lambda: len(handled) == len(ids), timeout=15), fence.stats()
    finally:
        stop(fence)
    assert store.stats()["settled"] == len(ids)
    store.close()


def test_durable_write_takes_the_stronger_level(tmp_path: Path) -> None:
    """write(durable=True) lets both record() and the work-level calls join it whichever level is stronger."""
    for synchronous, work_synchronous in (("NORMAL", "FULL"), ("FULL", "NORMAL"), ("OFF", "NORMAL")):
        store = SqliteUpdateStore(tmp_path / f"{synchronous}-{work_synchronous}.db", clock=ManualClock(),
                                  synchronous=synchronous, work_synchronous=work_synchronous)
        with store.write(durable=True):
            store.record([message(1, 1)], 2)
            settled, claims, _more = store.exchange([], 30.0, 5)
        assert settled == 0 and [c.update_id for c in claims] == [1]
        assert store.next_offset() == 2
        store.close()


# --- item 5 of the issue: a lone surrogate (or NaN) never stalls the inbox ---------------------------

SURROGATE_UPDATE = {
    "update_id": 1,
    "message": {"message_id": 1, "date": 0, "chat": {"id": 7, "type": "private"}, "text": "a\ud800b"},
    "odd \udc01 key": ["\udfff"],
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteUpdateStore]:
    s = SqliteUpdateStore(tmp_path / "bot.db", clock=ManualClock())
    yield s
    s.close()


def test_lone_surrogates_are_stored_and_read_back_unchanged(store: SqliteUpdateStore) -> None:
    """An update holding lone surrogates (what JSON's "\\ud800" decodes to) is stored and claimed back equal."""
    assert store.record([SURROGATE_UPDATE], 2) == 1
    claim = claim_one(store, 30.0)
    assert claim is not None and claim.update == SURROGATE_UPDATE
    assert store.next_offset() == 2


def test_lone_surrogates_in_the_answer_body_round_trip(store: SqliteUpdateStore) -> None:
    """The same update taken from the answer's bytes (the escape as Telegram sent it) reads back equal."""
    body = json.dumps({"ok": True, "result": [SURROGATE_UPDATE]}).encode()
    updates = json.loads(body)["result"]
    assert store.record(updates, 2, body=body) == 1
    claim = claim_up_to(store, 30.0, 5)
    assert [c.update for c in claim] == [SURROGATE_UPDATE]


def test_nan_and_infinity_are_stored_instead_of_stalling(store: SqliteUpdateStore) -> None:
    """NaN and infinities (accepted by Python's JSON reader) are stored as SQLite reads them: null and 9e999."""
    store.record([{"update_id": 3, "a": float("nan"), "b": float("inf"), "c": -float("inf")}], 4)
    claim = claim_one(store, 30.0)
    assert claim is not None and claim.update == {"update_id": 3, "a": None, "b": float("inf"), "c": -float("inf")}


def test_error_texts_with_lone_surrogates_are_stored(store: SqliteUpdateStore) -> None:
    """A retry or exhaustion whose error text holds a lone surrogate is stored (escaped), not refused."""
    store.record([message(1, 1), message(2, 2)], 3)
    first, second = claim_up_to(store, 30.0, 2)
    assert store.retry_owned(first.identity, 0.0, "bad \ud800 text")
    assert store.exhaust(second.identity, "worse \udfff text")
    (exhaustion,) = store.due_exhaustions()
    assert exhaustion.error == "worse \\udfff text"
    generation = store.begin_generation()
    store.end_generation(generation, "ended \ud801")
    assert store.stats()["generation"]["end_reason"] == "ended \\ud801"


def nested(depth: int) -> list[Any]:
    """A list nested ``depth`` levels deep."""
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_an_update_too_deep_to_encode_becomes_an_exhaustion_not_a_stall(store: SqliteUpdateStore) -> None:
    """An update nesting deeper than Python can encode is stored as an exhaustion; the rest of the batch is stored."""
    seen: list[int] = []
    poison = {"update_id": 2, "deep": nested(5000)}
    batch = [message(1, 1), poison, message(3, 3)]
    new = store.record(batch, 4, on_record=lambda conn, new: seen.extend(u["update_id"] for u in new))
    assert new == 3 and store.next_offset() == 4 and seen == [1, 3]
    assert sorted(c.update_id for c in claim_up_to(store, 30.0, 5)) == [1, 3]
    (exhaustion,) = store.due_exhaustions()
    assert exhaustion.identity.update_id == 2 and dict(exhaustion.update) == {"update_id": 2}
    assert "nests too deep" in exhaustion.error


def test_an_update_sqlite_cannot_read_becomes_an_exhaustion_not_a_stall(store: SqliteUpdateStore) -> None:
    """An update Python encodes but SQLite cannot read (deeper than its JSON limit) is exhausted, never claimed.

    The bound is the store-neutral one (``store.values.MAX_DEPTH``, SQLite's reader less the batch's two levels).
    """
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        new = store.record([{"update_id": 7, "deep": nested(1500), "message": {"chat": {"id": 9}}}, message(8, 8)], 9)
        claims = claim_up_to(store, 30.0, 5)
    finally:
        sys.setrecursionlimit(limit)
    assert new == 2 and [c.update_id for c in claims] == [8]
    (exhaustion,) = store.due_exhaustions()
    assert exhaustion.identity.update_id == 7 and "nests too deep to be stored (at most 998 levels" in exhaustion.error


def test_exhaustions_the_store_finds_itself_are_announced_once_committed(tmp_path: Path) -> None:
    """add_exhaustion_listener is called after each commit that made a store-side exhaustion (an update that
    cannot be stored, attempts spent found at claim time), when it is visible to other connections; never
    for exhaust(), a rolled-back write, or after the listener was removed.
    """
    clock = ManualClock()
    path = tmp_path / "bot.db"
    store = SqliteUpdateStore(path, clock=clock)
    other = SqliteUpdateStore(path, clock=clock)
    seen: list[list[int]] = []
    remove = store.add_exhaustion_listener(
        lambda: seen.append([e.identity.update_id for e in other.due_exhaustions()])
    )
    try:
        store.record([message(1, 1), {"update_id": 2, "deep": nested(5000)}], 3)
        assert seen == [[2]]
        claim = claim_up_to(store, 1.0, 1, max_attempts=1)[0]  # a worker that dies without settling
        assert claim.update_id == 1 and seen == [[2]]
        clock.advance(2.0)
        assert claim_up_to(store, 1.0, 1, max_attempts=1) == []
        assert seen == [[2], [1, 2]]
        store.record([message(4, 4), message(5, 5)], 6)
        assert store.exhaust(claim_up_to(store, 5.0, 1, max_attempts=3)[0].identity, "handler failed")
        assert len(seen) == 2  # the caller's own exhaustion: it knows already
        with pytest.raises(RuntimeError), store.write(durable=True):
            store.record([{"update_id": 7, "deep": nested(5000)}], 8)
            raise RuntimeError("rolled back")
        assert len(seen) == 2
        remove()
        store.record([{"update_id": 9, "deep": nested(5000)}], 10)
        assert len(seen) == 2
    finally:
        other.close()
        store.close()


def test_an_unreadable_update_is_kept_as_an_exhaustion_with_its_reason(store: SqliteUpdateStore) -> None:
    """An UnreadableUpdate in a batch is stored as an exhaustion holding only its update_id and reason (even if
    listed in skip, even with a body), never claimed or passed to on_record; the rest of the batch is stored.
    """
    from telegram_fence.updates import UnreadableUpdate

    seen: list[int] = []
    batch = [message(1, 1), UnreadableUpdate(2, "too deep to read"), message(3, 3)]
    body = json.dumps({"ok": True, "result": [message(1, 1), {"update_id": 2, "real": "payload"}, message(3, 3)]})
    new = store.record(batch, 4, skip={2}, body=body,
                       on_record=lambda conn, new: seen.extend(u["update_id"] for u in new))
    assert new == 3 and seen == [1, 3]
    assert sorted(c.update_id for c in claim_up_to(store, 30.0, 5)) == [1, 3]
    assert claim_up_to(store, 30.0, 5) == []
    (exhaustion,) = store.due_exhaustions()
    assert exhaustion.identity.update_id == 2 and dict(exhaustion.update) == {"update_id": 2}
    assert exhaustion.error == "too deep to read"


@needs_recursion_bound_json
@pytest.mark.parametrize("claim", ["scan", "one", "chats"])
def test_a_stored_payload_too_deep_for_python_is_exhausted_at_claim_not_a_stall(
    store: SqliteUpdateStore, claim: str
) -> None:
    """A payload SQLite stored from Telegram's bytes but Python cannot decode (990 levels) becomes, when a claim
    reaches it, an exhaustion holding only its update_id; the claim goes on with the next update, on every path.
    """
    deep = "[" * 990 + "]" * 990
    body = ('{"ok":true,"result":[{"update_id":1,"message":{"chat":{"id":1}},"d":' + deep + "},"
            '{"update_id":2,"message":{"chat":{"id":2}}}]}')
    parsed = [{"update_id": 1, "message": {"chat": {"id": 1}}}, {"update_id": 2, "message": {"chat": {"id": 2}}}]
    assert store.record(parsed, 3, body=body) == 2  # the poller's reader (a shallower stack) parsed it
    if claim == "scan":
        claims = claim_up_to(store, 30.0, 5)
    elif claim == "one":
        claims = [c for c in [claim_one(store, 30.0)] if c is not None]
    else:
        _settled, claims, _more = store.exchange([], 30.0, 5, chats=[1, 2])
    assert [(c.update_id, dict(c.update)) for c in claims] == [(2, parsed[1])]
    (exhaustion,) = store.due_exhaustions()
    assert exhaustion.identity.update_id == 1 and dict(exhaustion.update) == {"update_id": 1}
    assert "too deep to be decoded" in exhaustion.error


def test_an_update_that_is_not_json_data_is_still_refused(store: SqliteUpdateStore) -> None:
    """A caller's update holding a set (not JSON data) still raises InvalidUpdate and stores nothing."""
    with pytest.raises(InvalidUpdate, match="cannot be stored as JSON"):
        store.record([message(1, 1), {"update_id": 2, "tags": {"a"}}], 3)
    assert store.next_offset() == 0 and store.stats()["pending"] == 0


@pytest.mark.parametrize(("update_id", "next_offset"), [(2**63, 2**63 + 1), (5, 2**63), (2**70, 6)])
def test_ids_beyond_64_bits_are_refused_with_invalid_update(
    store: SqliteUpdateStore, update_id: int, next_offset: int
) -> None:
    """An update_id or offset SQLite cannot hold raises InvalidUpdate (not an OverflowError); nothing is stored."""
    with pytest.raises(InvalidUpdate, match="below 2\\*\\*63"):
        store.record([message(update_id, 1)], next_offset)
    assert store.next_offset() == 0


def surrogate_answer(update_id: int, chat: int) -> bytes:
    """A getUpdates answer whose one message text holds a lone surrogate escape, as raw JSON bytes."""
    return (
        b'{"ok":true,"result":[{"update_id":%d,"message":{"message_id":%d,"date":0,'
        b'"chat":{"id":%d,"type":"private"},"from":{"id":%d,"is_bot":false,"first_name":"x"},'
        b'"text":"poison \\ud800 here"}}]}' % (update_id, update_id, chat, chat)
    )


def test_a_lone_surrogate_in_an_answer_does_not_stall_a_capturing_fence(
    api: FakeBotAPI, bot: telebot.TeleBot, tmp_path: Path
) -> None:
    """A fence that captures (the dicts are encoded again) records the poison answer and the updates after it."""
    from telegram_fence.delivery.outbox import CaptureRule

    store = SqliteUpdateStore(tmp_path / "bot.db")
    handled: list[str] = []

    @bot.message_handler(func=lambda m: True)
    def echo(message: telebot.types.Message) -> None:
        handled.append(message.text)

    api.malformed("getUpdates", body=surrogate_answer(1, 5))
    fence = run_fence(bot, store, capture=CaptureRule(authorize=lambda update: True))
    fence.start()
    try:
        assert eventually(lambda: len(handled) == 1, timeout=15), fence.stats()
        after = api.push_message(5, "after")
        assert eventually(lambda: len(handled) == 2, timeout=15), fence.stats()
    finally:
        stop(fence)
    assert handled == ["poison \ud800 here", "after"]
    outbox = rows(store, "SELECT update_id, payload FROM fence_outbox ORDER BY update_id")
    assert [r[0] for r in outbox] == [1, after]
    assert json.loads(outbox[0][1])["text"] == "poison \ud800 here"
    store.close()


# --- item 7: the ids stored are the ids the cursor passes ------------------------------------------


def test_an_answer_with_two_result_keys_stores_the_parsed_updates(store: SqliteUpdateStore) -> None:
    """With two "result" keys the updates Python parsed (the last) are stored, not SQLite's pick (the first)."""
    first = [message(10, 1, "first")]
    last = [message(11, 1, "last"), message(12, 2, "last")]
    body = f'{{"ok":true,"result":{json.dumps(first)},"result":{json.dumps(last)}}}'.encode()
    updates = json.loads(body)["result"]
    assert [u["update_id"] for u in updates] == [11, 12]
    assert store.record(updates, 13, body=body) == 2
    ids = [row[0] for row in rows(store, "SELECT update_id FROM fence_updates ORDER BY update_id")]
    assert ids == [11, 12]
    assert [c.update["message"]["text"] for c in claim_up_to(store, 30.0, 5)] == ["last", "last"]


def test_an_update_with_two_update_id_keys_is_stored_under_the_parsed_id(store: SqliteUpdateStore) -> None:
    """An item with two "update_id" keys is stored under the id Python kept (the one the cursor passes)."""
    body = b'{"ok":true,"result":[{"update_id":20,"update_id":21,"message":{"message_id":1,"date":0,' \
           b'"chat":{"id":3,"type":"private"},"text":"x"}}]}'
    updates = json.loads(body)["result"]
    assert store.record(updates, 22, body=body) == 1
    assert [c.update_id for c in claim_up_to(store, 30.0, 5)] == [21]
    ids = [row[0] for row in rows(store, "SELECT update_id FROM fence_updates")]
    assert ids == [21]


def test_an_answer_with_two_result_keys_is_stored_as_python_reads_it(store: SqliteUpdateStore) -> None:
    """An answer with two "result" keys whose items carry the same ids (SQLite reads the first, Python the last):
    the payload stored, and read back by a later claim, is the one Python parsed and the handler saw."""
    item = '{{"update_id":40,"message":{{"message_id":1,"date":0,"chat":{{"id":3,"type":"private"}},"text":"{}"}}}}'
    body = ('{"ok":true,"result":[' + item.format("first") + '],"r\\u0065sult":[' + item.format("last") + "]}").encode()
    updates = json.loads(body)["result"]
    assert updates[0]["message"]["text"] == "last"
    assert store.record(updates, 41, body=body) == 1
    claim = claim_one(store, 30.0)
    assert claim is not None and claim.update["message"]["text"] == "last"


def test_an_answer_body_shorter_than_the_updates_stores_every_update(store: SqliteUpdateStore) -> None:
    """A body holding fewer items than the parsed updates still leaves every update stored."""
    updates = [message(30, 1), message(31, 2)]
    body = f'{{"ok":true,"result":{json.dumps(updates[:1])}}}'.encode()
    assert store.record(updates, 32, body=body) == 2
    assert {c.update_id for c in claim_up_to(store, 30.0, 5)} == {30, 31}


# --- item 10: renew_many matches the full identity -------------------------------------------------


def test_renew_many_reports_only_the_live_identity(tmp_path: Path) -> None:
    """A stale identity renewed alongside the new claim of the same update is not reported live."""
    clock = ManualClock()
    store = SqliteUpdateStore(tmp_path / "bot.db", clock=clock)
    store.record([message(1, 1)], 2)
    old = claim_one(store, 5.0)
    assert old is not None
    clock.advance(6.0)
    new = claim_one(store, 5.0)
    assert new is not None and new.update_id == old.update_id and new.identity != old.identity
    assert store.renew_many([old.identity, new.identity], 30.0) == {new.identity}
    stale = type(old.identity)(old.update_id, new.attempt, "0" * 24)  # same attempt, other claim id
    assert store.renew_many([stale, new.identity], 30.0) == {new.identity}
    store.close()


# --- item 11: refused updates are never captured ---------------------------------------------------


def test_updates_refused_by_authorize_are_never_captured(
    api: FakeBotAPI, bot: telebot.TeleBot, tmp_path: Path
) -> None:
    """Fence(authorize=...) records a refused sender's update as skipped and writes no capture row for it."""
    from telegram_fence.delivery.outbox import CaptureRule

    store = SqliteUpdateStore(tmp_path / "bot.db")
    handled: list[int] = []

    @bot.message_handler(func=lambda m: True)
    def echo(message: telebot.types.Message) -> None:
        handled.append(message.chat.id)

    allowed = api.push_message(1, "hello")
    refused = api.push_message(2, "secret")
    allowed_too = api.push_message(1, "again")
    fence = run_fence(
        bot, store, authorize=lambda update: update["message"]["chat"]["id"] != 2,
        capture=CaptureRule(authorize=lambda update: True),
    )
    fence.start()
    try:
        assert eventually(lambda: len(handled) == 2 and store.next_offset() > allowed_too, timeout=15)
    finally:
        stop(fence)
    captured = [row[0] for row in rows(store, "SELECT update_id FROM fence_outbox ORDER BY update_id")]
    assert captured == [allowed, allowed_too]
    assert store.stats()["skipped"] == 1 and refused not in captured
    store.close()


def test_record_passes_no_skipped_update_to_the_hook(store: SqliteUpdateStore) -> None:
    """record()'s on_record hook sees the new updates that are not skipped, and record() counts all new ones."""
    seen: list[list[int]] = []

    def hook(conn: apsw.Connection, new: Any) -> None:
        seen.append([u["update_id"] for u in new])

    assert store.record([message(1, 1), message(2, 2), message(3, 3)], 4, skip={2}, on_record=hook) == 3
    assert store.record([message(4, 1), message(5, 5)], 6, skip={5}, on_record=hook) == 2
    assert seen == [[1, 3], [4]]
