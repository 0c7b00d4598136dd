"""Nothing is set on the connections of a pool the application supplied: after a fence and the store's own calls
used them, each connection has no new Python attribute and every server setting is as it was."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import telebot
from helpers import eventually
from pg_support import DSN, drop_tables, new_table, requires_pg

from telegram_fence import Fence
from telegram_fence.testing import FakeBotAPI

pytestmark = requires_pg

SIZE = 3


@pytest.fixture
def table() -> Iterator[str]:
    name = new_table("tf_apppool")
    yield name
    drop_tables(name)


def _taken(pool: Any) -> list[Any]:
    return [pool.getconn(timeout=10) for _ in range(SIZE)]


def _state(conn: Any) -> tuple[set[str], dict[str, str]]:
    """The connection's Python attributes, and its server settings (every row of ``pg_settings``)."""
    rows = conn.execute("SELECT name, setting FROM pg_settings").fetchall()
    conn.rollback()
    return set(vars(conn)), {str(name): str(setting) for name, setting in rows}


def test_a_fence_leaves_the_connections_of_the_applications_pool_as_they_were(table: str) -> None:
    """A fence handles updates (recording, claims, fenced transactions, the outbox's table lookup, stats) on the
    application's pool; afterwards its connections carry no new attribute and no changed setting (before: the
    store set ``telegram_fence_outbox`` on each of them)."""
    import psycopg_pool

    from telegram_fence.store.postgres import PostgresUpdateStore

    assert DSN is not None
    pool = psycopg_pool.ConnectionPool(DSN, min_size=SIZE, max_size=SIZE, open=True)
    pool.wait(30)
    conns = _taken(pool)
    before = {id(conn): _state(conn) for conn in conns}
    for conn in conns:
        pool.putconn(conn)
    store = PostgresUpdateStore(pool, table=table, pool_size=SIZE)
    handled: list[int] = []
    try:
        with FakeBotAPI(max_long_poll=0.3) as api:
            fence = Fence(telebot.TeleBot(api.token, threaded=False), store, long_poll_timeout=0.3, lease=5.0,
                          shutdown_timeout=3.0)
            fence.handler(lambda update: handled.append(update.update_id))
            fence.start()
            try:
                for i in range(5):
                    api.push_message(i + 1, f"hi {i}")
                assert eventually(lambda: len(handled) == 5, timeout=20), handled
                with store.write() as conn:
                    conn.execute("SELECT 1")
                assert fence.stats()["poller"] is not None
            finally:
                fence.stop()
                assert fence.join(15)
    finally:
        store.close()
    conns = _taken(pool)
    try:
        assert {id(conn) for conn in conns} == set(before), "the pool's connections were replaced"
        for conn in conns:
            attributes, settings = _state(conn)
            old_attributes, old_settings = before[id(conn)]
            assert attributes == old_attributes, f"new attributes on a pooled connection: {attributes - old_attributes}"
            # (a setting a module loaded since adds a row, e.g. plpgsql's for the store's trigger: not a change)
            changed = {k: (v, settings.get(k)) for k, v in old_settings.items() if settings.get(k) != v}
            assert not changed, f"settings changed on a pooled connection: {changed}"
    finally:
        for conn in conns:
            pool.putconn(conn)
        pool.close()
