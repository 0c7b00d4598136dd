"""The unchanged Fence on PostgresUpdateStore against the fake Bot API: workers, leases, retries,
exhaustions, fenced transactions, and poll leadership between fences sharing one database."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import telebot
from helpers import eventually
from pg_support import DSN, drop_tables, dsn_with, new_table, requires_pg
from store_helpers import claim_one

from telegram_fence import Fence
from telegram_fence.errors import LeadershipLost
from telegram_fence.testing import FakeBotAPI

pytestmark = requires_pg


@pytest.fixture
def api() -> Iterator[FakeBotAPI]:
    with FakeBotAPI(max_long_poll=0.3) as server:
        yield server


@pytest.fixture
def table() -> Iterator[str]:
    name = new_table("tf_fence")
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name}_domain (update_id bigint NOT NULL, attempt int NOT NULL)")
    yield name
    drop_tables(name)


def _store(table: str, **options: Any) -> Any:
    from telegram_fence.store.postgres import PostgresUpdateStore

    return PostgresUpdateStore(DSN, table=table, **options)


def _fence(api: FakeBotAPI, store: Any, **options: Any) -> Fence:
    options.setdefault("long_poll_timeout", 0.3)
    options.setdefault("lease", 2.0)
    options.setdefault("shutdown_timeout", 3.0)
    return Fence(telebot.TeleBot(api.token, threaded=False), store, **options)


def _domain_rows(table: str) -> dict[int, int]:
    """update_id -> attempt of every domain row; AssertionError when an update has two rows."""
    with psycopg.connect(DSN) as conn:
        rows = conn.execute(f"SELECT update_id, attempt FROM {table}_domain").fetchall()
    found = dict(rows)
    assert len(found) == len(rows), "an update was written twice"
    return found


def test_fence_runs_on_postgres_with_fenced_transactions_retries_and_exhaustions(
    api: FakeBotAPI, table: str
) -> None:
    """Every update gets exactly one domain row written with its settlement; failures retry, then exhaust."""
    store = _store(table)
    exhausted: list[Any] = []
    fence = _fence(api, store, workers=4, max_attempts=2, retry=lambda exc, attempt: 0.05,
                   on_exhausted=exhausted.append)

    @fence.attempt_handler
    def handle(update: Any, ctx: Any) -> None:
        text = update.message.text
        if text == "always fails":
            raise RuntimeError("boom")
        if text == "fails once" and ctx.attempt == 1:
            raise RuntimeError("first try fails")
        with ctx.transaction(complete=True) as conn:
            assert isinstance(conn, psycopg.Connection)
            conn.execute(f"INSERT INTO {table}_domain VALUES (%s, %s)", (ctx.update_id, ctx.attempt))

    fence.start()
    try:
        ids = api.push_messages(120, chats=[1, 2, 3, 4, 5, 6])
        flaky = api.push_message(9, "fails once")
        doomed = api.push_message(9, "always fails")
        assert api.wait_confirmed(doomed + 1, timeout=30)
        assert eventually(lambda: len(exhausted) == 1, timeout=30)
        assert eventually(lambda: fence.stats()["settled"] == 121, timeout=30)
        stats = fence.stats()
        assert stats["poller"]["leading"] and stats["leader"]["live"]
    finally:
        fence.stop()
        assert fence.join(15)
    rows = _domain_rows(table)
    assert sorted(rows) == sorted([*ids, flaky])
    assert rows[flaky] == 2
    assert exhausted[0].identity.update_id == doomed and "boom" in exhausted[0].error
    store.close()


def test_two_fences_on_one_table_one_polls_and_the_other_takes_over(api: FakeBotAPI, table: str) -> None:
    """Of two fences sharing the database only one polls; when it stops, the other takes over and both
    ran handlers for updates that each got exactly one domain row."""
    stores = [_store(table), _store(table, create_table=False)]
    fences = [_fence(api, s, workers=2) for s in stores]
    handled_by: dict[int, int] = {}
    lock = threading.Lock()
    for number, fence in enumerate(fences):

        def handle(update: Any, ctx: Any, number: int = number) -> None:
            with ctx.transaction(complete=True) as conn:
                conn.execute(f"INSERT INTO {table}_domain VALUES (%s, %s)", (ctx.update_id, ctx.attempt))
            with lock:
                handled_by[ctx.update_id] = number

        fence.attempt_handler(handle)
        fence.start()
    try:
        assert eventually(lambda: sum(f.stats()["poller"]["leading"] for f in fences) == 1, timeout=15)
        leader = next(i for i, f in enumerate(fences) if f.stats()["poller"]["leading"])
        first = api.push_messages(60, chats=list(range(30)))
        assert api.wait_confirmed(first[-1] + 1, timeout=30)
        fences[leader].stop()
        assert fences[leader].join(15)
        other = fences[1 - leader]
        assert eventually(lambda: other.stats()["poller"]["leading"], timeout=10), "no takeover"
        second = api.push_messages(30, chats=[1, 2, 3])
        assert api.wait_confirmed(second[-1] + 1, timeout=30)
        assert eventually(lambda: len(_domain_rows(table)) == 90, timeout=30)
        assert other.stats()["leader"]["epoch"] == 2
    finally:
        for fence in fences:
            fence.stop()
            fence.join(15)
        for s in stores:
            s.close()
    assert sorted(_domain_rows(table)) == sorted(first + second)


def test_partition_a_deposed_leader_cannot_record_its_batch(table: str) -> None:
    """When the leader's session is cut and another process takes over, the old leader's record is refused
    (cursor unchanged, nothing stored) and the new leader records the same batch once."""
    old, new = _store(table, leader_check=0.2), _store(table, create_table=False, leader_check=0.2)
    try:
        old_lead, new_lead = old.poll_leadership(), new.poll_leadership()
        assert old_lead.acquire(5) and not new_lead.acquire(0.3)
        batch = [{"update_id": 10, "message": {"message_id": 1, "date": 0, "chat": {"id": 1, "type": "private"}}}]
        with psycopg.connect(DSN, autocommit=True) as admin:
            cut = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'telegram-fence-leader' AND pid = ("
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 0 AND objsubid = 2 "
                "AND classid = %s::bigint::oid AND granted)",
                (old._leader_ns & 0xFFFFFFFF,),
            ).fetchone()[0]
        assert cut == 1
        assert new_lead.acquire(10) and new_lead.epoch == old_lead.epoch + 1
        with pytest.raises(LeadershipLost):
            old.record(batch, 11)
        assert new.next_offset() == 0 and new.stats()["pending"] == 0
        assert new.record(batch, 11) == 1 and new.next_offset() == 11
        assert eventually(lambda: not old_lead.held, timeout=5)
        stats = new.stats()
        assert stats["leader"]["epoch"] == new_lead.epoch and stats["leader"]["live"]
    finally:
        old.close()
        new.close()


def test_dropped_connections_are_retried_and_nothing_is_lost(api: FakeBotAPI, table: str) -> None:
    """Killing every backend of a running fence (pool and leadership session) three times loses nothing and
    writes nothing twice: the fence retries and polling resumes."""
    name = f"tf_drop_{table[-12:]}"
    from telegram_fence.store.postgres import PostgresUpdateStore

    store = PostgresUpdateStore(dsn_with(application_name=name), table=table, leader_check=0.3)
    fence = _fence(api, store, workers=3)

    @fence.attempt_handler
    def handle(update: Any, ctx: Any) -> None:
        with ctx.transaction(complete=True) as conn:
            conn.execute(f"INSERT INTO {table}_domain VALUES (%s, %s)", (ctx.update_id, ctx.attempt))

    def kill_backends() -> int:
        with psycopg.connect(DSN, autocommit=True) as admin:
            leader = admin.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 0 AND objsubid = 2 "
                "AND classid = %s::bigint::oid AND granted", (store._leader_ns & 0xFFFFFFFF,)
            ).fetchall()
            return int(admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s OR pid = ANY(%s)", (name, [p for (p,) in leader]),
            ).fetchone()[0])

    fence.start()
    ids: list[int] = []
    try:
        for _round in range(3):
            ids += api.push_messages(40, chats=[1, 2, 3, 4, 5])
            wanted = len(ids) - 30
            assert eventually(lambda w=wanted: len(_domain_rows(table)) >= w, timeout=30)
            assert kill_backends() >= 1
        assert api.wait_confirmed(ids[-1] + 1, timeout=60)
        assert eventually(lambda: len(_domain_rows(table)) == len(ids), timeout=60)
        assert eventually(lambda: fence.stats().get("settled") == len(ids), timeout=30)
        assert fence.stats()["ended_reason"] is None
    finally:
        fence.stop()
        assert fence.join(15)
        store.close()
    assert sorted(_domain_rows(table)) == ids


def test_an_exhaustion_found_at_claim_time_reaches_on_exhausted_at_once(api: FakeBotAPI, table: str) -> None:
    """An update whose attempts another host spent (it died holding the claim) is exhausted at claim time and
    reaches on_exhausted within seconds through the store's exhaustion listener, not at the exhaustions thread's 60 s
    round.
    """
    told: list[int] = []
    store = _store(table)
    other = _store(table, create_table=False)  # another host: claims an update, then dies without settling it
    fence = _fence(api, store, max_attempts=1, on_exhausted=lambda e: told.append(e.identity.update_id))
    fence.handler(lambda update: None)
    fence.start()
    try:
        assert eventually(lambda: fence.stats()["poller"]["polls"] >= 1)
        orphan = {"update_id": 10**6, "message": {"message_id": 1, "date": 0, "chat": {"id": 3, "type": "private"},
                                                   "text": "orphan"}}
        with other.write(durable=True):  # recorded and claimed in one transaction: the fence never sees it unclaimed
            other.record([orphan], 10**6 + 1)
            claim = claim_one(other, 1.0)
        assert claim is not None and claim.update_id == orphan["update_id"]
        assert eventually(lambda: told == [claim.update_id], timeout=15)
        assert fence.ended_reason is None
    finally:
        fence.stop()
        fence.join()
        other.close()
        store.close()
