"""The PostgreSQL store's one-trip record on a real server: the payloads taken from Telegram's answer (``body=``) and
every way back to the encoded payloads, the claims at insert naming the right updates when a batch repeats an id, and
the one statement's writes inside a ``write()`` (one savepoint: a refused record leaves the rest of the transaction)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pg_support import (
    pg_store,  # noqa: F401  (the store fixture)
    requires_pg,
)

from telegram_fence.store.postgres.recording import text_of
from telegram_fence.store.values import encode

pytestmark = requires_pg

LEASE = 30.0


def _update(update_id: int, chat: int, text: str = "x") -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0,
                                                "chat": {"id": chat, "type": "private"}, "text": text}}


def _answer(items: list[str]) -> bytes:
    """A getUpdates answer holding ``items`` (JSON texts) as Telegram writes it."""
    return ('{"ok":true,"result":[' + ",".join(items) + "]}").encode()


def _payloads(store: Any) -> dict[int, str]:
    with store.read() as conn:
        return dict(conn.execute(f"SELECT update_id, payload FROM {store.table}").fetchall())


def test_the_store_takes_the_answers_own_texts(store: Any) -> None:
    """With ``body`` a fresh batch is stored as the answer's texts (spacing and escapes as Telegram wrote them, not
    as Python would encode them), the claims carry the decoded updates, the cursor rises."""
    items = ['{ "update_id": 1, "message": {"message_id": 1, "date": 0, "chat": {"id": 7, "type": "private"}, '
             '"text": "caf\\u00e9"}}',
             '{"update_id":2,"message":{"message_id":2,"date":0,"chat":{"id":8,"type":"private"},"text":"b"}}']
    updates = [json.loads(item) for item in items]
    assert store.accepts_body is True
    new, claims = store.record_and_claim(updates, 3, lease=LEASE, limit=10, body=_answer(items))
    assert new == 2
    assert [(c.update_id, c.update) for c in claims] == [(1, updates[0]), (2, updates[1])]
    assert _payloads(store) == {1: items[0], 2: items[1]}
    assert store.next_offset() == 3


def test_an_answer_the_server_cannot_use_is_encoded_instead(store: Any) -> None:
    """An answer holding other ids, an answer the server does not read as JSON (an escaped lone surrogate, which a
    text column still stores), a batch with an id stored before, and bytes that are not UTF-8: each batch is stored
    from the encoded updates, whole, with its conflicts counted once."""
    mismatched = [_update(1, 1), _update(2, 2)]
    assert store.record(mismatched, 3, body=_answer([json.dumps(_update(5, 1)), json.dumps(_update(6, 2))])) == 2
    lone_item = '{"update_id":3,"message":{"message_id":3,"date":0,"chat":{"id":3,"type":"private"},"text":"\\ud800"}}'
    lone = json.loads(lone_item)  # Python reads the lone surrogate; PostgreSQL's json does not
    assert store.record([lone], 4, body=_answer([lone_item])) == 1
    again = [_update(2, 2, "other"), _update(4, 4)]
    assert store.record(again, 5, body=_answer([json.dumps(u, separators=(",", ":")) for u in again])) == 1
    assert store.record([_update(9, 9)], 10, body=b'{"ok":true,"result":[\xff]}') == 1
    stored = _payloads(store)
    for update in [*mismatched, lone, again[1], _update(9, 9)]:
        assert stored[update["update_id"]] == encode(update, 0), update["update_id"]
    assert store.stats()["payload_conflicts"] == 1
    assert store.next_offset() == 10


def test_only_the_result_array_of_an_answer_written_as_telegram_writes_it_is_taken() -> None:
    """The text the server reads the payloads from is the answer's ``result`` array, cut out of an answer written
    ``{"ok":true,"result":[...]}``; any other writing of the answer gives none (the payloads are encoded)."""
    assert text_of(b'{"ok":true,"result":[{"update_id":1},{"update_id":2}]}') == '[{"update_id":1},{"update_id":2}]'
    assert text_of('{"ok":true,"result":[]}') == "[]"
    for other in (b'{"ok": true, "result": [{"update_id":1}]}', b'{"result":[{"update_id":1}],"ok":true}',
                  b'{"ok":true,"result":[{"update_id":1}]} ', b'{"ok":true,"result":[\xff]}',
                  '{"ok":true,"result":[{"update_id":1,"t":"\x00"}]}'):
        assert text_of(other) is None, other


def test_an_answer_with_more_after_its_result_is_encoded_instead(store: Any) -> None:
    """An answer whose ``result`` is followed by another array (its text still ends ``]}``): what is cut out is not
    one JSON array, the server refuses it, and the batch is stored from the encoded updates, whole."""
    batch = [_update(1, 1), _update(2, 2)]
    items = ",".join(json.dumps(u) for u in batch)  # (spaced: not the encoded texts)
    body = ('{"ok":true,"result":[' + items + '],"more":[1]}').encode()
    new, claims = store.record_and_claim(batch, 3, lease=LEASE, limit=10, body=body)
    assert new == 2
    assert [c.update_id for c in claims] == [1, 2]
    assert _payloads(store) == {u["update_id"]: encode(u, 0) for u in batch}
    assert encode(batch[0], 0) != json.dumps(batch[0])


def test_claims_at_insert_name_their_own_updates_when_a_batch_repeats_an_id(store: Any) -> None:
    """A batch holding an id twice (the first kept, counted as a conflict) claims its free chats' updates with
    the dicts of those updates, with and without the answer's body."""
    for base, with_body in ((10, False), (20, True)):
        batch = [_update(base, base), _update(base, base, "again"), _update(base + 1, base + 1),
                 _update(base + 2, base + 2)]
        body = _answer([json.dumps(u) for u in batch]) if with_body else None
        new, claims = store.record_and_claim(batch, base + 3, lease=LEASE, limit=10, body=body)
        assert new == 3
        assert [(c.update_id, c.update) for c in claims] == [(base, batch[0]), (base + 1, batch[2]),
                                                              (base + 2, batch[3])]
        assert all(store.owns(c.identity) for c in claims)
    assert store.stats()["payload_conflicts"] == 2


def test_a_record_inside_write_joins_the_transaction(store: Any) -> None:
    """Inside ``write()`` the record is one savepoint of the transaction: rolled back with it, committed with it;
    a chat with an open row gets no claim at insert (its update waits behind it)."""
    with pytest.raises(RuntimeError), store.write(durable=True):
        store.record_and_claim([_update(1, 1)], 2, lease=LEASE, limit=10)
        raise RuntimeError("the application's block failed")
    assert _payloads(store) == {} and store.next_offset() == 0
    with store.write(durable=True):
        new, claims = store.record_and_claim([_update(1, 1), _update(2, 1), _update(3, 2)], 4, lease=LEASE,
                                             limit=10, run=1)
        assert (new, [c.update_id for c in claims]) == (3, [1, 3])
        again, none = store.record_and_claim([_update(5, 1)], 6, lease=LEASE, limit=10)
        assert (again, none) == (1, [])
    assert sorted(_payloads(store)) == [1, 2, 3, 5] and store.next_offset() == 6
