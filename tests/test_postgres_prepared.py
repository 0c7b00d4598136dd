"""The PostgreSQL store's memory of the prepared statements a session holds, after scripts that failed (a real
server, a pool of one session so every call meets the same one).

A ``PREPARE`` is not transactional: one sent with a script whose later statement (or ``COMMIT``) fails stays in the
session. A script sent inside a transaction the caller began (the ``COMMIT`` of ``transaction(complete=True)``) cannot
be sent again when its statements were not where they were remembered. Either way the next script must learn what
the session holds: one failure must not make every later fenced transaction on that session fail."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pg_support import DSN, drop_tables, new_table, requires_pg

from telegram_fence.errors import StoreError

pytestmark = requires_pg

LEASE = 30.0


def _update(update_id: int) -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "text": "x",
                                                 "chat": {"id": update_id, "type": "private"}}}


@pytest.fixture
def store() -> Iterator[Any]:
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = new_table("tf_prepared")
    opened = PostgresUpdateStore(str(DSN), table=table, pool_size=1)
    with psycopg.connect(str(DSN), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table}_dom (id int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    try:
        yield opened
    finally:
        opened.close()
        with psycopg.connect(str(DSN), autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}_dom")
        drop_tables(table)


def _complete(store: Any, update_id: int, *values: int) -> None:
    """Claim ``update_id`` and insert ``values`` into the domain table in ``transaction(complete=True)``."""
    claim = store.claim_owned(LEASE)
    assert claim is not None and claim.update_id == update_id
    with store.transaction(claim.identity, complete=True) as conn:
        for value in values:
            conn.execute(f"INSERT INTO {store.table}_dom VALUES (%s)", (value,))


def _domain(store: Any) -> list[int]:
    with psycopg.connect(str(DSN)) as conn:
        return [row[0] for row in conn.execute(f"SELECT id FROM {store.table}_dom ORDER BY id")]


def _settled(store: Any) -> list[int]:
    with psycopg.connect(str(DSN)) as conn:
        return [row[0] for row in conn.execute(f"SELECT update_id FROM {store.table} WHERE state = 2 ORDER BY 1")]


def test_a_commit_that_fails_after_its_prepare_leaves_the_next_fenced_transactions_working(store: Any) -> None:
    """The first ``transaction(complete=True)`` of a session fails at its ``COMMIT`` (a deferred unique constraint of
    the application's table), after the settle's ``PREPARE`` ran in the same trip: nothing of it is stored, and the
    next fenced transactions on that session commit their writes and settle their updates (before: each failed with
    ``DuplicatePreparedStatement``, for as long as the session lived)."""
    store.record([_update(1), _update(2), _update(3)], 4)
    with pytest.raises(StoreError):
        _complete(store, 1, 10, 10)
    assert _domain(store) == [] and _settled(store) == []
    _complete(store, 2, 20)
    _complete(store, 3, 30)
    assert _domain(store) == [20, 30]
    assert _settled(store) == [2, 3]


def test_a_statement_lost_inside_the_callers_transaction_fails_once_then_is_prepared_again(store: Any) -> None:
    """The session lost the settle's prepared statement only (deallocated behind the store's back) while the store
    remembers it: the ``COMMIT`` trip of a ``transaction(complete=True)`` fails inside that transaction (it cannot be
    sent again there: raised, nothing stored), and the next one on the session prepares it again and commits
    (before: every later one failed the same way)."""
    store.record([_update(1), _update(2), _update(3)], 4)
    _complete(store, 1, 10)
    with store.read() as conn:
        settle = f"%UPDATE {store.table} SET state = 2%"
        names = [row[0] for row in conn.execute("SELECT name FROM pg_prepared_statements WHERE statement LIKE %s",
                                                (settle,))]
        assert len(names) == 1, "the settle of transaction(complete=True) is not prepared on the session"
        conn.execute(f"DEALLOCATE {names[0]}")
    with pytest.raises(StoreError):
        _complete(store, 2, 20)
    assert _domain(store) == [10] and _settled(store) == [1]
    _complete(store, 3, 30)
    assert _domain(store) == [10, 30]
    assert _settled(store) == [1, 3]


def test_a_round_in_the_threads_open_transaction_is_sent_again_in_its_savepoint(store: Any) -> None:
    """Inside ``write()`` a round (settle and claim) runs in a savepoint of the thread's transaction: when the session
    lost its prepared statements it is rolled back to that savepoint and sent again, and what the transaction wrote
    before it is kept and committed with it (the difference from the ``COMMIT`` trip above: the script owns its
    savepoint, so it may be sent again)."""
    store.record([_update(1), _update(2)], 3)
    store.exchange([], LEASE, 1, chats=[1], chatless=[], run=1)  # the round's statements are prepared
    prepared = store._conns.prepared
    learnt: list[object] = []
    forget = prepared.forget
    prepared.forget = lambda conn: (learnt.append(conn), forget(conn))[1]
    with store.write() as conn:
        conn.execute("DEALLOCATE ALL")
        conn.execute(f"INSERT INTO {store.table}_dom VALUES (5)")
        _settled_now, claims, _more = store.exchange([], LEASE, 1, chats=[2], chatless=[], run=1)
        assert [c.update_id for c in claims] == [2]
    assert _domain(store) == [5]
    assert store.owns(claims[0].identity)
    assert len(learnt) == 1  # the round failed on the server once and was sent again


def test_a_fence_whose_first_fenced_commit_fails_goes_on_committing_the_next_updates() -> None:
    """A fence on PostgreSQL (one pooled session): the first update's ``transaction(complete=True)`` fails at its
    ``COMMIT`` on the application's deferred constraint (and is exhausted, ``max_attempts=1``); the chat's next 20
    updates each commit their domain row and settle (before: every one of them failed on that session with
    ``DuplicatePreparedStatement`` and was exhausted too)."""
    import telebot
    from helpers import eventually

    from telegram_fence import Fence
    from telegram_fence.store.postgres import PostgresUpdateStore
    from telegram_fence.testing import FakeBotAPI

    table = new_table("tf_prepared_fence")
    store = PostgresUpdateStore(str(DSN), table=table, pool_size=1)
    with psycopg.connect(str(DSN), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table}_dom (id bigint UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    exhausted: list[Any] = []
    try:
        with FakeBotAPI(max_long_poll=0.3) as api:
            fence = Fence(telebot.TeleBot(api.token, threaded=False), store, long_poll_timeout=0.3, lease=10.0,
                          shutdown_timeout=3.0, max_attempts=1, on_exhausted=exhausted.append)

            @fence.attempt_handler
            def handle(update: Any, ctx: Any) -> None:
                values = [0, 0] if update.message.text == "dup" else [ctx.update_id]
                with ctx.transaction(complete=True) as conn:
                    for value in values:
                        conn.execute(f"INSERT INTO {table}_dom VALUES (%s)", (value,))

            doomed = api.push_message(1, "dup")
            ids = [api.push_message(1, f"m {n}") for n in range(20)]
            fence.start()
            try:
                assert api.wait_confirmed(ids[-1] + 1, timeout=30)
                assert eventually(lambda: len(exhausted) + fence.stats()["settled"] >= 21, timeout=30)
            finally:
                fence.stop()
                assert fence.join(15)
        assert [e.identity.update_id for e in exhausted] == [doomed]
        assert _domain(store) == sorted(ids)
    finally:
        store.close()
        with psycopg.connect(str(DSN), autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}_dom")
        drop_tables(table)
