"""The PostgreSQL claim's fast path on a real server: the lean one-update claim that looks only at the backlog's
first rows (and must still find an update further on)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pg_support import DSN, drop_tables, new_table, requires_pg
from store_helpers import claim_one, claim_up_to, settle_one

pytestmark = requires_pg


@pytest.fixture
def table() -> Iterator[str]:
    name = new_table()
    yield name
    drop_tables(name)


def _update(update_id: int, chat: int) -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0,
                                                "chat": {"id": chat, "type": "private"}, "text": "x"}}


def test_a_claim_past_a_window_of_busy_rows_finds_the_next_free_chat(table: str) -> None:
    """The backlog's first 300 updates all belong to one chat whose first update is claimed (live): none of them
    may be claimed, and the one-update claim (which looks at the first rows only, then at every chat's head)
    still takes the update of another chat behind them, then reports nothing more while the chat is busy."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    store = PostgresUpdateStore(DSN, table=table)
    try:
        store.record([_update(i, 7) for i in range(1, 301)] + [_update(301, 8)], 302)
        first = claim_one(store, 30.0)
        assert first is not None and first.update_id == 1
        other = claim_one(store, 30.0)
        assert other is not None and other.update_id == 301, "the free chat behind the busy one was not claimed"
        assert claim_one(store, 30.0) is None, "an update of a chat with a live claim was claimed"
        assert settle_one(store, first.identity)
        after = claim_one(store, 30.0)
        assert after is not None and after.update_id == 2, "the busy chat's next update did not come next"
    finally:
        store.close()


def test_only_a_round_that_settles_nothing_commits_without_waiting_for_the_flush(table: str) -> None:
    """A trigger notes the ``synchronous_commit`` of every transaction that changes a row's state: a claim of
    its own (an ``exchange`` that settles nothing, of one update or of many) commits with it off; the
    fenced transaction and its settle, a settle of its own, an ``exchange`` that settles, and a claim made inside
    the application's open transaction (which must keep that transaction's durability) commit with it on."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    store = PostgresUpdateStore(DSN, table=table)
    try:
        with store.write() as conn:
            conn.execute(f"CREATE TABLE {table}_seen (state integer, sync text)")
            conn.execute(f"CREATE FUNCTION {table}_note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                         f"INSERT INTO {table}_seen VALUES (NEW.state, current_setting('synchronous_commit')); "
                         "RETURN NEW; END $$")
            conn.execute(f"CREATE TRIGGER {table}_note AFTER UPDATE OF state ON {table} "
                         f"FOR EACH ROW EXECUTE FUNCTION {table}_note()")
            conn.execute(f"CREATE TABLE {table}_handled (update_id bigint)")

        def seen() -> list[tuple[int, str]]:
            with store.write() as conn:
                rows = conn.execute(f"DELETE FROM {table}_seen RETURNING state, sync").fetchall()
            return sorted((int(state), str(sync)) for state, sync in rows)

        store.record([_update(i, i) for i in range(1, 7)], 7)
        first = claim_one(store, 30.0)
        assert first is not None and seen() == [(1, "off")]
        with store.transaction(first.identity, complete=True) as conn:
            conn.execute(f"INSERT INTO {table}_handled VALUES (%s)", (first.update_id,))
        assert seen() == [(2, "on")]
        two = claim_up_to(store, 30.0, 2)
        assert len(two) == 2 and seen() == [(1, "off"), (1, "off")]
        settled, more, _ = store.exchange([two[0].identity], 30.0, 1)
        assert settled == 1 and len(more) == 1 and seen() == [(1, "on"), (2, "on")]
        _, alone, _ = store.exchange([], 30.0, 1)
        assert len(alone) == 1 and seen() == [(1, "off")]
        assert settle_one(store, two[1].identity) and seen() == [(2, "on")]
        with store.write():
            inside = claim_one(store, 30.0)
        assert inside is not None and seen() == [(1, "on")]
    finally:
        with store.write() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}_seen, {table}_handled")
            conn.execute(f"DROP TRIGGER IF EXISTS {table}_note ON {table}")
            conn.execute(f"DROP FUNCTION IF EXISTS {table}_note()")
        store.close()
