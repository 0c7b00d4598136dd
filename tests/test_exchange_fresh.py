"""The update dicts the dispatcher keeps from its own records (so a claim needs no read-back of the payload): at
most ``runtime.exchange.FRESH_LIMIT`` of them, the oldest dropped first, and a dropped one claimed all the same."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telegram_fence.retry import default_retry
from telegram_fence.runtime.attempt import AttemptContext
from telegram_fence.runtime.exchange import FRESH_LIMIT
from telegram_fence.runtime.pool import WorkerPool
from telegram_fence.store.sqlite import SqliteUpdateStore

LEASE = 30.0
PAD = "x" * 2000  # (a text of its own per update: f"{i}{PAD}")


def message(update_id: int, chat: int, text: str = "x") -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "chat": {"id": chat}, "text": text}}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteUpdateStore]:
    s = SqliteUpdateStore(tmp_path / "bot.db")
    yield s
    s.close()


def _pool(store: Any) -> WorkerPool:
    return WorkerPool(store=store, handle=lambda update, ctx: None, parse=lambda raw: raw, workers=1, lease=LEASE,
                      max_attempts=5, retry=default_retry, handler_timeout=60)


def test_a_host_whose_updates_other_processes_claim_keeps_a_bounded_number_of_them(store: SqliteUpdateStore) -> None:
    """The polling host of a fence on several hosts records every update and claims only some: offered 4,000
    updates of ≈ 2 kB it never claims, the dispatcher holds about FRESH_LIMIT of them, not all (it kept up to
    4,096 before: ≈ 5.8 MB more peak RSS on such a host, measured with two fences on one PostgreSQL table)."""
    pool = _pool(store)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for first in range(1, 4001, 100):  # as the poller's batches come
            pool.exchanger.offer([message(i, 1 + i % 50, f"{i}{PAD}") for i in range(first, first + 100)])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert FRESH_LIMIT < 4000 / 2
    assert held < 4000 * 2000 / 2, f"{held / 1e6:.1f} MB held for 4,000 updates never claimed here"


def _claim_everything_and_check(store: Any, pool: WorkerPool, text: str | None) -> None:
    """Record and offer FRESH_LIMIT + 200 updates (``text``: the message text, ``None`` for an id of its own per
    update), claim them all through the pool's exchanger and check: each once, in each chat's order, equal to
    the update recorded; the newest the very dicts offered, the oldest (dropped) decoded from the store."""
    count, chats = FRESH_LIMIT + 200, 13
    offered = {i: message(i, 1 + i % chats, f"t{i}" if text is None else text) for i in range(1, count + 1)}
    for first in range(1, count + 1, 100):
        batch = [offered[i] for i in range(first, min(count, first + 99) + 1)]
        store.record(batch, batch[-1]["update_id"] + 1)
        pool.exchanger.offer(batch)
    claimed: dict[int, Any] = {}
    order: dict[int, list[int]] = {}
    finished: list[AttemptContext] = []
    for _ in range(count):
        claims, _more = pool.exchanger.exchange(finished, 100)
        if not claims and not finished:
            break
        for claim in claims:
            assert claim.update_id not in claimed
            claimed[claim.update_id] = claim.update
            order.setdefault(claim.chat_id, []).append(claim.update_id)
        finished = [AttemptContext(store, claim) for claim in claims]
    assert sorted(claimed) == list(range(1, count + 1))
    assert all(claimed[i] == offered[i] for i in offered)
    assert all(ids == sorted(ids) for ids in order.values())
    assert claimed[count] is offered[count]  # kept: no read-back
    assert claimed[1] is not offered[1]  # dropped first: read back from its payload


def test_claims_of_dropped_updates_read_their_payloads_back_and_kept_ones_use_the_dicts(
    store: SqliteUpdateStore,
) -> None:
    """More updates recorded than the dispatcher keeps: every one is claimed once, in each chat's order, with the
    update as recorded; the newest come as the very dicts offered, the oldest (dropped) decoded from the store."""
    _claim_everything_and_check(store, _pool(store), "x")


def test_on_postgresql_claims_of_dropped_updates_read_their_payloads_back() -> None:
    """The same on a PostgreSQL store, whose round leaves out the payloads of the ids the dispatcher still keeps:
    every update claimed once, in each chat's order, equal to the one recorded; the newest as the very dicts
    offered, the dropped ones decoded from the payloads the server sent back."""
    from pg_support import DSN, drop_tables, new_table

    if DSN is None:
        pytest.skip("TELEGRAM_FENCE_PG_DSN is not set")
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = new_table("tf_fresh")
    store = PostgresUpdateStore(str(DSN), table=table)
    try:
        _claim_everything_and_check(store, _pool(store), None)
    finally:
        store.close()
        drop_tables(table)
