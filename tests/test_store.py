"""SqliteUpdateStore beyond the shared contract: the file, the schema, errors, batch forms, threads."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import apsw
import pytest
from helpers import pragma, rows
from store_helpers import claim_one, claim_up_to, settle_one

from telegram_fence.errors import (
    ConfigurationError,
    InvalidUpdate,
    OwnershipLost,
    SchemaError,
    StoreCorrupt,
    StoreUnavailable,
)
from telegram_fence.store import Identity, UpdateStore, missing_methods
from telegram_fence.store.schema import LATEST
from telegram_fence.store.sqlite import SqliteUpdateStore
from telegram_fence.testing.conformance import ManualClock

LEASE = 30.0


def message(update_id: int, chat: int | None = None, text: str = "hi") -> dict[str, Any]:
    chat_id = 1000 + update_id if chat is None else chat
    return {
        "update_id": update_id,
        "message": {"message_id": update_id, "date": 0, "chat": {"id": chat_id, "type": "private"}, "text": text},
    }


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> Any:
    s = SqliteUpdateStore(tmp_path / "bot.db", clock=clock)
    yield s
    s.close()


def raw(path: Path) -> apsw.Connection:
    conn = apsw.Connection(str(path))
    conn.set_busy_timeout(5000)
    return conn


# --- the file -----------------------------------------------------------------------------------


def test_new_database_files_are_private(tmp_path: Path) -> None:
    """The database, its WAL files and its -owners lock file are created with mode 0600, even under a permissive
    umask."""
    old = os.umask(0)
    try:
        with SqliteUpdateStore(tmp_path / "bot.db") as s:
            s.record([message(1)], 2)
            files = sorted(p.name for p in tmp_path.iterdir())
            modes = {p.name: oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()}
    finally:
        os.umask(old)
    assert files == ["bot.db", "bot.db-owners", "bot.db-shm", "bot.db-wal"]
    assert modes == {name: "0o600" for name in files}


def test_symlink_is_refused(tmp_path: Path) -> None:
    """A path that is a symbolic link (to a database or to nothing) is refused and nothing is created."""
    with SqliteUpdateStore(tmp_path / "real.db") as s:
        s.record([message(1)], 2)
    (tmp_path / "link.db").symlink_to(tmp_path / "real.db")
    (tmp_path / "dangling.db").symlink_to(tmp_path / "missing.db")
    for name in ("link.db", "dangling.db"):
        with pytest.raises(StoreCorrupt, match="is a symbolic link"):
            SqliteUpdateStore(tmp_path / name)
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.parametrize(
    "content",
    [b"not a database at all\n" * 300, b"hi", b"SQLite format 2\x00" + b"\x00" * 200],
    ids=["text", "tiny", "wrong-header"],
)
def test_non_database_file_is_refused_and_left_unchanged(tmp_path: Path, content: bytes) -> None:
    """A file that is not a SQLite database raises StoreCorrupt and stays byte-for-byte the same, with no WAL files."""
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    os.chmod(path, 0o644)
    before = path.stat()
    with pytest.raises(StoreCorrupt, match="is not a SQLite database"):
        SqliteUpdateStore(path)
    assert path.read_bytes() == content
    after = path.stat()
    assert (after.st_mtime_ns, after.st_mode) == (before.st_mtime_ns, before.st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_directory_and_missing_parent_are_refused(tmp_path: Path) -> None:
    """A directory is not a database file; a path in a missing directory says the directory is missing."""
    (tmp_path / "adir").mkdir()
    with pytest.raises(StoreCorrupt, match="not a regular file"):
        SqliteUpdateStore(tmp_path / "adir")
    with pytest.raises(StoreUnavailable, match="does not exist"):
        SqliteUpdateStore(tmp_path / "nowhere" / "bot.db")


def test_the_file_is_in_wal_mode(store: SqliteUpdateStore) -> None:
    """The store puts its file in WAL mode."""
    assert pragma(store, "journal_mode") == "wal"


def test_every_connection_keeps_sqlites_temporary_data_in_memory(store: SqliteUpdateStore) -> None:
    """Each thread's connection has temp_store=MEMORY: the undo journal of a round's savepoints never becomes a
    temporary file."""
    seen: list[int] = []
    worker = threading.Thread(target=lambda: seen.append(pragma(store, "temp_store")))
    worker.start()
    worker.join()
    assert [pragma(store, "temp_store"), *seen] == [2, 2]


def test_reopen_keeps_cursor_rows_and_live_claims(tmp_path: Path, clock: ManualClock) -> None:
    """After close and reopen, the cursor, the pending updates and a live claim's identity are all still there."""
    path = tmp_path / "bot.db"
    with SqliteUpdateStore(path, clock=clock) as s:
        s.record([message(1), message(2)], 3)
        s.record([message(3)], 17)
        claim = claim_one(s, LEASE)
    assert claim is not None
    with SqliteUpdateStore(path, clock=clock) as s:
        assert s.next_offset() == 17
        assert s.owns(claim.identity)
        assert [c.update_id for c in claim_up_to(s, LEASE, 10)] == [2, 3]
        assert s.stats()["claimed"] == 3


def test_closed_store_refuses_work(tmp_path: Path) -> None:
    """A closed store raises StoreUnavailable instead of reopening the file behind the caller's back."""
    s = SqliteUpdateStore(tmp_path / "bot.db")
    s.close()
    with pytest.raises(StoreUnavailable, match="was closed"):
        s.record([message(1)], 2)


# --- the schema ---------------------------------------------------------------------------------


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    """A file whose user_version is newer than this library raises SchemaError and keeps its version."""
    path = tmp_path / "bot.db"
    SqliteUpdateStore(path).close()
    conn = raw(path)
    conn.pragma("user_version", 99)
    conn.close()
    with pytest.raises(SchemaError, match=r"version 99 is newer than this library supports"):
        SqliteUpdateStore(path)
    conn = raw(path)
    assert conn.pragma("user_version") == 99
    conn.close()


def test_old_schema_is_upgraded_keeping_data(tmp_path: Path, clock: ManualClock) -> None:
    """A file created at schema version 1 opens at the latest version with its rows and cursor intact."""
    path = tmp_path / "bot.db"
    with SqliteUpdateStore(path, clock=clock, schema_version=1) as old:
        old.record([message(1), message(2)], 3)
        assert pragma(old, "user_version") == 1
        tables = {r[0] for r in rows(old, "SELECT name FROM sqlite_schema WHERE type = 'table'")}
        assert "fence_outbox" not in tables
    with SqliteUpdateStore(path, clock=clock) as new:
        assert new.stats()["schema_version"] == LATEST
        assert new.next_offset() == 3
        assert [c.update_id for c in claim_up_to(new, LEASE, 10)] == [1, 2]
        new.begin_generation()  # a table of a later migration is usable


def test_unknown_target_version_is_refused(tmp_path: Path) -> None:
    """Asking for a schema version this library does not know raises SchemaError."""
    with pytest.raises(SchemaError, match=f"no schema version {LATEST + 4}"):
        SqliteUpdateStore(tmp_path / "bot.db", schema_version=LATEST + 4)


# --- configuration and bad input ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"synchronous": "SOMETIMES"}, "synchronous='SOMETIMES'"),
        ({"work_synchronous": "fast"}, "work_synchronous='fast'"),
        ({"busy_timeout": -1}, "busy_timeout=-1"),
    ],
)
def test_bad_options_are_named(tmp_path: Path, options: dict[str, Any], pattern: str) -> None:
    """A bad option raises ConfigurationError naming the option and the value."""
    with pytest.raises(ConfigurationError, match=pattern):
        SqliteUpdateStore(tmp_path / "bot.db", **options)


@pytest.mark.parametrize(
    ("batch", "pattern"),
    [
        ([message(5), "junk"], r"update #1 of the batch is a str, not a mapping"),
        ([message(5), message(6), None], r"update #2 of the batch is a NoneType, not a mapping"),
        ([{"message": {}}], r"update #0 of the batch has update_id=None"),
        ([message(5), {"update_id": "7"}], r"update #1 of the batch has update_id='7'"),
        ([message(5), {"update_id": 7.0}], r"update #1 of the batch has update_id=7\.0"),
        ([message(5), {"update_id": True}], r"update #1 of the batch has update_id=True"),
        ([message(5), {"update_id": -3}], r"update #1 of the batch has update_id=-3"),
    ],
)
def test_invalid_update_names_the_item(store: SqliteUpdateStore, batch: list[Any], pattern: str) -> None:
    """InvalidUpdate says which item of the batch is malformed and how; nothing is stored and the cursor stays."""
    store.record([message(1)], 2)
    with pytest.raises(InvalidUpdate, match=pattern) as info:
        store.record(batch, 50)
    assert "nothing was stored" in str(info.value)
    assert isinstance(info.value, ValueError)
    assert store.next_offset() == 2
    assert store.stats()["pending"] == 1


def test_record_refuses_a_non_sequence_and_a_bad_offset(store: SqliteUpdateStore) -> None:
    """record() names a batch that is not a sequence and a next_offset that is not a non-negative integer."""
    with pytest.raises(InvalidUpdate, match="takes a sequence of update dicts, got dict"):
        store.record(message(1), 2)  # type: ignore[arg-type]
    with pytest.raises(InvalidUpdate, match="next_offset='3'"):
        store.record([message(1)], "3")  # type: ignore[arg-type]
    with pytest.raises(InvalidUpdate, match="next_offset=-1"):
        store.record([message(1)], -1)
    assert store.stats()["pending"] == 0


def test_a_different_payload_is_reported(store: SqliteUpdateStore, caplog: pytest.LogCaptureFixture) -> None:
    """Recording an update_id again with another payload logs a warning naming it; the same payload is silent."""
    store.record([message(1, text="first")], 2)
    with caplog.at_level(logging.WARNING, logger="telegram_fence.store"):
        assert store.record([message(1, text="first")], 2) == 0
        assert caplog.records == []
        assert store.record([message(1, text="second")], 2) == 0
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING
    assert "different payload" in warning.getMessage()
    assert warning.update_id == 1  # type: ignore[attr-defined]


def test_a_batch_interleaved_with_stored_ids_stores_only_its_new_ones(
    store: SqliteUpdateStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch whose ids lie between stored ones (out-of-order webhook deliveries) stores each new id once, from
    the body too, and warns only about a stored id that came again with another payload."""
    store.record([message(2), message(4)], 0)
    batch = [message(1), message(3), message(5)]
    body = json.dumps({"ok": True, "result": batch}).encode()
    with caplog.at_level(logging.WARNING, logger="telegram_fence.store"):
        assert store.record(batch, 0, body=body) == 3
        assert caplog.records == []
        again = [message(3), message(4, text="changed"), message(6)]
        assert store.record(again, 0, body=json.dumps({"ok": True, "result": again}).encode()) == 1
    [warning] = caplog.records
    assert warning.update_id == 4  # type: ignore[attr-defined]
    assert store.stats()["pending"] == 6
    assert store.next_offset() == 0  # next_offset=0 leaves the cursor where it was


def test_bad_claim_arguments_are_named(store: SqliteUpdateStore) -> None:
    """claim with a non-positive lease or max_attempts, paging with limit 0, and a non-Identity are refused by name."""
    with pytest.raises(ConfigurationError, match="lease=0"):
        claim_one(store, 0)
    with pytest.raises(ConfigurationError, match="max_attempts=0"):
        claim_one(store, LEASE, max_attempts=0)
    with pytest.raises(ConfigurationError, match="limit=0"):
        store.due_exhaustions(limit=0)
    with pytest.raises(TypeError, match="expected an Identity"):
        store.owns((1, 1, "x"))  # type: ignore[arg-type]


# --- fencing and durability specifics -----------------------------------------------------------

DOMAIN = "CREATE TABLE IF NOT EXISTS handled(update_id INTEGER NOT NULL UNIQUE, claim_id TEXT NOT NULL)"


def test_stale_worker_transaction_is_refused_and_its_write_absent(tmp_path: Path, clock: ManualClock) -> None:
    """A worker whose update was reclaimed after its lease expired gets OwnershipLost; only the new row exists."""
    path = tmp_path / "bot.db"
    worker_a = SqliteUpdateStore(path, clock=clock)
    worker_b = SqliteUpdateStore(path, clock=clock)  # another process, in effect: its own connections
    with worker_a.write() as conn:
        conn.execute(DOMAIN)
    worker_a.record([message(1)], 2)
    stale = claim_one(worker_a, LEASE)
    assert stale is not None
    clock.advance(LEASE + 1)
    fresh = claim_one(worker_b, LEASE)
    assert fresh is not None and fresh.identity.attempt == 2
    ran = []
    with pytest.raises(OwnershipLost) as info, worker_a.transaction(stale.identity, complete=True) as conn:
        ran.append(True)
        conn.execute("INSERT INTO handled VALUES (?, ?)", (1, stale.identity.claim_id))
    assert ran == []  # refused before the block runs
    assert info.value.identity == stale.identity
    assert str(stale.identity) in str(info.value)
    with worker_b.transaction(fresh.identity, complete=True) as conn:
        conn.execute("INSERT INTO handled VALUES (?, ?)", (1, fresh.identity.claim_id))
    found = rows(worker_a, "SELECT update_id, claim_id FROM handled")
    assert found == [(1, fresh.identity.claim_id)]
    assert worker_a.stats()["settled"] == 1
    worker_a.close()
    worker_b.close()


def test_transaction_complete_rolls_back_with_the_block(store: SqliteUpdateStore) -> None:
    """When the block of transaction(complete=True) raises, its write and the settlement both roll back."""
    with store.write() as conn:
        conn.execute(DOMAIN)
    store.record([message(1)], 2)
    claim = claim_one(store, LEASE)
    assert claim is not None
    with pytest.raises(ZeroDivisionError), store.transaction(claim.identity, complete=True) as conn:
        conn.execute("INSERT INTO handled VALUES (1, 'x')")
        1 / 0  # noqa: B018
    assert rows(store, "SELECT count(*) FROM handled")[0][0] == 0
    assert store.owns(claim.identity)
    with store.transaction(claim.identity, complete=True) as conn:
        conn.execute("INSERT INTO handled VALUES (1, 'x')")
    assert store.stats()["settled"] == 1


def test_durability_levels_are_applied_per_transaction(tmp_path: Path) -> None:
    """record() commits at `synchronous`, work transactions at `work_synchronous`."""
    s = SqliteUpdateStore(tmp_path / "bot.db", synchronous="FULL", work_synchronous="NORMAL")
    seen: dict[str, int] = {}
    s.record([message(1)], 2, on_record=lambda conn, new: seen.__setitem__("record", conn.pragma("synchronous")))
    claim = claim_one(s, LEASE)
    assert claim is not None
    with s.transaction(claim.identity) as conn:
        seen["work"] = conn.pragma("synchronous")
    s.record([message(2)], 3, on_record=lambda conn, new: seen.__setitem__("again", conn.pragma("synchronous")))
    assert seen == {"record": 2, "work": 1, "again": 2}
    s.close()


def test_on_record_failure_stores_nothing(store: SqliteUpdateStore) -> None:
    """If the on_record hook raises, neither the batch nor the cursor is stored."""

    def hook(conn: apsw.Connection, new: Any) -> None:
        raise RuntimeError("outbox full")

    with pytest.raises(RuntimeError, match="outbox full"):
        store.record([message(1)], 2, on_record=hook)
    assert store.next_offset() == 0
    assert store.stats()["pending"] == 0


def test_skipped_updates_are_never_claimed(store: SqliteUpdateStore, clock: ManualClock) -> None:
    """Updates recorded in `skip` are stored as skipped: never claimed, prunable like settled ones."""
    assert store.record([message(1), message(2)], 3, skip={1}) == 2
    claim = claim_one(store, LEASE)
    assert claim is not None and claim.update_id == 2
    assert claim_one(store, LEASE) is None
    assert store.stats()["skipped"] == 1
    clock.advance(1)
    assert store.prune(clock()) == 1


def test_retried_update_with_spent_attempts_keeps_its_error(store: SqliteUpdateStore, clock: ManualClock) -> None:
    """An update retried after its last allowed attempt becomes an exhaustion carrying the handler's error."""
    store.record([message(1)], 2)
    claim = claim_one(store, LEASE, max_attempts=1)
    assert claim is not None
    assert store.retry_owned(claim.identity, clock(), "ValueError: bad input")
    assert claim_one(store, LEASE, max_attempts=1) is None
    [exhaustion] = store.due_exhaustions()
    assert exhaustion.identity == claim.identity
    assert exhaustion.error == "ValueError: bad input"
    assert claim_one(store, LEASE) is None


def test_lapsed_last_attempt_is_explained(store: SqliteUpdateStore, clock: ManualClock) -> None:
    """A last attempt that lost its lease is exhausted with an error saying so, and is delivered once per page."""
    store.record([message(1)], 2)
    claim = claim_one(store, LEASE, max_attempts=1)
    assert claim is not None
    clock.advance(LEASE + 1)
    assert claim_one(store, LEASE, max_attempts=1) is None
    [exhaustion] = store.due_exhaustions()
    assert "attempt 1 of 1 lost its lease" in exhaustion.error
    assert exhaustion.exhausted_at == clock()
    assert exhaustion.chat_id == 1001
    assert store.due_exhaustions(after=exhaustion.identity) == []


def test_exhaustion_survives_reopen(tmp_path: Path, clock: ManualClock) -> None:
    """An unacknowledged exhaustion is still due after the store is closed and reopened."""
    path = tmp_path / "bot.db"
    with SqliteUpdateStore(path, clock=clock) as s:
        s.record([message(1)], 2)
        claim = claim_one(s, LEASE)
        assert claim is not None
        s.exhaust(claim.identity, "boom")
    with SqliteUpdateStore(path, clock=clock) as s:
        assert [e.identity for e in s.due_exhaustions()] == [claim.identity]
        assert s.acknowledge_exhaustion(claim.identity)
        assert s.stats()["acknowledged"] == 1


# --- batch forms --------------------------------------------------------------------------------


def test_a_claim_takes_one_update_per_chat(store: SqliteUpdateStore) -> None:
    """A claim of many takes them in update_id order, at most one update per chat, each with its own claim_id."""
    store.record([message(1, 7), message(2, 7), message(3, 8), message(4, 9), message(5, 10)], 6)
    claims = claim_up_to(store, LEASE, 10)
    assert [c.update_id for c in claims] == [1, 3, 4, 5]
    assert len({c.identity.claim_id for c in claims}) == 4
    assert claim_up_to(store, LEASE, 10) == []  # 2 waits for chat 7's live claim


def test_a_claim_respects_the_limit(store: SqliteUpdateStore) -> None:
    """A claim returns at most `limit` claims, the oldest first."""
    store.record([message(i) for i in range(1, 11)], 11)
    assert [c.update_id for c in claim_up_to(store, LEASE, 4)] == [1, 2, 3, 4]
    assert [c.update_id for c in claim_up_to(store, LEASE, 100)] == [5, 6, 7, 8, 9, 10]


def test_settle_many_settles_only_live_exact_claims(store: SqliteUpdateStore, clock: ManualClock) -> None:
    """settle_many() settles the identities that are live and exact, and counts only those."""
    store.record([message(i) for i in range(1, 5)], 5)
    claims = claim_up_to(store, LEASE, 4)
    wrong = Identity(claims[0].update_id, claims[0].attempt, "not-the-claim")
    assert store.settle_many([]) == 0
    assert store.settle_many([wrong, claims[1].identity, claims[2].identity]) == 2
    assert store.owns(claims[0].identity) and store.owns(claims[3].identity)
    clock.advance(LEASE + 1)
    assert store.settle_many([claims[0].identity, claims[3].identity]) == 0
    assert store.stats()["settled"] == 2


def test_renew_many_returns_the_live_subset(store: SqliteUpdateStore, clock: ManualClock) -> None:
    """renew_many() extends the live exact claims and returns exactly those identities."""
    store.record([message(i) for i in range(1, 4)], 4)
    a, b, c = claim_up_to(store, LEASE, 3)
    settle_one(store, b.identity)
    stale = Identity(c.update_id, c.attempt, "not-the-claim")
    clock.advance(LEASE - 1)
    assert store.renew_many([], LEASE) == set()
    assert store.renew_many([a.identity, b.identity, stale], LEASE) == {a.identity}
    clock.advance(2)
    assert store.owns(a.identity)
    assert not store.owns(c.identity)


# --- transactions, threads, locks ----------------------------------------------------------------


def test_nested_write_is_a_savepoint(store: SqliteUpdateStore) -> None:
    """A write() inside a write() rolls back on its own when it raises; the outer block still commits."""
    with store.write() as conn:
        conn.execute("CREATE TABLE t(x)")
    with store.write() as conn:
        conn.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(KeyError), store.write() as inner:
            inner.execute("INSERT INTO t VALUES (2)")
            raise KeyError("inner")
    assert rows(store, "SELECT x FROM t") == [(1,)]


def test_a_lock_held_too_long_is_store_unavailable(tmp_path: Path) -> None:
    """When another connection holds the write lock past busy_timeout, a claim raises StoreUnavailable; reads go on."""
    path = tmp_path / "bot.db"
    s = SqliteUpdateStore(path, busy_timeout=0.05)
    s.record([message(1)], 2)
    other = raw(path)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailable, match="stayed locked") as info:
            claim_one(s, LEASE)
        assert isinstance(info.value.__cause__, apsw.BusyError)
        assert s.next_offset() == 2  # WAL: readers are not blocked by the writer
    finally:
        other.execute("ROLLBACK")
        other.close()
    claim = claim_one(s, LEASE)
    assert claim is not None and claim.attempt == 1  # the refused claim left no trace
    s.close()


def test_threads_share_one_store(tmp_path: Path) -> None:
    """8 threads sharing one store handle 400 updates, each exactly once, through transaction(complete=True)."""
    s = SqliteUpdateStore(tmp_path / "bot.db")
    with s.write() as conn:
        conn.execute(DOMAIN)
    s.record([message(i, chat=i % 13) for i in range(1, 401)], 401)
    errors: list[BaseException] = []
    stop = threading.Event()

    def work() -> None:
        try:
            while not stop.is_set():
                claim = claim_one(s, LEASE)
                if claim is None:
                    if s.stats()["pending"] == 0:
                        return
                    stop.wait(0.001)  # another thread holds this chat's line
                    continue
                with s.transaction(claim.identity, complete=True) as conn:
                    conn.execute("INSERT INTO handled VALUES (?, ?)", (claim.update_id, claim.identity.claim_id))
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=work, name=f"test-worker-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stop.set()
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert rows(s, "SELECT count(*), count(DISTINCT update_id) FROM handled") == [(400, 400)]
    assert rows(s, "SELECT max(attempt) FROM fence_updates") == [(1,)]
    assert s.stats()["settled"] == 400
    s.close()


def test_stats_report_states_cursor_and_age(store: SqliteUpdateStore, clock: ManualClock) -> None:
    """stats() counts rows by state and reports the cursor, the oldest open update's age and the schema version."""
    store.record([message(i) for i in range(1, 6)], 6)
    clock.advance(7)
    a, b, _ = claim_up_to(store, LEASE, 3)
    settle_one(store, a.identity)
    store.exhaust(b.identity, "boom")
    stats = store.stats()
    assert {k: stats[k] for k in ("pending", "claimed", "settled", "exhausted", "acknowledged")} == {
        "pending": 2,
        "claimed": 1,
        "settled": 1,
        "exhausted": 1,
        "acknowledged": 0,
    }
    assert stats["cursor"] == 6
    assert stats["oldest_open_age"] == 7
    assert stats["schema_version"] == LATEST


def test_sqlite_store_has_every_method_of_the_store_protocol(store: SqliteUpdateStore) -> None:
    """The SQLite store has every method the runtime calls; an object with only some of them is told which it
    lacks."""
    assert isinstance(store, UpdateStore) and missing_methods(store) == []

    class Partial:
        def __init__(self, inner: SqliteUpdateStore) -> None:
            for name in ("record", "next_offset", "renew_many", "owns", "settle_many",
                         "retry_owned", "transaction"):
                setattr(self, name, getattr(inner, name))

    missing = missing_methods(Partial(store))
    assert "exchange" in missing and "clock" in missing and "record" not in missing


def test_an_update_that_is_not_json_is_named(store: SqliteUpdateStore) -> None:
    """An update whose payload cannot be stored as JSON raises InvalidUpdate naming it; nothing is stored."""
    store.record([message(1)], 2)
    with pytest.raises(InvalidUpdate, match=r"update #1 of the batch \(update_id=6\) cannot be stored as JSON"):
        store.record([message(5), {"update_id": 6, "tags": {"a", "b"}}], 7)
    assert store.next_offset() == 2
    assert store.stats()["pending"] == 1


def test_default_clock_follows_freezegun(tmp_path: Path) -> None:
    """A store built with the default clock sees freezegun's time, so users can freeze lease tests."""
    from freezegun import freeze_time

    with freeze_time("2026-01-01 00:00:00") as frozen:
        store = SqliteUpdateStore(tmp_path / "frozen.db")
        store.record([{"update_id": 1, "message": {"chat": {"id": 1}}}], 2)
        claim = claim_one(store, 30)
        assert claim is not None
        assert claim.lease_until == pytest.approx(1767225600 + 30)
        frozen.tick(29)
        assert store.owns(claim.identity)
        frozen.tick(2)
        assert not store.owns(claim.identity)
        store.close()


def test_connections_of_ended_threads_are_closed(tmp_path: Path) -> None:
    """Threads that used the store and ended do not leave their connections open for the process's life."""
    db = tmp_path / "threads.db"
    store = SqliteUpdateStore(db)

    def open_fds() -> int:
        fd_dir = "/proc/self/fd"
        count = 0
        for name in os.listdir(fd_dir):
            try:
                if os.readlink(os.path.join(fd_dir, name)) == str(db):
                    count += 1
            except OSError:
                continue
        return count

    for _ in range(10):
        thread = threading.Thread(target=store.next_offset)
        thread.start()
        thread.join()
    store.next_offset()  # this thread opens (or reuses) a connection; ended threads' ones are closed
    after = threading.Thread(target=store.next_offset)
    after.start()
    after.join()
    assert open_fds() <= 3
    store.close()
    assert open_fds() == 0
