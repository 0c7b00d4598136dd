"""The call journal's one-statement writes on a real PostgreSQL server: the intent checked and written in one
statement (``owned_statement``), the outcome in one statement whose commit does not wait for the disk
(``one_statement(flush=False)``: the statement behind its transaction's setting), both refused or undone where the
transaction path would be, and nothing left on the pooled sessions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_support import DSN, drop_tables, new_table, requires_pg
from store_helpers import claim_one, settle_one

from telegram_fence.calls.journal import Journal, OneTripJournalStore, list_calls
from telegram_fence.errors import OwnershipLost
from telegram_fence.store import Identity

pytestmark = requires_pg

LEASE = 30.0


@pytest.fixture
def store() -> Iterator[Any]:
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = new_table("tf_jtrip")
    opened = PostgresUpdateStore(str(DSN), table=table, pool_size=1)  # one session: every call shows on it
    try:
        yield opened
    finally:
        opened.close()
        drop_tables(table)


def _claimed(store: Any, update_id: int = 1) -> Identity:
    store.record([{"update_id": update_id, "message": {"message_id": 1, "date": 0,
                                                       "chat": {"id": 7, "type": "private"}, "text": "x"}}],
                 update_id + 1)
    claim = claim_one(store, LEASE)
    assert claim is not None and claim.update_id == update_id
    return claim.identity


def _calls(store: Any) -> list[tuple[int, int, str, str | None]]:
    with store.read() as conn:
        return [(r.update_id, r.seq, r.state, r.answer) for r in list_calls(conn)]


class _Trips:
    """Counts the requests psycopg sends to the server (each execute is one round trip)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for cls in (psycopg.Cursor, psycopg.ClientCursor):  # (each class's own execute, not one it inherits)
            original = cls.__dict__.get("execute")
            if original is None:
                continue

            def counted(cur: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                self.count += 1
                return _original(cur, *args, **kwargs)

            monkeypatch.setattr(cls, "execute", counted)
        assert "execute" in psycopg.Cursor.__dict__


def test_only_the_postgres_store_takes_the_one_trip_path(store: Any, tmp_path: Path) -> None:
    """The PostgreSQL store is a one-trip journal store; a SQLite store is not (its journal keeps its transactions)."""
    from telegram_fence import SqliteUpdateStore

    assert isinstance(store, OneTripJournalStore)
    with SqliteUpdateStore(tmp_path / "bot.db") as sqlite:
        assert not isinstance(sqlite, OneTripJournalStore)


def test_an_intent_is_one_statement_and_its_outcome_one_behind_its_setting(store: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A live claim's first call at a position: the intent is one statement, the outcome one more behind the setting
    of its lazy commit, and the row reads ``sent`` with its answer."""
    identity = _claimed(store)
    journal = Journal(store)
    journal.open_call(identity, 0, "sendMessage", 7, "warm")
    journal.record(identity, 0, "sent", 200, '{"ok":true}')
    trips = _Trips(monkeypatch)
    assert journal.open_call(identity, 1, "sendMessage", 7, "fp") == (None, 0.0)
    assert trips.count == 1
    assert journal.record(identity, 1, "sent", 200, '{"ok":true,"result":1}') is True
    assert trips.count == 3
    assert _calls(store)[1] == (1, 1, "sent", '{"ok":true,"result":1}')


def test_a_queued_calls_take_and_outcome_are_one_statement_each(store: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A call queued in a fenced transaction: turning it into its sender's intent is one statement (and a second
    sender gets nothing), its outcome one more, committed."""
    identity = _claimed(store)
    journal = Journal(store)
    with store.transaction(identity) as conn:
        journal.queue(conn, identity, [(0, "sendMessage", 7, "fp", '{"method": "sendMessage"}'),
                                       (1, "sendMessage", 7, "fp", '{"method": "sendMessage"}')])
    assert journal.take_queued(identity.update_id, 0, "warm") is not None
    journal.record(Identity(identity.update_id, 0, "warm"), 0, "sent", 200, "{}", flush=True)
    trips = _Trips(monkeypatch)
    assert journal.take_queued(identity.update_id, 1, "sender") == {"method": "sendMessage"}
    assert trips.count == 1
    assert journal.take_queued(identity.update_id, 1, "another") is None
    assert journal.record(Identity(identity.update_id, 0, "sender"), 1, "sent", 200, '{"ok":true}',
                          flush=True) is True
    assert trips.count == 3
    assert _calls(store) == [(1, 0, "sent", "{}"), (1, 1, "sent", '{"ok":true}')]


def test_the_outcomes_lazy_commit_leaves_no_setting_on_the_session(store: Any) -> None:
    """After an outcome committed without waiting for the disk, the pooled session (the only one) is back at the
    server's ``synchronous_commit`` and in no transaction."""
    identity = _claimed(store)
    journal = Journal(store)
    journal.open_call(identity, 0, "sendMessage", 7, "fp")
    assert journal.record(identity, 0, "refused", 400, '{"ok":false}') is True
    with store.read() as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert _calls(store) == [(1, 0, "refused", '{"ok":false}')]


def test_a_stale_attempt_writes_no_intent(store: Any) -> None:
    """An identity whose claim is gone (another claim id, or the update settled) is refused with OwnershipLost in
    the one statement, and no row is written."""
    identity = _claimed(store)
    journal = Journal(store)
    stale = Identity(identity.update_id, identity.attempt, "someone-else")
    with pytest.raises(OwnershipLost):
        journal.open_call(stale, 0, "sendMessage", 7, "fp")
    assert settle_one(store, identity) is True
    with pytest.raises(OwnershipLost):
        journal.open_call(identity, 0, "sendMessage", 7, "fp")
    assert _calls(store) == []


def test_a_position_journaled_before_is_read_back_and_made_uncertain(store: Any) -> None:
    """A later attempt reaching a position an earlier one left in flight gets that row back, turned uncertain
    (the one statement inserts nothing; the transaction path reads it)."""
    identity = _claimed(store)
    journal = Journal(store)
    assert journal.open_call(identity, 0, "sendMessage", 7, "fp") == (None, 0.0)
    row, pause = journal.open_call(identity, 0, "sendMessage", 7, "fp")
    assert row is not None and row.state == "uncertain" and pause == 0.0
    assert [c[2] for c in _calls(store)] == ["uncertain"]


def test_the_intent_reads_the_shared_pause_of_its_chat(store: Any) -> None:
    """The one statement also returns when the chat's shared pause ends."""
    identity = _claimed(store)
    journal = Journal(store)
    journal.pause("chat:7", 4_000_000_000.0)
    assert journal.open_call(identity, 0, "sendMessage", 7, "fp") == (None, 4_000_000_000.0)


def test_inside_a_write_both_join_the_transaction_and_roll_back_with_it(store: Any) -> None:
    """Called inside ``store.write()`` on the same thread, the intent and the outcome join that transaction: a block
    that raises takes them back."""
    identity = _claimed(store)
    journal = Journal(store)
    with pytest.raises(RuntimeError), store.write():
        assert journal.open_call(identity, 0, "sendMessage", 7, "fp") == (None, 0.0)
        assert journal.record(identity, 0, "sent", 200, "{}") is True
        assert [c[2] for c in _calls(store)] == ["sent"]  # (read in the same transaction)
        raise RuntimeError("undo")
    assert _calls(store) == []


def test_a_session_reset_with_deallocate_all_still_journals(store: Any) -> None:
    """``DEALLOCATE ALL`` on the store's one session: the next intent and outcome still go through."""
    identity = _claimed(store)
    journal = Journal(store)
    journal.open_call(identity, 0, "sendMessage", 7, "fp")
    journal.record(identity, 0, "sent", 200, "{}")
    with store.read() as conn:
        conn.execute("DEALLOCATE ALL")
    assert journal.open_call(identity, 1, "sendMessage", 7, "fp") == (None, 0.0)
    assert journal.record(identity, 1, "sent", 200, "{}") is True
    assert [c[:3] for c in _calls(store)] == [(1, 0, "sent"), (1, 1, "sent")]


@pytest.mark.parametrize("reclaimed", [True, False])
def test_an_intent_waiting_on_a_reclaim_in_flight_follows_its_outcome(store: Any, reclaimed: bool) -> None:
    """A reclaim in flight (another session changed the claim's row and holds its lock, not committed yet) makes
    the one-statement intent wait; when the reclaim commits, the intent sees the row's new claim and is refused
    with OwnershipLost, nothing written; when it rolls back, the intent is written for the still-live claim."""
    import threading

    identity = _claimed(store)
    journal = Journal(store)
    journal.open_call(identity, 0, "sendMessage", 7, "warm")
    journal.record(identity, 0, "sent", 200, "{}")
    outcome: list[object] = []
    with psycopg.connect(str(DSN)) as other:
        other.execute(f"UPDATE {store.table} SET attempt = attempt + 1, claim_id = 'reclaimer' "
                      "WHERE update_id = %s", (identity.update_id,))
        (other_pid,) = other.execute("SELECT pg_backend_pid()").fetchone() or (0,)

        def intent() -> None:
            try:
                outcome.append(journal.open_call(identity, 1, "sendMessage", 7, "fp"))
            except OwnershipLost as exc:
                outcome.append(exc)

        worker = threading.Thread(target=intent, name="intent")
        worker.start()
        with psycopg.connect(str(DSN), autocommit=True) as watcher:
            for _ in range(500):  # until the intent waits for the reclaim's row lock
                waiting = watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY("
                                          "pg_blocking_pids(pid))", (other_pid,)).fetchone()
                if waiting and waiting[0]:
                    break
                worker.join(0.01)
            else:
                pytest.fail("the intent never waited for the reclaim's lock")
        assert not outcome, "the intent did not wait for the reclaim in flight"
        if reclaimed:
            other.commit()
        else:
            other.rollback()
        worker.join(10)
    assert not worker.is_alive()
    if reclaimed:
        assert len(outcome) == 1 and isinstance(outcome[0], OwnershipLost)
        assert [c[:3] for c in _calls(store)] == [(1, 0, "sent")]
    else:
        assert outcome == [(None, 0.0)]
        assert [c[:3] for c in _calls(store)] == [(1, 0, "sent"), (1, 1, "intent")]


def test_a_session_the_server_ended_fails_the_intent_or_outcome_without_a_trace_then_they_go_through() -> None:
    """The store's one session is ended by the server (a restart, an admin) between calls: the next intent raises a
    StoreError and writes nothing (the request is never sent), the one after it is written on a new session; an
    outcome that meets an ended session raises too and leaves the intent, which a later attempt reads back uncertain
    (never sent again)."""
    from pg_support import dsn_with

    from telegram_fence.errors import StoreError
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = new_table("tf_jtrip")
    name = f"tf_jend_{table[-12:]}"
    store = PostgresUpdateStore(dsn_with(application_name=name), table=table, pool_size=1)

    def end_sessions() -> int:
        with psycopg.connect(str(DSN), autocommit=True) as admin:
            row = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                "WHERE application_name = %s", (name,)).fetchone()
            return int(row[0]) if row else 0

    try:
        identity = _claimed(store)
        journal = Journal(store)
        assert end_sessions() >= 1
        with pytest.raises(StoreError):
            journal.open_call(identity, 0, "sendMessage", 7, "fp")
        assert _calls(store) == []
        assert journal.open_call(identity, 0, "sendMessage", 7, "fp") == (None, 0.0)
        assert end_sessions() >= 1
        with pytest.raises(StoreError):
            journal.record(identity, 0, "sent", 200, '{"ok":true}')
        assert [c[2] for c in _calls(store)] == ["intent"]
        row, _pause = journal.open_call(identity, 0, "sendMessage", 7, "fp")
        assert row is not None and row.state == "uncertain"
    finally:
        store.close()
        drop_tables(table)
