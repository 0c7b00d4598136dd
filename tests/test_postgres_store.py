"""PostgresUpdateStore beyond the conformance suite: races between connections, schema, time, locks,
connection failures, and the import boundary."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pg_support import DSN, drop_tables, dsn_with, new_table, requires_pg
from store_helpers import claim_one, claim_up_to, settle_one

from telegram_fence.errors import OwnershipLost, SchemaError, StoreUnavailable
from telegram_fence.testing.conformance import ManualClock

pytestmark = requires_pg



def _open(store: Any) -> int:
    """How many updates are pending or claimed."""
    stats = store.stats()
    return int(stats["pending"] + stats["claimed"])

def _update(update_id: int, chat: int) -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0,
                                                "chat": {"id": chat, "type": "private"}, "text": "x"}}


@pytest.fixture
def table() -> Iterator[str]:
    name = new_table()
    yield name
    drop_tables(name)


def _store(table: str, **options: Any) -> Any:
    from telegram_fence.store.postgres import PostgresUpdateStore

    return PostgresUpdateStore(DSN, table=table, **options)


def test_importing_telegram_fence_never_imports_psycopg() -> None:
    """`import telegram_fence` (and its store, testing and runtime modules) leaves psycopg unimported."""
    code = (
        "import sys, telegram_fence, telegram_fence.store, telegram_fence.testing.conformance, "
        "telegram_fence.runtime.fence, telegram_fence.cli.main\n"
        "print(sorted(m for m in sys.modules if m.startswith(('psycopg', 'psycopg_pool'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


_PG_ONLY_FENCE = """
import sys, threading
import telebot
from telegram_fence import Fence
from telegram_fence.store.postgres import PostgresUpdateStore
from telegram_fence.telegram import set_api_server
from telegram_fence.testing import FakeBotAPI

with FakeBotAPI(max_long_poll=0.2) as api:
    set_api_server(api.api_url)
    api.push_messages(3, chats=[1, 2], text="m{i}")
    bot = telebot.TeleBot(api.token, threaded=False)
    done = threading.Event()
    seen = []

    @bot.message_handler(func=lambda m: True)
    def reply(message):
        bot.set_state(message.from_user.id, "asked", message.chat.id)  # a conversation write
        bot.send_message(message.chat.id, "ok")  # a journaled call
        seen.append(message.message_id)
        if len(seen) == 3:
            done.set()

    fence = Fence(bot, PostgresUpdateStore(sys.argv[1], table=sys.argv[2]), workers=2, long_poll_timeout=0.2)
    fence.start()
    assert done.wait(60), seen
    fence.stop()
    fence.join(30)
# (nor what this fence never used: run()'s signal handling, the webhook door's watch and intake, the HTTP server)
UNUSED = ("telegram_fence.runtime.signals", "telegram_fence.ingress.webhook_guard",
          "telegram_fence.http_serving", "telegram_fence.ingress.webhook")
print(sorted(m for m in sys.modules if m in ("apsw", "psycopg_pool", *UNUSED)
             or m.startswith(("apsw.", "psycopg_pool.", "telegram_fence.store.sqlite"))))
"""


def test_a_fence_on_postgres_never_loads_apsw_nor_the_sqlite_store_nor_psycopg_pool(table: str) -> None:
    """A fence that polls, journals a call and writes a conversation on PostgreSQL leaves APSW unimported (its
    memory, ≈ 3 MB, is the SQLite store's to pay), and psycopg_pool too (the store's own sessions need none); nor
    the modules of the parts it never used (``run()``'s signals, the webhook door's watch and intake, the HTTP
    server of ``metrics=`` and ``run_webhook``: they load when used)."""
    out = subprocess.run([sys.executable, "-c", _PG_ONLY_FENCE, DSN or "", table], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_record_inside_write_joins_the_transaction(table: str) -> None:
    """Inside ``write()`` a record is part of the transaction: rolled back with it, committed with it."""
    with _store(table) as store:
        with pytest.raises(RuntimeError), store.write(durable=True):
            store.record([_update(1, 1)], 2)
            raise RuntimeError("the application's block failed")
        assert store.next_offset() == 0 and _open(store) == 0
        with store.write(durable=True):
            assert store.record([_update(1, 1), _update(2, 1), _update(3, 2)], 4) == 3
            assert store.record([_update(5, 1)], 6) == 1
        assert store.next_offset() == 6 and _open(store) == 4


def test_racing_stores_never_give_one_chat_to_two_workers(table: str) -> None:
    """Eight stores (own pools, own connections) claiming at once never hold two updates of one chat."""
    chats, per_chat, racers = 6, 15, 8
    setup = _store(table)
    setup.record([_update(i, 100 + i % chats) for i in range(chats * per_chat)], chats * per_chat)
    stores = [_store(table, create_table=False, pool_size=2) for _ in range(racers)]
    barrier = threading.Barrier(racers, timeout=30)
    lock = threading.Lock()
    intervals: dict[int, list[tuple[float, float, int]]] = {}
    errors: list[BaseException] = []

    def work(store: Any) -> None:
        try:
            barrier.wait()
            while True:
                claim = claim_one(store, 30.0)
                if claim is None:
                    if _open(store) == 0:
                        return
                    time.sleep(0.001)
                    continue
                start = time.monotonic()
                time.sleep(0.002)  # hold the claim, so an overlapping one would show
                end = time.monotonic()
                with lock:
                    intervals.setdefault(claim.chat_id, []).append((start, end, claim.update_id))
                assert settle_one(store, claim.identity)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,), name=f"racer-{i}") for i, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for store in [*stores, setup]:
        store.close()
    assert not errors, errors
    handled = sorted(u for spans in intervals.values() for _s, _e, u in spans)
    assert handled == list(range(chats * per_chat)), "an update was lost or handled twice"
    for chat, spans in intervals.items():
        spans.sort()
        for (_s1, end1, u1), (start2, _e2, u2) in itertools.pairwise(spans):
            assert end1 <= start2, f"chat {chat}: updates {u1} and {u2} were held at the same time"
            assert u1 < u2, f"chat {chat}: update {u2} ran before {u1}"


def test_transaction_locks_the_row_against_a_reclaim(table: str) -> None:
    """While transaction() is open, a claim after the lease lapsed cannot take the update; the commit settles it."""
    clock = ManualClock()
    store = _store(table, clock=clock)
    other = _store(table, clock=clock, create_table=False)
    try:
        store.record([_update(1, 7)], 2)
        claim = claim_one(store, 30.0)
        with store.transaction(claim.identity, complete=True) as conn:
            conn.execute(f"CREATE TABLE {table}_domain (v int)")
            clock.advance(31)
            assert claim_one(other, 30.0) is None, "an update was reclaimed under an open fenced transaction"
            conn.execute(f"INSERT INTO {table}_domain VALUES (%s)", (1,))
        assert claim_one(other, 30.0) is None, "transaction(complete=True) did not settle the update"
        with store.write() as conn:
            assert conn.execute(f"SELECT count(*) FROM {table}_domain").fetchone()[0] == 1
    finally:
        other.close()
        store.close()


def test_lock_wait_is_bounded_and_surfaces_as_store_unavailable(table: str) -> None:
    """A row locked by another session makes transaction() raise StoreUnavailable after lock_timeout."""
    import psycopg

    store = _store(table, lock_timeout=0.3)
    try:
        store.record([_update(1, 7)], 2)
        claim = claim_one(store, 30.0)
        with psycopg.connect(DSN) as blocker:
            blocker.execute(f"SELECT 1 FROM {table} WHERE update_id = 1 FOR UPDATE")
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="lock_timeout"), store.transaction(claim.identity):
                pass
            assert time.monotonic() - started < 10
            blocker.rollback()
        with store.transaction(claim.identity, complete=True):
            pass
        assert not store.owns(claim.identity)
    finally:
        store.close()


def test_unreachable_server_raises_store_unavailable(table: str) -> None:
    """A server that does not answer raises StoreUnavailable (never a psycopg exception)."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    with pytest.raises(StoreUnavailable):
        PostgresUpdateStore("host=127.0.0.1 port=1 user=postgres dbname=test connect_timeout=1", table=table,
                            connect_timeout=1.0)


def test_a_terminated_connection_is_store_unavailable_then_recovers(table: str) -> None:
    """Backends killed under the pool make the next call StoreUnavailable at worst; later calls work again."""
    import psycopg

    from telegram_fence.store.postgres import PostgresUpdateStore

    name = f"tf_kill_{table[-12:]}"
    store = PostgresUpdateStore(dsn_with(application_name=name), table=table, pool_size=1)
    try:
        store.record([_update(1, 7)], 2)
        with psycopg.connect(DSN, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                (name,),
            ).fetchone()[0]
        assert killed >= 1
        results = []
        for _ in range(3):
            try:
                results.append(store.next_offset())
            except StoreUnavailable:
                results.append("unavailable")
        assert results[-1] == 2, results
    finally:
        store.close()


def test_server_time_by_default_and_clock_overrides(table: str) -> None:
    """Leases come from the server's clock by default; clock= replaces it exactly."""
    import psycopg

    store = _store(table)
    try:
        store.record([_update(1, 7), _update(2, 8)], 3)
        claim = claim_one(store, 30.0)
        with psycopg.connect(DSN) as conn:
            server_now = conn.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()[0]
        assert abs(claim.lease_until - (server_now + 30.0)) < 5.0
        assert abs(store.clock() - server_now) < 5.0
    finally:
        store.close()
    clock = ManualClock(start=1_000.0)
    fixed = _store(table, clock=clock, create_table=False)
    try:
        claim = claim_one(fixed, 30.0)
        assert claim is not None and claim.update_id == 2 and claim.lease_until == 1_030.0
    finally:
        fixed.close()


def test_old_table_without_fenced_columns(table: str) -> None:
    """On a table lacking the fenced columns, create_table=False refuses to open, naming schema_sql(); after
    schema_sql() everything works and the rows are kept."""
    import psycopg

    from telegram_fence.store.postgres import schema_sql

    old_layout = schema_sql(table).split("-- migration:")[0]  # the base tables, as an older schema made them
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(old_layout.encode())
        conn.execute(f"INSERT INTO {table} (update_id, payload, chat_id, recorded_at, changed_at) VALUES "
                     "(1, '{\"update_id\": 1}', 7, 0, 0), (2, '{\"update_id\": 2}', 8, 0, 0)".encode())
        conn.execute(f"INSERT INTO {table}_meta (key, value) VALUES ('cursor', 3)".encode())
    with pytest.raises(SchemaError, match="schema_sql"):
        _store(table, create_table=False)
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(schema_sql(table).encode())
        conn.execute(schema_sql(table).encode())  # idempotent
    new = _store(table, create_table=False)
    try:
        claims = [claim_one(new, 30.0), claim_one(new, 30.0)]
        assert [c.update_id for c in claims if c is not None] == [1, 2]
        assert new.next_offset() == 3
    finally:
        new.close()


def test_missing_table_with_create_table_false_is_a_schema_error(table: str) -> None:
    """create_table=False on a database without the table raises SchemaError telling what to apply."""
    with pytest.raises(SchemaError, match="schema_sql"):
        _store(table, create_table=False)


def test_write_joins_store_calls_and_rolls_back_together(table: str) -> None:
    """Store calls inside write() join its transaction: an exception undoes the application's rows and the batch."""
    store = _store(table)
    try:
        with store.write() as conn:
            conn.execute(f"CREATE TABLE {table}_domain (v int)")
        with pytest.raises(RuntimeError), store.write() as conn:
            conn.execute(f"INSERT INTO {table}_domain VALUES (1)")
            store.record([_update(1, 7)], 2)
            raise RuntimeError("undo")
        assert store.next_offset() == 0
        with store.write() as conn:
            assert conn.execute(f"SELECT count(*) FROM {table}_domain").fetchone()[0] == 0
            store.record([_update(1, 7)], 2)
        assert store.next_offset() == 2
    finally:
        store.close()


def test_stale_transaction_is_ownership_lost_and_handle_is_psycopg(table: str) -> None:
    """transaction() yields a psycopg connection; a reclaimed identity gets OwnershipLost."""
    import psycopg

    clock = ManualClock()
    store = _store(table, clock=clock)
    try:
        store.record([_update(1, 7)], 2)
        old = claim_one(store, 10.0)
        with store.transaction(old.identity) as conn:
            assert isinstance(conn, psycopg.Connection)
        clock.advance(11)
        new = claim_one(store, 10.0)
        assert new.identity != old.identity and new.attempt == 2
        with pytest.raises(OwnershipLost), store.transaction(old.identity):
            pass
    finally:
        store.close()


def test_batched_fast_paths(table: str) -> None:
    """exchange, settle_many, renew_many and release keep the claim rules in set-based statements."""
    clock = ManualClock()
    store = _store(table, clock=clock)
    try:
        store.record([_update(i, 100 + i % 3) for i in range(9)], 9)
        claims = claim_up_to(store, 30.0, 10)
        assert [c.update_id for c in claims] == [0, 1, 2], "one claim per chat, oldest first"
        assert store.renew_many([c.identity for c in claims], 60.0) == {c.identity for c in claims}
        assert store.release(claims[2].identity, attempt_counts=False)
        settled, more_claims, _more = store.exchange([claims[0].identity, claims[1].identity], 30.0, 10)
        assert settled == 2
        assert [c.update_id for c in more_claims] == [2, 3, 4]
        again = next(c for c in more_claims if c.update_id == 2)
        assert again.attempt == 1, "a claim handed back with attempt_counts=False gave its attempt back"
        assert store.settle_many([c.identity for c in more_claims]) == 3
        assert _open(store) == 4
        store.record([{"update_id": 50, "inline_query": {"id": "1", "from": {"id": 5}, "query": "", "offset": ""}}], 51)
        _settled, hinted, _more = store.exchange([], 30.0, 10, chats=[101], chatless=[50])
        assert [(c.update_id, c.chat_id) for c in hinted] == [(7, 101), (50, None)], "only the hinted lines"
        _settled, rest, _more = store.exchange([], 30.0, 10, chats=[101, 102])
        assert [c.update_id for c in rest] == [5], "chat 101 is busy; chat 102's next update is 5"
    finally:
        store.close()


def test_bad_table_name_is_a_configuration_error() -> None:
    """A table name that is not a plain identifier is refused before anything is sent to the server."""
    from telegram_fence.errors import ConfigurationError
    from telegram_fence.store.postgres import schema_sql

    for bad in ("x; DROP TABLE y", "Fence", "a.b.c", ""):
        with pytest.raises(ConfigurationError):
            schema_sql(bad)


def test_cli_prints_the_schema_and_status_shows_the_leader(table: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`schema --postgres TABLE` prints DDL that creates a usable table; `status DSN --table` names the leader."""
    import psycopg

    from telegram_fence.cli.main import main
    from telegram_fence.store.postgres import schema_sql

    assert main(["schema", "--postgres", table]) == 0
    ddl = capsys.readouterr().out
    assert ddl == schema_sql(table)
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(ddl.encode())
    store = _store(table, create_table=False)
    try:
        store.record([_update(1, 7)], 2)
        leadership = store.poll_leadership()
        assert leadership.acquire(5)
        assert main(["status", str(DSN), "--table", table]) == 0
        out = capsys.readouterr().out
        assert f"pid {os.getpid()}" in out and "epoch 1 (holding the lock)" in out
        assert "cursor               2" in out
    finally:
        store.close()


def test_renew_many_does_not_wait_for_a_claim_inside_its_transaction(table: str) -> None:
    """A claim whose owner holds a long fenced transaction is reported live at once; the others are renewed."""
    store = _store(table, lock_timeout=3.0)
    try:
        store.record([_update(1, 7), _update(2, 8)], 3)
        first, second = claim_up_to(store, 30.0, 2)
        entered, release = threading.Event(), threading.Event()

        def long_handler() -> None:
            with store.transaction(first.identity, complete=True):
                entered.set()
                release.wait(20)

        worker = threading.Thread(target=long_handler, name="long-handler")
        worker.start()
        try:
            assert entered.wait(10)
            started = time.monotonic()
            kept = store.renew_many([first.identity, second.identity], 60.0)
            assert time.monotonic() - started < 2.0, "renew_many waited for the fenced transaction"
            assert kept == {first.identity, second.identity}
        finally:
            release.set()
            worker.join(10)
        assert not store.owns(first.identity) and store.owns(second.identity)
    finally:
        store.close()


def test_opening_a_store_on_a_complete_schema_takes_no_table_lock(table: str) -> None:
    """A host starting up (create_table=True) while others hold row locks neither waits nor makes them wait."""
    import psycopg

    first = _store(table)
    try:
        first.record([_update(1, 7)], 2)
        with psycopg.connect(DSN) as busy:
            busy.execute(f"SELECT 1 FROM {table} WHERE update_id = 1 FOR UPDATE")
            started = time.monotonic()
            second = _store(table, lock_timeout=1.0)
            assert time.monotonic() - started < 1.0
            second.close()
            busy.rollback()
    finally:
        first.close()


def test_an_exhaustion_is_announced_once_its_transaction_commits(table: str) -> None:
    """The exhaustion listener hears of an exhaustion found at claim time once it committed, visible to another
    store; inside write() only when that transaction commits, never when it rolls back; a removed listener is not
    told."""
    clock = ManualClock()
    here = _store(table, clock=clock)
    there = _store(table, clock=clock, create_table=False)
    seen: list[list[int]] = []
    remove_gone = here.add_exhaustion_listener(lambda: seen.append([-1]))
    remove_gone()
    remove = here.add_exhaustion_listener(lambda: seen.append([e.identity.update_id for e in there.due_exhaustions()]))
    try:
        here.record([_update(1, 7), _update(2, 8)], 3)
        assert claim_one(here, 1.0) is not None and claim_one(here, 1.0) is not None
        clock.advance(2)
        with pytest.raises(RuntimeError), here.write():
            assert claim_one(here, 1.0, max_attempts=1) is None  # finds update 1's attempts spent
            assert seen == []
            raise RuntimeError("rolled back")
        assert seen == []
        with here.write():
            assert claim_one(here, 1.0, max_attempts=1) is None
            assert seen == []
        assert seen == [[1, 2]]
        remove()
    finally:
        there.close()
        here.close()


def test_fenced_transaction_rolls_back_whole_and_returns_a_clean_connection(table: str) -> None:
    """transaction(complete=True) (BEGIN with its check, settle with its COMMIT) commits the write, a nested store
    call and the settle together; a block that raises undoes all three and leaves no transaction open on the
    connection it returns to the pool (every later call of the store still works, with one connection)."""
    store = _store(table, pool_size=1)
    try:
        with store.write() as conn:
            conn.execute(f"CREATE TABLE {table}_domain (v int)")
        store.record([_update(1, 7), _update(2, 8)], 3)
        first = claim_one(store, 30.0)
        with pytest.raises(RuntimeError), store.transaction(first.identity, complete=True) as conn:
            conn.execute(f"INSERT INTO {table}_domain VALUES (1)")
            store.record([_update(3, 9)], 4)
            raise RuntimeError("undo")
        assert store.owns(first.identity), "the failed block settled the claim"
        assert store.next_offset() == 3, "the nested record survived the rollback"
        with store.transaction(first.identity, complete=True) as conn:
            conn.execute(f"INSERT INTO {table}_domain VALUES (2)")
            store.record([_update(3, 9)], 4)
        assert not store.owns(first.identity) and store.next_offset() == 4
        with store.write() as conn:
            assert conn.execute(f"SELECT array_agg(v) FROM {table}_domain").fetchone()[0] == [2]
        with pytest.raises(OwnershipLost), store.transaction(first.identity):
            pass
        assert settle_one(store, claim_one(store, 30.0).identity)
    finally:
        store.close()


def test_the_stores_own_sessions_run_prepared_statements_on_generic_plans(table: str) -> None:
    """A session of the store's own pool plans the statements psycopg prepares once (``force_generic_plan``), and
    keeps its lock and statement timeouts, so a repeated claim is not planned again on every call."""
    store = _store(table, pool_size=1, lock_timeout=3.0)
    try:
        with store.read() as conn:
            modes = conn.execute("SELECT current_setting('plan_cache_mode'), "
                                 "current_setting('lock_timeout')").fetchone()
        assert tuple(modes) == ("force_generic_plan", "3s")
    finally:
        store.close()


def test_a_session_the_application_reset_still_serves_the_store(table: str) -> None:
    """The claim and the fenced transaction run on a pooled session whose statements psycopg prepared; after the
    application resets that session (``DEALLOCATE ALL`` on the connection the store lends it) the calls succeed."""
    store = _store(table, pool_size=1)
    try:
        store.record([_update(1, 7), _update(2, 8), _update(3, 9)], 4)
        for _ in range(6):  # past psycopg's prepare threshold
            store.exchange([], 30.0, 1, chats=[99], chatless=[])
        first = claim_one(store, 30.0)
        with store.transaction(first.identity, complete=True):
            pass
        with store.write() as conn:
            held = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
            assert held[0] >= 1, "no statement of the store was prepared on its session"
            conn.execute("DEALLOCATE ALL")
        second = claim_one(store, 30.0)
        assert second is not None and second.update_id == 2
        with store.transaction(second.identity, complete=True):
            pass
        _settled, claims, _more = store.exchange([], 30.0, 10, chats=[9], chatless=[])
        assert [c.update_id for c in claims] == [3]
        assert not store.owns(second.identity)
    finally:
        store.close()
