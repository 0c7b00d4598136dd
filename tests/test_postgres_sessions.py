"""The PostgreSQL store's own pool of sessions (``store.postgres.connection.SessionPool``) on a real server: its
bound, its wait, what it does with a connection that comes back broken or inside a transaction, and closing."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from pg_support import DSN, requires_pg

from telegram_fence.errors import StoreUnavailable
from telegram_fence.store.postgres.connection import PoolTimeout, SessionPool, translated

pytestmark = requires_pg


def _pool(size: int, configured: list[Any] | None = None, **options: Any) -> SessionPool:
    return SessionPool(DSN or "", max_size=size,
                       configure=(configured.append if configured is not None else lambda conn: None), **options)


def test_at_most_max_size_connections_then_a_bounded_wait_that_ends_in_store_unavailable() -> None:
    """Two of two lent: a third caller waits out its timeout and gets PoolTimeout, which the store's boundary
    raises as StoreUnavailable; each connection is configured once, before its first use."""
    configured: list[Any] = []
    pool = _pool(2, configured)
    try:
        a, b = pool.getconn(5), pool.getconn(5)
        assert a is not b and configured == [a, b]
        with pytest.raises(PoolTimeout):
            pool.getconn(0.2)
        with pytest.raises(StoreUnavailable, match="became free"), translated("a test"):
            pool.getconn(0.1)
        assert pool.get_stats()["pool_size"] == 2
        pool.putconn(a)
        assert pool.getconn(1) is a and configured == [a, b]  # reused, not configured again
        pool.putconn(a)
        pool.putconn(b)
    finally:
        pool.close()


def test_a_waiting_caller_gets_the_connection_returned_while_it_waits() -> None:
    pool = _pool(1)
    try:
        lent = pool.getconn(5)
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(pool.getconn(10)))
        waiter.start()
        pool.putconn(lent)
        waiter.join(10)
        assert got == [lent]
        pool.putconn(lent)
    finally:
        pool.close()


def test_a_broken_connection_is_dropped_and_the_next_caller_gets_a_new_one() -> None:
    pool = _pool(1)
    try:
        conn = pool.getconn(5)
        pid = conn.info.backend_pid
        with psycopg.connect(DSN or "", autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        pool.putconn(conn)
        fresh = pool.getconn(5)
        assert fresh is not conn and fresh.execute("SELECT 1").fetchone() == (1,)
        assert fresh.info.backend_pid != pid and pool.get_stats()["connections_num"] == 2
        pool.putconn(fresh)
    finally:
        pool.close()


def test_a_connection_returned_inside_a_transaction_is_rolled_back_and_kept() -> None:
    pool = _pool(1)
    try:
        conn = pool.getconn(5)
        conn.execute("BEGIN")
        conn.execute("CREATE TEMPORARY TABLE tf_sessions_probe (x int)")
        pool.putconn(conn)
        again = pool.getconn(5)
        assert again is conn and again.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert again.execute("SELECT to_regclass('pg_temp.tf_sessions_probe')").fetchone() == (None,)
        pool.putconn(again)
    finally:
        pool.close()


def test_connections_unused_for_max_idle_are_closed_and_one_stays() -> None:
    pool = _pool(3, max_idle=0.0)
    try:
        conns = [pool.getconn(5) for _ in range(3)]
        for conn in conns:
            pool.putconn(conn)
        assert pool.get_stats()["pool_available"] == 1 and [c.closed for c in conns] == [True, True, False]
    finally:
        pool.close()


def test_closing_closes_the_free_connections_then_each_lent_one_when_it_comes_back() -> None:
    pool = _pool(2)
    free, lent = pool.getconn(5), pool.getconn(5)
    pool.putconn(free)
    pool.close()
    assert free.closed and not lent.closed
    with pytest.raises(psycopg.OperationalError, match="closed"):
        pool.getconn(1)
    pool.putconn(lent)
    assert lent.closed and pool.get_stats()["pool_size"] == 0
