"""The dispatcher's fast path of the SQLite store: ``exchange`` (settle + claim in one transaction),
claims limited to given chats, and ``write(durable=True)`` around store calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import rows

from telegram_fence.errors import ConfigurationError
from telegram_fence.store.sqlite import SqliteUpdateStore
from telegram_fence.testing.conformance import ManualClock

LEASE = 30.0


def message(update_id: int, chat: int) -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "chat": {"id": chat}, "text": "x"}}


def inline_query(update_id: int) -> dict[str, Any]:
    return {"update_id": update_id, "inline_query": {"id": str(update_id), "query": "q", "offset": ""}}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> Iterator[SqliteUpdateStore]:
    s = SqliteUpdateStore(tmp_path / "bot.db", clock=clock)
    yield s
    s.close()


def ids(claims: list[Any]) -> list[int]:
    return [c.update_id for c in claims]


def test_exchange_settles_and_claims_in_one_call(store: SqliteUpdateStore) -> None:
    """Finished claims are settled and the next updates of those chats claimed; `more` says whether the
    limit cut the claim short."""
    store.record([message(1, 7), message(2, 7), message(3, 8), message(4, 9)], 5)
    settled, first, more = store.exchange([], LEASE, 10)
    assert (settled, ids(first), more) == (0, [1, 3, 4], False)
    settled, second, more = store.exchange([c.identity for c in first], LEASE, 10)
    assert (settled, ids(second), more) == (3, [2], False)
    assert store.exchange([], LEASE, 1) == (0, [], False)
    store.record([message(5, 10), message(6, 11)], 7)
    _, cut, more = store.exchange([], LEASE, 1)
    assert (ids(cut), more) == ([5], True)


def test_claims_for_given_chats_look_only_there(store: SqliteUpdateStore) -> None:
    """With `chats`, only those chats' next updates (and the `chatless` ids given) are candidates; a chat
    with a live claim gives nothing."""
    store.record([message(1, 7), message(2, 8), inline_query(3), inline_query(4), message(5, 9)], 6)
    _, claims, more = store.exchange([], LEASE, 10, chats=[8, 9, 99], chatless=[4])
    assert (ids(claims), more) == ([2, 4, 5], False)
    assert [c.chat_id for c in claims] == [8, None, 9]
    store.record([message(6, 8)], 7)
    _, claims, _ = store.exchange([], LEASE, 10, chats=[8])
    assert claims == []  # update 2 of chat 8 is still live
    _, claims, _ = store.exchange([], LEASE, 10, chats=[], chatless=[])
    assert claims == []
    _, claims, _ = store.exchange([], LEASE, 10)  # a full scan finds the rest
    assert ids(claims) == [1, 3]


def test_a_limit_on_given_chats_takes_the_oldest_updates_once_each(store: SqliteUpdateStore) -> None:
    """Claiming from given chats (and chatless ids) up to a limit takes the lowest update ids of all candidates,
    whatever order the chats are given in; a chat given twice yields its updates once; `more` says the limit cut."""
    store.record([message(9, 70), message(3, 71), inline_query(5), message(1, 72), message(4, 72)], 10)
    _, claims, more = store.exchange([], LEASE, 3, chats=[70, 71, 72, 71], chatless=[5])
    assert (ids(claims), more) == ([1, 3, 5], True)
    _, claims, more = store.exchange([], LEASE, 3, chats=[70, 70], chatless=[5, 5])
    assert (ids(claims), more) == ([9], False)


def test_settling_a_lost_claim_does_not_free_its_chat(store: SqliteUpdateStore, clock: ManualClock) -> None:
    """Settling and claiming in one call frees a chat only for a claim that really gets settled: an identity whose
    lease lapsed and whose update was claimed again settles nothing, and the new claim still holds the chat."""
    store.record([message(1, 7), message(2, 7)], 3)
    _, (old,), _ = store.exchange([], LEASE, 10, chats=[7])
    clock.advance(LEASE + 1)
    _, (again,), _ = store.exchange([], LEASE, 10, chats=[7])
    assert (again.update_id, again.attempt) == (1, 2)
    assert store.exchange([old.identity], LEASE, 10, chats=[7]) == (0, [], False)
    settled, claims, more = store.exchange([again.identity], LEASE, 10, chats=[7])
    assert (settled, ids(claims), more) == (1, [2], False)
    assert claims[0].attempt == 1 and claims[0].identity.claim_id not in {old.identity.claim_id,
                                                                          again.identity.claim_id}
    assert store.exchange([again.identity], LEASE, 10, chats=[7]) == (0, [], False)  # settled once only


def test_spent_rows_are_left_to_the_full_scan(store: SqliteUpdateStore, clock: ManualClock) -> None:
    """A targeted claim never hands out an update whose attempts are spent; the full scan exhausts it."""
    store.record([message(1, 7), message(2, 7)], 3)
    _, claims, _ = store.exchange([], LEASE, 10, max_attempts=1)
    assert ids(claims) == [1]
    clock.advance(LEASE + 1)  # the only attempt lapsed
    _, claims, _ = store.exchange([], LEASE, 10, max_attempts=1, chats=[7])
    assert claims == []
    _, claims, more = store.exchange([], LEASE, 10, max_attempts=1)
    assert ids(claims) == [2] and more  # 1 was exhausted on the way: chat 7 may have more
    assert store.stats()["exhausted"] == 1


def test_store_calls_inside_write_join_its_transaction(store: SqliteUpdateStore) -> None:
    """record() and exchange() inside write(durable=True) commit together, at the inbox's level; a call
    that raises inside undoes only its own writes; record() inside a less durable write() is refused."""
    seen: dict[str, int] = {}
    with store.write() as conn:
        conn.execute("CREATE TABLE t(x)")
    with store.write(durable=True) as conn:
        store.record([message(1, 7)], 2, on_record=lambda c, new: seen.__setitem__("nested", c.pragma("synchronous")))
        assert conn.in_transaction
        conn.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(RuntimeError):
            store.record([message(2, 8)], 3, on_record=lambda c, new: (_ for _ in ()).throw(RuntimeError("x")))
        _, claims, _ = store.exchange([], LEASE, 10)
    assert seen == {"nested": 2}
    assert ids(claims) == [1]
    assert store.next_offset() == 2 and store.stats()["pending"] == 0 and store.stats()["claimed"] == 1
    assert rows(store, "SELECT x FROM t") == [(1,)]
    with store.write() as conn:
        assert conn.pragma("synchronous") == 1
        with pytest.raises(ConfigurationError, match=r"write\(durable=True\)"):
            store.record([message(3, 9)], 4)
    assert store.next_offset() == 2


def test_a_failed_round_stores_nothing_of_it(store: SqliteUpdateStore) -> None:
    """When the block around record() and exchange() raises, neither the batch nor the claims stay."""
    store.record([message(1, 7)], 2)
    with pytest.raises(KeyError), store.write(durable=True):
        store.record([message(2, 8)], 3)
        store.exchange([], LEASE, 10)
        raise KeyError("commit failed")
    assert store.next_offset() == 2
    assert store.stats()["pending"] == 1 and store.stats()["claimed"] == 0


def stored(store: SqliteUpdateStore) -> dict[int, tuple[int, int]]:
    """update_id -> (state, attempt) of every row."""
    found = rows(store, "SELECT update_id, state, attempt FROM fence_updates")
    return {update_id: (state, attempt) for update_id, state, attempt in found}


# --- body: the payloads taken from Telegram's answer -------------------------------------------------


def payloads(store: SqliteUpdateStore) -> dict[int, Any]:
    found = rows(store, "SELECT update_id, payload FROM fence_updates")
    return {update_id: json.loads(payload) for update_id, payload in found}


def test_record_takes_the_payloads_from_the_answer_it_is_given(store: SqliteUpdateStore) -> None:
    """With `body`, the stored payloads are Telegram's own text of each update (escapes as sent), and
    they decode to the same dicts; claims work as usual."""
    batch = [message(1, 7), {**message(2, 8), "message": {**message(2, 8)["message"], "text": "é \\ \" ✓"}},
             inline_query(3)]
    body = json.dumps({"ok": True, "result": batch}, ensure_ascii=True).encode()
    new = store.record(json.loads(body)["result"], 4, body=body)
    _settled, claims, _more = store.exchange([], LEASE, 2)
    assert new == 3 and ids(claims) == [1, 2]
    assert payloads(store) == {u["update_id"]: u for u in batch}
    raw = dict(rows(store, "SELECT update_id, payload FROM fence_updates"))
    assert "\\u00e9" in raw[2]  # taken from the answer, not encoded again (which would write "é")
    assert stored(store) == {1: (1, 1), 2: (1, 1), 3: (0, 0)}


def test_an_answer_sqlite_cannot_read_falls_back_to_encoding_the_updates(store: SqliteUpdateStore) -> None:
    """A body SQLite's JSON reader refuses costs only speed: the dicts are encoded and stored instead."""
    batch = [message(1, 7), message(2, 8)]
    assert store.record(batch, 3, body=b"{not json") == 2
    assert payloads(store) == {1: batch[0], 2: batch[1]}
    assert store.next_offset() == 3
    # JSON that Python reads but that is not UTF-8 (json.loads accepts UTF-16 bytes): encoded as well.
    later = [message(3, 7)]
    utf16 = json.dumps({"ok": True, "result": later}).encode("utf-16")
    assert json.loads(utf16)["result"] == later
    assert store.record(later, 4, body=utf16) == 1
    assert payloads(store)[3] == later[0]
