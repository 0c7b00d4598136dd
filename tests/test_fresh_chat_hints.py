"""Where the dispatcher looks once a claim is settled: a chat whose update was claimed as it was recorded, with
nothing recorded behind it since, is not looked at again (there is nothing to claim in it: a webhook round then
asks the file nothing but its settle); a chat with an update recorded behind its claim is, so that update is
claimed in the next round without waiting for a full scan.

A real ``WorkerPool`` on a real SQLite file; its dispatcher's rounds called from the test thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telegram_fence.retry import default_retry
from telegram_fence.runtime.attempt import AttemptContext
from telegram_fence.runtime.handoff import RecordRequest
from telegram_fence.runtime.pool import WorkerPool
from telegram_fence.store import Claim
from telegram_fence.store.sqlite import SqliteUpdateStore

LEASE = 30.0


def message(update_id: int, chat: int) -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "chat": {"id": chat}, "text": "x"}}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteUpdateStore]:
    s = SqliteUpdateStore(tmp_path / "bot.db")
    yield s
    s.close()


@pytest.fixture
def pool(store: SqliteUpdateStore) -> WorkerPool:
    made = WorkerPool(store=store, handle=lambda update, ctx: None, parse=lambda raw: raw, workers=1, lease=LEASE,
                      max_attempts=5, retry=default_retry, handler_timeout=60)
    made.mailbox.take_hints(False)  # no full scan asked for any more ...
    made.exchanger.postpone_scan(float("inf"))  # ... nor due by time: only the hints can find work now
    return made


def record(pool: WorkerPool, updates: list[dict[str, Any]], finished: list[AttemptContext], room: int) -> list[Claim]:
    """One dispatcher round recording ``updates`` (claimed as they are stored where their chat is free), settling
    ``finished`` and claiming up to ``room``; its claims."""
    request = RecordRequest(updates, 0, {})
    claims, _more = pool.dispatcher.round([request], finished, room, runs=True)
    assert request.outcome() == len(updates)
    return claims


def contexts(store: SqliteUpdateStore, claims: list[Claim]) -> list[AttemptContext]:
    return [AttemptContext(store, claim) for claim in claims]


def test_a_chat_claimed_as_recorded_with_nothing_behind_is_not_looked_at_when_freed(
    store: SqliteUpdateStore, pool: WorkerPool
) -> None:
    """Updates of three chats, each claimed as it is recorded: settling them hints none of their chats (a look
    would find nothing), while a chat claimed otherwise (by a look at the file) is still hinted when freed."""
    claims = record(pool, [message(1, 7), message(2, 8), message(3, 9)], [], 5)
    assert sorted(c.update_id for c in claims) == [1, 2, 3]
    pool.mailbox.take_hints(False)
    pool.mailbox.hint_freed(contexts(store, claims))
    chats, chatless, scan = pool.mailbox.take_hints(False)
    assert (chats, chatless, scan) == (set(), set(), False)
    store.record([message(4, 10)], 5)  # recorded elsewhere: claimed by a look at the file, not as recorded
    (other,) = store.claim_many(LEASE, 1)
    pool.mailbox.hint_freed(contexts(store, [other]))
    assert pool.mailbox.take_hints(False)[0] == {10}


def test_an_update_recorded_behind_a_claim_made_as_recorded_is_claimed_once_that_claim_is_settled(
    store: SqliteUpdateStore, pool: WorkerPool
) -> None:
    """Chat 7's first update is claimed as it is recorded; its second, recorded while the first is held, waits;
    the round that settles the first claims the second (no full scan: only the hints look), and the third, recorded
    while the second is held, after it in the same way."""
    (first,) = record(pool, [message(1, 7)], [], 5)
    assert record(pool, [message(2, 7)], [], 5) == []  # the chat is held: stored pending
    claims, _more = pool.exchanger.exchange(contexts(store, [first]), 5)
    assert [c.update_id for c in claims] == [2]
    assert record(pool, [message(3, 7)], [], 5) == []
    claims, _more = pool.exchanger.exchange(contexts(store, claims), 5)
    assert [c.update_id for c in claims] == [3]
    claims, _more = pool.exchanger.exchange(contexts(store, claims), 5)
    assert claims == []


def test_a_chat_claimed_as_recorded_and_handed_back_is_looked_at_again(
    store: SqliteUpdateStore, pool: WorkerPool
) -> None:
    """A claim made as its update was recorded and then handed back (not run) frees its chat: the update is claimed
    again by the next round, and once that claim (made by a look) is settled its chat is looked at again."""
    (first,) = record(pool, [message(1, 7)], [], 5)
    pool.exchanger.hand_back(contexts(store, [first]))
    claims, _more = pool.exchanger.exchange([], 5)
    assert [c.update_id for c in claims] == [1]
    pool.mailbox.hint_freed(contexts(store, claims))
    assert pool.mailbox.take_hints(False)[0] == {7}
