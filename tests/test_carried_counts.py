"""The backlog and the cursor a split round carries to the poller: each serves one fetch, then the store is read.

The poller's backpressure (``backlog_room``) and its cursor (``stored_cursor``) take what the last round counted
(``WorkerPool.carried``) instead of reading the store; a value taken twice would be stale (a backlog waited on while
handlers settle, a cursor after a wait in which another process may have led the polling). Here on a real SQLite
store, with offered values unlike the store's so that each answer tells where it came from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telegram_fence.retry import default_retry
from telegram_fence.runtime.assembly import backlog_room, stored_cursor
from telegram_fence.runtime.pool import WorkerPool
from telegram_fence.runtime.rounds import CarriedCounts
from telegram_fence.runtime.settings import FenceSettings
from telegram_fence.store.sqlite import SqliteUpdateStore

log = logging.getLogger("tests.carried_counts")


def _update(update_id: int) -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "text": "x",
                                                 "chat": {"id": update_id, "type": "private"}}}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteUpdateStore]:
    s = SqliteUpdateStore(tmp_path / "bot.db")
    s.record([_update(1), _update(2), _update(3)], 4)  # the store: a backlog of 3, the cursor at 4
    yield s
    s.close()


def _reads(store: SqliteUpdateStore) -> tuple[WorkerPool, Any, Any]:
    pool = WorkerPool(store=store, handle=lambda update, ctx: None, parse=lambda raw: raw, workers=1, lease=30.0,
                      max_attempts=5, retry=default_retry, handler_timeout=60)
    room = backlog_room(store, FenceSettings(max_backlog=50), pool, log)  # (50: below any inline limit)
    return pool, room, stored_cursor(store, pool)


def test_a_carried_backlog_and_cursor_serve_one_fetch(store: SqliteUpdateStore) -> None:
    """Offered once, the round's backlog and cursor answer the next room and cursor reads; the reads after them
    ask the store again."""
    pool, room, cursor = _reads(store)
    assert (room(), cursor()) == (47, 4)  # nothing carried: the store's
    pool.carried.offer(10, 2)
    assert (room(), cursor()) == (40, 2)
    assert (room(), cursor()) == (47, 4)


def test_a_backlog_read_again_drops_the_carried_cursor(store: SqliteUpdateStore) -> None:
    """A poller that waits for room reads the backlog again (the carried one was taken): the cursor it then fetches
    with is read from the store too, not the one carried before the wait."""
    pool, room, cursor = _reads(store)
    pool.carried.offer(10, 2)
    assert room() == 40
    assert room() == 47
    assert cursor() == 4


def test_a_cursor_is_carried_only_behind_its_backlog(store: SqliteUpdateStore) -> None:
    """A cursor read before the offer's backlog was taken comes from the store; an offer that counted nothing
    (``None``) carries nothing; a new offer replaces one not taken."""
    pool, room, cursor = _reads(store)
    pool.carried.offer(10, 2)
    assert cursor() == 4
    pool.carried.offer(None, 2)
    assert (room(), cursor()) == (47, 4)
    pool.carried.offer(10, 2)
    pool.carried.offer(20, 3)
    assert (room(), cursor()) == (30, 3)


@pytest.mark.parametrize(("offers", "takes", "expected"), [
    ([], ["backlog", "cursor"], [None, None]),
    ([(5, 9)], ["backlog", "cursor", "backlog", "cursor"], [5, 9, None, None]),
    ([(5, 9)], ["cursor", "backlog", "cursor"], [None, 5, 9]),
    ([(5, 9)], ["backlog", "backlog", "cursor"], [5, None, None]),
    ([(5, None)], ["backlog", "cursor"], [5, None]),
    ([(None, 9)], ["backlog", "cursor"], [None, None]),
    ([(5, 9), (6, 10)], ["backlog", "cursor"], [6, 10]),
    ([(5, 9)], ["backlog", "offer", "cursor"], [5, None]),
])
def test_carried_counts_table(offers: list[tuple[int | None, int | None]], takes: list[str],
                              expected: list[int | None]) -> None:
    """CarriedCounts: each offer's backlog is taken once; its cursor only right after that backlog; an offer in
    between drops an armed cursor."""
    carried = CarriedCounts()
    for backlog, cursor in offers:
        carried.offer(backlog, cursor)
    answers: list[int | None] = []
    for take in takes:
        if take == "offer":
            carried.offer(None, None)
        else:
            answers.append(carried.backlog() if take == "backlog" else carried.cursor())
    assert answers == expected
