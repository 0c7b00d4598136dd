"""``SqliteUpdateStore``: the update store in one SQLite file (WAL) through APSW.

Thread safety: one ``SqliteUpdateStore`` may be shared by every thread of a process; each thread
gets its own APSW connection, and write transactions of one process take an in-process lock
before ``BEGIN IMMEDIATE`` (threads then never fall into SQLite's sleeping busy handler). Several
processes may open the same file; between processes the busy timeout applies.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import apsw
import apsw.bestpractice

from ..errors import (
    ConfigurationError,
    InvalidUpdate,
    OwnershipLost,
    StoreCorrupt,
    StoreUnavailable,
)
from ..updates import chat_id_of
from . import Claim, Exhaustion, Identity, Step
from .schema import CLAIMED, EXHAUSTED, LATEST, PENDING, SETTLED, SKIPPED, migrate

__all__ = ["SqliteUpdateStore"]

log = logging.getLogger("telegram_fence.store")

Clock = Callable[[], float]
RecordHook = Callable[[apsw.Connection, Sequence[Mapping[str, Any]]], None]

_SYNC_LEVELS = {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}

# --- SQL -------------------------------------------------------------------------------------------

# A batch travels as ONE JSON text, [[chat_id, state, update], ...]: every statement below is a single
# step whatever the batch size. (APSW releases the GIL on each step; under several busy threads each
# release can cost a full switch interval, so per-row statements were the fence's bottleneck.) The
# stored payload is SQLite's minified rendering of the update, so payloads compare as text.
_EXISTING_IN_BATCH = """
SELECT json_group_array(json_array(u.update_id, u.payload = j.value -> '$[2]'))
FROM json_each(:batch) AS j JOIN fence_updates AS u ON u.update_id = j.value ->> '$[2].update_id'
"""
# Whether any id of the batch may already be stored: a range count on the primary key, so a fresh
# batch (the common case) skips the payload comparison below.
_ANY_IN_RANGE = "SELECT EXISTS (SELECT 1 FROM fence_updates WHERE update_id BETWEEN ? AND ?)"
# A row may be stored already claimed ([chat_id, 1, update, claim_id]): attempt 1, leased until :until.
_INSERT_BATCH = """
INSERT INTO fence_updates(update_id, payload, chat_id, state, attempt, claim_id, due_at, recorded_at, changed_at)
SELECT j.value ->> '$[2].update_id', j.value -> '$[2]', j.value ->> 0, j.value ->> 1,
       j.value ->> 1 = 1, j.value ->> 3, CASE WHEN j.value ->> 1 = 1 THEN :until ELSE 0 END, :now, :now
FROM json_each(:batch) AS j WHERE true
ON CONFLICT(update_id) DO NOTHING
"""
# The same, with the payloads taken from Telegram's getUpdates answer as it came ({"ok":true,"result":[...]})
# and the rest of each row from :meta, [[chat_id, state, claim_id or null], ...] in the same order.
_INSERT_BODY = """
INSERT INTO fence_updates(update_id, payload, chat_id, state, attempt, claim_id, due_at, recorded_at, changed_at)
SELECT u.value ->> 'update_id', u.value, u.m ->> 0, u.m ->> 1,
       u.m ->> 1 = 1, u.m ->> 2, CASE WHEN u.m ->> 1 = 1 THEN :until ELSE 0 END, :now, :now
FROM (SELECT j.value AS value, :meta -> j.key AS m FROM json_each(:body, '$.result') AS j) AS u WHERE true
ON CONFLICT(update_id) DO NOTHING
"""
# Which of the given chats have an open row (pending or claimed): their new updates wait behind it.
_OPEN_CHATS = """
SELECT json_group_array(j.value) FROM json_each(:chats) AS j
WHERE EXISTS (SELECT 1 FROM fence_updates WHERE state < 2 AND chat_id = j.value)
"""
_RAISE_CURSOR = (
    "INSERT INTO fence_meta(key, value) VALUES ('cursor', ?) "
    "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)"
)
_READ_CURSOR = "SELECT value FROM fence_meta WHERE key = 'cursor'"

# Open rows in update_id order that are due now. Live claims (state 1, lease in the future) are
# never due; an expired claim is. The chat check rejects chats with another live claim.
# One row: the first :scan candidates as [[update_id, chat_id, attempt, payload or null], ...].
# The payload rides along when the caller holds no copies of the updates (:with_payload = 1).
_CANDIDATES = """
SELECT json_group_array(json_array(update_id, chat_id, attempt,
                                   CASE WHEN :with_payload THEN json(payload) END)) FROM (
  SELECT update_id, chat_id, attempt, payload FROM fence_updates AS u
  WHERE state < 2 AND due_at <= :now
    AND (chat_id IS NULL OR NOT EXISTS (
          SELECT 1 FROM fence_updates AS c
          WHERE c.state = 1 AND c.chat_id = u.chat_id AND c.due_at > :now))
  ORDER BY update_id LIMIT :scan)
"""
# The same candidates as rows, for a single claim (no JSON round trip for one update).
_CANDIDATE_ROWS = """
SELECT update_id, chat_id, attempt, payload FROM fence_updates AS u
WHERE state < 2 AND due_at <= :now
  AND (chat_id IS NULL OR NOT EXISTS (
        SELECT 1 FROM fence_updates AS c
        WHERE c.state = 1 AND c.chat_id = u.chat_id AND c.due_at > :now))
ORDER BY update_id
"""
# Claim, in one statement, the next :run open due rows of each given chat that has no live claim,
# and the given chatless updates: one index probe per chat instead of a scan of the backlog, and
# no round trip through Python between choosing and claiming. Rows whose attempts are spent are
# left alone here (a full scan exhausts them).
_CLAIM_HEADS = """
UPDATE fence_updates SET state = 1, attempt = attempt + 1, claim_id = lower(hex(randomblob(12))),
  due_at = :until, changed_at = :now
WHERE update_id IN (
  SELECT update_id FROM (
    SELECT u.update_id FROM json_each(:chats) AS j JOIN fence_updates AS u ON u.update_id IN (
      SELECT o.update_id FROM fence_updates AS o
      WHERE o.state < 2 AND o.chat_id = j.value AND o.due_at <= :now ORDER BY o.update_id LIMIT :run)
    WHERE NOT EXISTS (SELECT 1 FROM fence_updates AS c
                      WHERE c.state = 1 AND c.chat_id = j.value AND c.due_at > :now)
    UNION ALL
    SELECT update_id FROM fence_updates
    WHERE update_id IN (SELECT value FROM json_each(:chatless)) AND chat_id IS NULL
      AND state < 2 AND due_at <= :now)
  ORDER BY update_id LIMIT :limit)
  AND attempt < :max_attempts
RETURNING update_id, chat_id, attempt, claim_id
"""
_TAKE_ONE = (
    "UPDATE fence_updates SET state = 1, attempt = attempt + 1, claim_id = :claim_id, due_at = :until, "
    "changed_at = :now WHERE update_id = :update_id"
)
# Claim the chosen rows, [[update_id, claim_id], ...], in one statement.
_TAKE = """
UPDATE fence_updates AS u SET state = 1, attempt = u.attempt + 1, claim_id = j.value ->> 1,
  due_at = :until, changed_at = :now
FROM json_each(:chosen) AS j WHERE u.update_id = j.value ->> 0
"""
_PAYLOADS = """
SELECT json_group_array(json_array(update_id, json(payload))) FROM fence_updates
WHERE update_id IN (SELECT value FROM json_each(:ids))
"""
# Attempts spent: a pending row keeps the error of its last failure; a lapsed claim gets :reason.
_EXHAUST_LAPSED = """
UPDATE fence_updates AS u SET state = 3, acknowledged = 0, changed_at = :now,
  error = CASE WHEN u.state = 0 AND u.error IS NOT NULL THEN u.error ELSE j.value ->> 1 END
FROM json_each(:lapsed) AS j WHERE u.update_id = j.value ->> 0
"""
_LIVE = "state = 1 AND due_at > ?"
_EXACT = "update_id = ? AND attempt = ? AND claim_id = ?"
_OWNS = f"SELECT 1 FROM fence_updates WHERE {_EXACT} AND {_LIVE}"
_RENEW_OWNED = f"UPDATE fence_updates SET due_at = max(due_at, ?) WHERE {_EXACT} AND {_LIVE}"
_RENEW_STEP = f"UPDATE fence_updates SET due_at = max(due_at, ?) WHERE update_id = ? AND attempt = ? AND {_LIVE}"
_SETTLE_OWNED = f"UPDATE fence_updates SET state = 2, changed_at = ? WHERE {_EXACT} AND {_LIVE}"
_SETTLE_STEP = f"UPDATE fence_updates SET state = 2, changed_at = ? WHERE update_id = ? AND attempt = ? AND {_LIVE}"
_RETRY_OWNED = (
    f"UPDATE fence_updates SET state = 0, due_at = ?, error = ?, changed_at = ? WHERE {_EXACT} AND {_LIVE}"
)
_EXHAUST_OWNED = (
    "UPDATE fence_updates SET state = 3, acknowledged = 0, error = ?, changed_at = ? "
    f"WHERE {_EXACT} AND {_LIVE}"
)
_DUE_EXHAUSTIONS = (
    "SELECT update_id, attempt, claim_id, payload, chat_id, error, changed_at FROM fence_updates "
    "WHERE state = 3 AND acknowledged = 0 AND update_id > ? ORDER BY update_id LIMIT ?"
)
_ACKNOWLEDGE = (
    f"UPDATE fence_updates SET acknowledged = 1, changed_at = ? WHERE {_EXACT} AND state = 3 AND acknowledged = 0"
)
_PRUNE = (
    "DELETE FROM fence_updates WHERE state >= 2 AND changed_at < ? "
    "AND (state IN (2, 4) OR (state = 3 AND acknowledged = 1))"
)
_RELEASE_LEASE = f"UPDATE fence_updates SET due_at = ?, changed_at = ? WHERE {_EXACT} AND {_LIVE}"
_UNCLAIM = (
    "UPDATE fence_updates SET state = 0, attempt = attempt - 1, due_at = ?, changed_at = ? "
    f"WHERE {_EXACT} AND {_LIVE}"
)
# Open rows minus those waiting for a later retry: two index-only counts (the second index holds
# only rows that were put back with a delay, so it stays small).
_BACKLOG = (
    "SELECT (SELECT count(*) FROM fence_updates WHERE state < 2) - "
    "(SELECT count(*) FROM fence_updates WHERE state = 0 AND due_at > 0 AND due_at > ?)"
)
_STATE_COUNTS = "SELECT state, acknowledged, count(*) FROM fence_updates GROUP BY state, acknowledged"
_OLDEST_OPEN = "SELECT min(recorded_at) FROM fence_updates WHERE state < 2"
_SETTLE_MANY = """
UPDATE fence_updates AS u SET state = 2, changed_at = :now FROM json_each(:ids) AS j
WHERE u.update_id = j.value ->> 0 AND u.attempt = j.value ->> 1 AND u.claim_id = j.value ->> 2
  AND u.state = 1 AND u.due_at > :now
"""
_RENEW_MANY = (
    "UPDATE fence_updates SET due_at = max(due_at, :until) "
    "WHERE state = 1 AND due_at > :now AND (update_id, attempt, claim_id) IN "
    "(SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(:ids)) RETURNING update_id"
)
_BEGIN_GENERATION = (
    "INSERT INTO fence_generations(generation, pid, started_at) "
    "VALUES ((SELECT coalesce(max(generation), 0) + 1 FROM fence_generations), ?, ?) RETURNING generation"
)
_PROGRESS = "UPDATE fence_generations SET progress_at = ? WHERE generation = ?"
_END_GENERATION = (
    "UPDATE fence_generations SET ended_at = ?, end_reason = ? WHERE generation = ? AND ended_at IS NULL"
)
_LATEST_GENERATION = (
    "SELECT generation, pid, started_at, progress_at, ended_at, end_reason FROM fence_generations "
    "ORDER BY generation DESC LIMIT 1"
)

_STATE_NAMES = {PENDING: "pending", CLAIMED: "claimed", SETTLED: "settled", SKIPPED: "skipped"}


def _encode(update: Mapping[str, Any]) -> str:
    return json.dumps(update, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _validate(updates: Sequence[Any]) -> list[int]:
    """Each update's id, or :class:`InvalidUpdate` naming the first malformed item."""
    if isinstance(updates, (str, bytes)) or not isinstance(updates, Sequence):
        raise InvalidUpdate(f"record() takes a sequence of update dicts, got {type(updates).__name__}")
    checked = []
    for index, update in enumerate(updates):
        if type(update) is dict:  # the common case, checked without the ABC
            update_id = update.get("update_id")
            if type(update_id) is int and update_id >= 0:
                checked.append(update_id)
                continue
        if not isinstance(update, Mapping):
            raise InvalidUpdate(
                f"update #{index} of the batch is a {type(update).__name__}, not a mapping; nothing was stored"
            )
        update_id = update.get("update_id")
        if not isinstance(update_id, int) or isinstance(update_id, bool) or update_id < 0:
            raise InvalidUpdate(
                f"update #{index} of the batch has update_id={update_id!r}; a non-negative integer is "
                "required; nothing was stored"
            )
        checked.append(update_id)
    return checked


# Updates decoded from JSON cannot hold a cycle; a caller's odd mapping that does is caught by the
# per-update retry below (which checks for cycles). Skipping the check saves a fifth of the encoding.
_BATCH_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False)


def _claim_ids(count: int) -> list[str]:
    """``count`` fresh claim ids (24 hex digits each), from one call to the random source."""
    tokens = secrets.token_hex(12 * count)
    return [tokens[i:i + 24] for i in range(0, len(tokens), 24)]


def _encode_batch(rows: list[list[Any]], updates: Sequence[Mapping[str, Any]]) -> str:
    """The batch as one JSON text; :class:`InvalidUpdate` naming the first update JSON cannot hold."""
    try:
        return _BATCH_ENCODER.encode(rows)
    except (TypeError, ValueError, RecursionError):
        for index, update in enumerate(updates):
            try:
                _encode(update)
            except (TypeError, ValueError, RecursionError) as exc:
                raise InvalidUpdate(
                    f"update #{index} of the batch (update_id={update.get('update_id')}) cannot be stored as "
                    f"JSON: {exc}; nothing was stored"
                ) from exc
        raise


def _switch_to_wal(conn: apsw.Connection, patience: float) -> str:
    """Put the file in WAL mode (nothing is written when it already is); return the journal mode.

    Two processes switching a new file at the same moment both hold a shared lock and want an
    exclusive one; SQLite breaks that deadlock by answering BUSY at once, without its busy handler.
    So the switch is retried, with backoff, for up to ``patience`` seconds: the lock belongs to
    another process, and there is nothing in this one to wait on but time.
    """
    mode = str(conn.pragma("journal_mode")).lower()
    if mode == "wal":
        return mode
    deadline = time.monotonic() + patience
    delay = 0.001
    while True:
        try:
            return str(conn.pragma("journal_mode", "wal")).lower()
        except apsw.BusyError:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _sync_level(name: str, option: str) -> int:
    level = _SYNC_LEVELS.get(str(name).upper())
    if level is None:
        raise ConfigurationError(f"{option}={name!r} is not a SQLite synchronous level; use 'FULL' or 'NORMAL'")
    return level


def _wall_clock() -> float:
    """``time.time()`` looked up at each call, so freezegun and monkeypatching reach the default clock."""
    return time.time()


class _Local(threading.local):
    conn: apsw.Connection | None = None
    sync: int = -1
    depth: int = 0


class SqliteUpdateStore:
    """The durable update store (all three capability levels) in one SQLite file.

    ``synchronous`` is the durability of the inbox write (``record``: updates + cursor) and of
    exhaustions; ``work_synchronous`` that of claims, renewals, settlements and fenced
    transactions. With WAL, ``NORMAL`` commits survive a process crash; only power loss can roll
    back the last of them, which returns the update to an earlier state (claimed or pending) and
    so reruns its handler; nothing is lost (see ``docs/guarantees.md``).

    May be shared between threads (each thread gets its own connection). Errors: a symlink, a
    non-database file or a newer schema raise at construction (:class:`StoreCorrupt`,
    :class:`SchemaError`); a lock held past ``busy_timeout`` raises :class:`StoreUnavailable`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = _wall_clock,
        synchronous: str = "FULL",
        work_synchronous: str = "NORMAL",
        busy_timeout: float = 5.0,
        schema_version: int = LATEST,
    ) -> None:
        self.path = os.fspath(path)
        self.clock = clock
        self._record_sync = _sync_level(synchronous, "synchronous")
        self._work_sync = _sync_level(work_synchronous, "work_synchronous")
        if busy_timeout < 0:
            raise ConfigurationError(f"busy_timeout={busy_timeout!r} must be >= 0 seconds")
        self._busy_ms = int(busy_timeout * 1000)
        self._local = _Local()
        self._lock = threading.RLock()
        self._conns: list[tuple[threading.Thread, apsw.Connection]] = []
        self._conns_lock = threading.Lock()
        self._closed = False
        self._prepare_file()
        conn = self._conn()
        try:
            migrate(conn, schema_version)
        except apsw.BusyError as exc:
            raise StoreUnavailable(
                f"{self.path} stayed locked for {busy_timeout:g} s while upgrading its schema; "
                "another process holds a write transaction"
            ) from exc

    # --- connections ----------------------------------------------------------------------------

    def _prepare_file(self) -> None:
        path = self.path
        if os.path.islink(path):
            raise StoreCorrupt(f"{path} is a symbolic link; pass the real path of the database file")
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise StoreUnavailable(f"directory {directory} does not exist; create it before opening {path}")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            mode = os.stat(path).st_mode
            if not stat.S_ISREG(mode):
                raise StoreCorrupt(f"{path} is not a regular file") from None
        except OSError as exc:
            raise StoreUnavailable(f"cannot create {path}: {exc.strerror}") from exc
        else:
            os.close(fd)

    def _open(self) -> apsw.Connection:
        if self._closed:
            raise StoreUnavailable(f"the store for {self.path} was closed")
        conn: apsw.Connection | None = None
        try:
            conn = apsw.Connection(self.path, flags=apsw.SQLITE_OPEN_READWRITE)
            conn.set_busy_timeout(self._busy_ms)
            apsw.bestpractice.connection_dqs(conn)
            mode = _switch_to_wal(conn, self._busy_ms / 1000)
        except apsw.Error as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, apsw.NotADBError):
                raise StoreCorrupt(f"{self.path} is not a SQLite database; refusing to touch it") from exc
            if isinstance(exc, apsw.CorruptError):
                raise StoreCorrupt(f"{self.path} is damaged: {exc}") from exc
            if isinstance(exc, apsw.BusyError):
                raise StoreUnavailable(f"{self.path} stayed locked while switching it to WAL") from exc
            if isinstance(exc, apsw.CantOpenError):
                raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
            raise
        if mode != "wal":
            raise StoreUnavailable(f"{self.path} could not be put in WAL mode (journal_mode is {mode})")
        with self._conns_lock:
            # A thread that ended can no longer use its connection: close those here, so a long-running
            # process that replaces worker threads does not collect open connections.
            alive = []
            for thread, old in self._conns:
                if thread.is_alive():
                    alive.append((thread, old))
                else:
                    old.close()
            alive.append((threading.current_thread(), conn))
            self._conns = alive
        return conn

    def _conn(self) -> apsw.Connection:
        local = self._local
        conn = local.conn
        if conn is None:
            conn = local.conn = self._open()
            local.sync = -1
        return conn

    def close(self) -> None:
        """Close every connection of this store. Later calls raise :class:`StoreUnavailable`.

        Call it after every thread that used the store has stopped.
        """
        self._closed = True
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for _thread, conn in conns:
            try:
                conn.close()
            except apsw.Error:  # pragma: no cover - closing is best effort
                log.warning("closing a store connection failed", exc_info=True)
        self._local = _Local()

    def __enter__(self) -> SqliteUpdateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _read(self) -> Iterator[apsw.Connection]:
        """This thread's connection for reads outside a transaction, with SQLite's lock errors translated."""
        try:
            yield self._conn()
        except apsw.BusyError as exc:
            raise StoreUnavailable(f"{self.path} stayed locked for {self._busy_ms / 1000:g} s") from exc

    # --- transactions ---------------------------------------------------------------------------

    @contextmanager
    def _write(self, sync: int) -> Iterator[apsw.Connection]:
        """An IMMEDIATE transaction on this thread's connection (a savepoint when nested)."""
        conn = self._conn()
        local = self._local
        if local.depth:
            if sync > local.sync:  # SQLite cannot raise the level of a transaction already open
                raise ConfigurationError(
                    "record() inside write() would commit the inbox below its synchronous level; "
                    "open the block with write(durable=True)"
                )
            with conn:  # APSW turns a nested block into a savepoint
                local.depth += 1
                try:
                    yield conn
                finally:
                    local.depth -= 1
            return
        with self._lock:
            if local.sync != sync:
                conn.pragma("synchronous", sync)
                local.sync = sync
            try:
                conn.execute("BEGIN IMMEDIATE")
            except apsw.BusyError as exc:
                raise StoreUnavailable(
                    f"{self.path} stayed locked for {self._busy_ms / 1000:g} s by another process"
                ) from exc
            local.depth = 1
            try:
                yield conn
            except BaseException:
                if not conn.in_transaction:
                    raise
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")
            finally:
                local.depth = 0

    #: Store calls made inside :meth:`write` on the same thread join its transaction (as savepoints).
    nests_writes = True

    def write(self, *, durable: bool = False) -> Any:
        """A write transaction (``BEGIN IMMEDIATE``) for the application's own tables in this file.

        Yields the APSW connection; commits when the block ends, rolls back when it raises. Store
        calls made inside the block on this thread join it (each as a savepoint, so one that raises
        undoes only its own writes). ``durable=True`` commits at the inbox's ``synchronous`` level,
        which a ``record()`` inside the block needs (without it, that call raises
        :class:`ConfigurationError` and nothing of it is written).
        """
        return self._write(self._record_sync if durable else self._work_sync)

    # --- base level -----------------------------------------------------------------------------

    def record(
        self,
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        *,
        skip: Collection[int] = (),
        generation: int | None = None,
        on_record: RecordHook | None = None,
        body: bytes | str | None = None,
    ) -> int:
        """Store a batch of raw updates and raise the cursor to ``next_offset``, in one transaction.

        Returns how many updates were new. An ``update_id`` already stored is left as it is; when
        its payload differs, the first is kept and a warning is logged. Ids in ``skip`` are stored
        as skipped (no handler will run). ``on_record(conn, new_updates)`` runs inside the same
        transaction (the capture outbox uses it); if it raises, nothing is stored. ``generation``
        marks that poller generation's progress. The cursor never moves backwards. ``body`` is the
        ``getUpdates`` answer ``updates`` were decoded from, byte for byte (``{"ok":true,"result":[...]}``),
        when the caller has it: the payloads are then taken from it instead of being encoded again.
        It must hold exactly ``updates``, in order.

        Raises :class:`InvalidUpdate` (nothing stored, cursor unchanged) for a malformed item.
        """
        return self._record(updates, next_offset, skip, generation, on_record, None, body)[0]

    #: :meth:`record` and :meth:`record_and_claim` take ``body=`` (the poller checks before passing it).
    accepts_body = True

    def record_and_claim(
        self,
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        *,
        lease: float,
        limit: int,
        run: int = 1,
        skip: Collection[int] = (),
        generation: int | None = None,
        on_record: RecordHook | None = None,
        body: bytes | str | None = None,
    ) -> tuple[int, list[Claim]]:
        """:meth:`record`, and claim some of the new updates as they are stored, in the same transaction.

        Returns ``(how many were new, the claims)``. A new update is claimed (attempt 1, leased for
        ``lease`` seconds) when its ordering line is free: a chat with no open row in the file yields
        its first ``run`` new updates (claimed together, for a caller that runs them one after
        another in ``update_id`` order); an update without a chat is its own line. At most ``limit``
        are claimed, in ``update_id`` order; everything else is stored pending, exactly as
        :meth:`record` stores it. Raises what :meth:`record` raises, and :class:`ConfigurationError`
        for a ``lease`` or ``limit`` out of range; nothing is stored then.
        """
        if lease <= 0:
            raise ConfigurationError(f"lease={lease!r} must be a positive number of seconds")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"limit={limit!r} must be a non-negative integer")
        return self._record(updates, next_offset, skip, generation, on_record, (lease, limit, max(1, run)), body)

    def _record(
        self,
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        skip: Collection[int],
        generation: int | None,
        on_record: RecordHook | None,
        claim: tuple[float, int, int] | None,
        body: bytes | str | None,
    ) -> tuple[int, list[Claim]]:
        ids = _validate(updates)
        if not isinstance(next_offset, int) or isinstance(next_offset, bool) or next_offset < 0:
            raise InvalidUpdate(f"next_offset={next_offset!r} must be a non-negative integer; nothing was stored")
        now = self.clock()
        skip = set(skip)
        chats = [chat_id_of(u) for u in updates]
        states = [SKIPPED if i in skip else PENDING for i in ids]
        new: list[Mapping[str, Any]] = []
        claims: list[Claim] = []
        until = 0.0
        with self._write(self._record_sync) as conn:
            if updates:
                rows: list[list[Any]] = [
                    [chat, state, update] for chat, state, update in zip(chats, states, updates, strict=True)
                ]
                existing = self._existing(conn, ids, rows, updates)
                fresh: list[int] = []  # positions of the updates this call stores
                seen: set[int] = set()
                for index, update_id in enumerate(ids):
                    if update_id not in existing and update_id not in seen:
                        seen.add(update_id)
                        fresh.append(index)
                if claim is not None and claim[1] > 0:
                    until = now + claim[0]
                    claims = self._claim_fresh(conn, rows, fresh, ids, until, claim[1], claim[2])
                if not (body is not None and not existing and self._insert_body(conn, body, rows, now, until)):
                    conn.execute(_INSERT_BATCH, {"batch": _encode_batch(rows, updates), "now": now, "until": until})
                new = [updates[index] for index in fresh]
            if on_record is not None:
                on_record(conn, new)
            conn.execute(_RAISE_CURSOR, (next_offset,))
            if generation is not None:
                conn.execute(_PROGRESS, (now, generation))
        return len(new), claims

    @staticmethod
    def _insert_body(conn: apsw.Connection, body: bytes | str, rows: list[list[Any]], now: float, until: float) -> bool:
        """Insert the batch taking the payloads from Telegram's answer; ``False`` (nothing stored) when
        SQLite cannot read it, for the caller to encode the updates instead."""
        meta = json.dumps([[row[0], row[1], row[3] if len(row) > 3 else None] for row in rows])
        try:
            text = body.decode("utf-8") if isinstance(body, bytes) else body
            conn.execute(_INSERT_BODY, {"body": text, "meta": meta, "now": now, "until": until})
        except (apsw.SQLError, UnicodeDecodeError):  # not UTF-8, or malformed for SQLite: nothing was inserted
            log.debug("getUpdates answer not readable by SQLite; encoding the updates", exc_info=True)
            return False
        return True

    @staticmethod
    def _existing(
        conn: apsw.Connection, ids: list[int], rows: list[list[Any]], updates: Sequence[Mapping[str, Any]]
    ) -> set[int]:
        """The batch's ids that are already stored (warning about those stored with another payload)."""
        (maybe,) = conn.execute(_ANY_IN_RANGE, (min(ids), max(ids))).fetchone()
        if not maybe:  # the common case: a fresh batch, no payload comparison
            return set()
        (found,) = conn.execute(_EXISTING_IN_BATCH, {"batch": _encode_batch(rows, updates)}).fetchone()
        existing = set()
        for update_id, same in json.loads(found):
            existing.add(update_id)
            if not same:
                log.warning(
                    "update recorded again with a different payload; the first is kept",
                    extra={"update_id": update_id},
                )
        return existing

    @staticmethod
    def _claim_fresh(
        conn: apsw.Connection, rows: list[list[Any]], fresh: list[int], ids: list[int], until: float, limit: int,
        run: int,
    ) -> list[Claim]:
        """Mark the ``rows`` (``[chat_id, state, update]``) to be stored claimed and return their claims.

        A chat qualifies when no row of it is open in the file; it then yields its first ``run``
        new updates, and none after the first it cannot take (order within a chat is kept).
        """
        wanted = {rows[index][0] for index in fresh if rows[index][1] == PENDING} - {None}
        blocked: set[Any] = set()
        if wanted:
            (found,) = conn.execute(_OPEN_CHATS, {"chats": json.dumps(list(wanted))}).fetchone()
            blocked.update(json.loads(found))
        taken: dict[Any, int] = {}
        chosen: list[int] = []
        for index in fresh:
            chat_id, state, _update = rows[index]
            if state != PENDING:
                continue
            if chat_id is None:
                if len(chosen) < limit:
                    chosen.append(index)
                continue
            if chat_id in blocked:
                continue
            count = taken.get(chat_id, 0)
            if count >= run or len(chosen) >= limit:
                blocked.add(chat_id)  # a later update of this chat must not overtake this one
                continue
            taken[chat_id] = count + 1
            chosen.append(index)
        if not chosen:
            return []
        claims = []
        for index, claim_id in zip(chosen, _claim_ids(len(chosen)), strict=True):
            row = rows[index]
            row[1] = CLAIMED
            row.append(claim_id)
            claims.append(Claim(Identity(ids[index], 1, claim_id), row[2], row[0], until))
        return claims

    def next_offset(self) -> int:
        """The stored cursor (0 when nothing was recorded); the same after reopening the file."""
        with self._read() as conn:
            row = conn.execute(_READ_CURSOR).fetchone()
        return int(row[0]) if row else 0

    def claim(self, lease: float) -> Claim | None:
        """Base-level claim: as :meth:`claim_owned` without ``max_attempts``."""
        return self.claim_owned(lease)

    def renew(self, step: Step, lease: float) -> bool:
        """Extend the live claim of ``step`` (matched on update and attempt only); never shortens it."""
        now = self.clock()
        with self._write(self._work_sync) as conn:
            conn.execute(_RENEW_STEP, (now + lease, step.update_id, step.attempt, now))
            return conn.changes() == 1

    def settle(self, step: Step) -> bool:
        """Mark the live claim of ``step`` handled (matched on update and attempt only)."""
        now = self.clock()
        with self._write(self._work_sync) as conn:
            conn.execute(_SETTLE_STEP, (now, step.update_id, step.attempt, now))
            return conn.changes() == 1

    def prune(self, settled_before: float) -> int:
        """Delete settled and skipped rows, and acknowledged exhaustions, last changed before ``settled_before``.

        Never deletes a pending, claimed or unacknowledged row. Returns the number deleted.
        """
        with self._write(self._work_sync) as conn:
            conn.execute(_PRUNE, (settled_before,))
            return conn.changes()

    # --- fenced level ---------------------------------------------------------------------------

    def claim_owned(self, lease: float, *, max_attempts: int | None = None) -> Claim | None:
        """Claim the oldest due update whose chat has no live claim; ``None`` when there is none.

        The claim gets a fresh random ``claim_id`` and ``attempt + 1``; an expired lease is
        reclaimable. An update whose attempts are spent (``attempt >= max_attempts``) is not
        claimed: it becomes an unacknowledged exhaustion inside this same transaction.
        """
        claims = self.claim_many(lease, 1, max_attempts=max_attempts)
        return claims[0] if claims else None

    def claim_many(
        self,
        lease: float,
        limit: int,
        *,
        max_attempts: int | None = None,
        exclude_chats: Collection[int] = (),
        known: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> list[Claim]:
        """Claim up to ``limit`` due updates in one transaction, at most one per chat.

        Same rules as :meth:`claim_owned`; chats in ``exclude_chats`` are passed over (the caller
        already has one of theirs in hand). ``known`` maps update ids to update dicts the caller
        already holds (the poller's fresh batch): their payloads are not read back and decoded.
        """
        if limit < 1:
            raise ConfigurationError(f"limit={limit!r} must be at least 1")
        with self._write(self._work_sync) as conn:
            return self._claim_in(conn, lease, limit, max_attempts, exclude_chats, known)[0]

    def exchange(
        self,
        settle: Iterable[Identity],
        lease: float,
        limit: int,
        *,
        max_attempts: int | None = None,
        known: Mapping[int, Mapping[str, Any]] | None = None,
        chats: Collection[int] | None = None,
        chatless: Collection[int] = (),
        run: int = 1,
    ) -> tuple[int, list[Claim], bool]:
        """Settle ``settle`` and claim up to ``limit`` due updates in ONE transaction.

        Returns ``(how many were still live and got settled, the new claims, more)``; ``more`` is
        ``False`` when everything claimable was claimed (nothing was left out for ``limit``). The
        fence's dispatcher uses it: one commit per round however many updates finished and start.
        ``limit`` may be 0 (settle only). With ``chats`` (and ``chatless`` update ids) only the next
        update of those chats (and those updates) are candidates: the same rules, without a scan
        of the backlog, for a caller that knows which chats were freed or received work. With
        ``chats`` and ``run`` > 1 a chat yields up to ``run`` consecutive due updates at once, for a
        caller that runs them one after another in ``update_id`` order (never side by side).
        """
        keys = [list(_key(identity)) for identity in settle]
        with self._write(self._work_sync) as conn:
            settled = 0
            if keys:
                now = self.clock()
                conn.execute(_SETTLE_MANY, {"now": now, "ids": json.dumps(keys)})
                settled = conn.changes()
            claims, more = [], False
            if limit > 0:
                claims, more = self._claim_in(conn, lease, limit, max_attempts, (), known, chats, chatless, run)
        return settled, claims, more

    def _claim_in(
        self,
        conn: apsw.Connection,
        lease: float,
        limit: int,
        max_attempts: int | None,
        exclude_chats: Collection[int],
        known: Mapping[int, Mapping[str, Any]] | None,
        chats: Collection[int] | None = None,
        chatless: Collection[int] = (),
        run: int = 1,
    ) -> tuple[list[Claim], bool]:
        """The claims, and whether more may be claimable (``limit`` or the scan window cut them off)."""
        if lease <= 0:
            raise ConfigurationError(f"lease={lease!r} must be a positive number of seconds")
        if max_attempts is not None and max_attempts < 1:
            raise ConfigurationError(f"max_attempts={max_attempts!r} must be at least 1")
        now = self.clock()
        until = now + lease
        if chats is None and limit == 1:
            claims = self._claim_one(conn, now, until, max_attempts, exclude_chats, known)
            return claims, bool(claims)
        if chats is not None:
            return self._claim_heads(conn, now, until, limit, max_attempts, known, chats, chatless, run)
        with_payload = not known
        scan = limit * 2 + 8
        (found,) = conn.execute(_CANDIDATES, {"now": now, "scan": scan, "with_payload": with_payload}).fetchone()
        candidates = json.loads(found)
        picked: list[tuple[int, int | None, int, Any]] = []  # (update_id, chat_id, attempt, payload or None)
        lapsed: list[list[Any]] = []
        taken_chats = set(exclude_chats)
        for update_id, chat_id, attempt, payload in candidates:
            if chat_id is not None and chat_id in taken_chats:
                continue
            if max_attempts is not None and attempt >= max_attempts:
                lapsed.append([update_id, _lapsed(attempt, max_attempts)])
                continue
            picked.append((update_id, chat_id, attempt + 1, payload))
            if chat_id is not None:
                taken_chats.add(chat_id)
            if len(picked) >= limit:
                break
        self._exhaust_lapsed(conn, now, lapsed)
        # Cut off: by the limit, by the scan window, or past spent rows (a chat's next row may be due).
        more = len(picked) >= limit or len(candidates) >= scan or bool(lapsed)
        if not picked:
            return [], more
        claim_ids = _claim_ids(len(picked))
        conn.execute(_TAKE, {
            "chosen": json.dumps([[p[0], claim_id] for p, claim_id in zip(picked, claim_ids, strict=True)]),
            "until": until, "now": now,
        })
        payloads = self._payloads(conn, [(p[0], p[3]) for p in picked], known)
        return [
            Claim(Identity(update_id, attempt, claim_id), payloads[update_id], chat_id, until)
            for (update_id, chat_id, attempt, _payload), claim_id in zip(picked, claim_ids, strict=True)
        ], more

    def _claim_heads(
        self,
        conn: apsw.Connection,
        now: float,
        until: float,
        limit: int,
        max_attempts: int | None,
        known: Mapping[int, Mapping[str, Any]] | None,
        chats: Collection[int],
        chatless: Collection[int],
        run: int,
    ) -> tuple[list[Claim], bool]:
        """:meth:`_claim_in` limited to ``chats`` (up to ``run`` rows each) and ``chatless`` updates."""
        if not chats and not chatless:
            return [], False
        rows = sorted(conn.execute(_CLAIM_HEADS, {
            "now": now, "until": until, "limit": limit, "run": max(1, run),
            "max_attempts": max_attempts if max_attempts is not None else 2**62,
            "chats": json.dumps(list(chats)), "chatless": json.dumps(list(chatless)),
        }))
        payloads = self._payloads(conn, [(row[0], None) for row in rows], known)
        claims = [
            Claim(Identity(update_id, attempt, claim_id), payloads[update_id], chat_id, until)
            for update_id, chat_id, attempt, claim_id in rows
        ]
        return claims, len(claims) >= limit

    @staticmethod
    def _payloads(
        conn: apsw.Connection, wanted: list[tuple[int, Any]], known: Mapping[int, Mapping[str, Any]] | None
    ) -> dict[int, Any]:
        """Each wanted update's dict: the one carried along, the caller's copy, or decoded from the file."""
        payloads: dict[int, Any] = {}
        missing = []
        for update_id, payload in wanted:
            if payload is None and known is not None:
                payload = known.get(update_id)
            if payload is None:
                missing.append(update_id)
            else:
                payloads[update_id] = payload
        if missing:
            (rows,) = conn.execute(_PAYLOADS, {"ids": json.dumps(missing)}).fetchone()
            payloads.update((update_id, payload) for update_id, payload in json.loads(rows))
        return payloads

    def _claim_one(
        self,
        conn: apsw.Connection,
        now: float,
        until: float,
        max_attempts: int | None,
        exclude_chats: Collection[int],
        known: Mapping[int, Mapping[str, Any]] | None,
    ) -> list[Claim]:
        """:meth:`_claim_in` for a single update: plain rows, read lazily until one is claimable."""
        lapsed: list[list[Any]] = []
        found = None
        cursor = conn.execute(_CANDIDATE_ROWS, {"now": now})
        try:
            for update_id, chat_id, attempt, payload in cursor:
                if chat_id is not None and chat_id in exclude_chats:
                    continue
                if max_attempts is not None and attempt >= max_attempts:
                    lapsed.append([update_id, _lapsed(attempt, max_attempts)])
                    continue
                found = (update_id, chat_id, attempt + 1, payload)
                break
        finally:
            cursor.close()
        self._exhaust_lapsed(conn, now, lapsed)
        if found is None:
            return []
        update_id, chat_id, attempt, payload = found
        (claim_id,) = _claim_ids(1)
        conn.execute(_TAKE_ONE, {"claim_id": claim_id, "until": until, "now": now, "update_id": update_id})
        update = known.get(update_id) if known is not None else None
        if update is None:
            update = json.loads(payload)
        return [Claim(Identity(update_id, attempt, claim_id), update, chat_id, until)]

    @staticmethod
    def _exhaust_lapsed(conn: apsw.Connection, now: float, lapsed: list[list[Any]]) -> None:
        """Turn updates whose attempts are spent ([[update_id, reason], ...]) into exhaustions."""
        if not lapsed:
            return
        conn.execute(_EXHAUST_LAPSED, {"now": now, "lapsed": json.dumps(lapsed)})
        for update_id, _reason in lapsed:
            log.error("update exhausted: attempts spent", extra={"update_id": update_id})

    def renew_owned(self, identity: Identity, lease: float) -> bool:
        """Extend exactly this live claim to at least now + ``lease``; never shortens it."""
        now = self.clock()
        with self._write(self._work_sync) as conn:
            conn.execute(_RENEW_OWNED, (now + lease, *_key(identity), now))
            return conn.changes() == 1

    def renew_many(self, identities: Iterable[Identity], lease: float) -> set[Identity]:
        """Renew several claims in one transaction; return the identities that were still live."""
        wanted = {_key(identity): identity for identity in identities}
        if not wanted:
            return set()
        now = self.clock()
        ids = json.dumps([list(key) for key in wanted])
        with self._write(self._work_sync) as conn:
            renewed = {row[0] for row in conn.execute(_RENEW_MANY, {"until": now + lease, "now": now, "ids": ids})}
        return {identity for key, identity in wanted.items() if key[0] in renewed}

    def owns(self, identity: Identity, at: float | None = None) -> bool:
        """``True`` only for exactly this claim, unexpired at ``at`` (default: now)."""
        when = self.clock() if at is None else at
        with self._write(self._work_sync) as conn:
            return conn.execute(_OWNS, (*_key(identity), when)).fetchone() is not None

    def settle_owned(self, identity: Identity) -> bool:
        """Mark exactly this live claim handled; ``False`` (nothing changed) when it is not live."""
        now = self.clock()
        with self._write(self._work_sync) as conn:
            conn.execute(_SETTLE_OWNED, (now, *_key(identity), now))
            return conn.changes() == 1

    def settle_many(self, identities: Iterable[Identity]) -> int:
        """Settle several live claims in one transaction; return how many were still live."""
        keys = [list(_key(identity)) for identity in identities]
        if not keys:
            return 0
        now = self.clock()
        with self._write(self._work_sync) as conn:
            conn.execute(_SETTLE_MANY, {"now": now, "ids": json.dumps(keys)})
            return conn.changes()

    def retry_owned(self, identity: Identity, at: float, error: str) -> bool:
        """Put exactly this live claim back to pending, due at ``at``, keeping ``error``."""
        now = self.clock()
        with self._write(self._work_sync) as conn:
            conn.execute(_RETRY_OWNED, (at, str(error), now, *_key(identity), now))
            return conn.changes() == 1

    @contextmanager
    def transaction(self, identity: Identity, complete: bool = False) -> Iterator[apsw.Connection]:
        """A write transaction that commits only while ``identity`` owns its update.

        ``BEGIN IMMEDIATE``; the ownership check runs inside it; the block's writes go through the
        yielded connection. When ownership is gone the transaction is rolled back and
        :class:`OwnershipLost` is raised before the block runs. With ``complete=True`` the update
        is settled in the same transaction: the block's writes and "this update is done" commit
        together or not at all. An exception from the block rolls everything back and propagates.
        """
        with self._write(self._work_sync) as conn:
            now = self.clock()
            if conn.execute(_OWNS, (*_key(identity), now)).fetchone() is None:
                raise OwnershipLost(identity, "expired, reclaimed, settled or pruned")
            yield conn
            if complete:
                conn.execute(_SETTLE_OWNED, (now, *_key(identity), now))

    # --- durable level --------------------------------------------------------------------------

    def exhaust(self, identity: Identity, error: str) -> bool:
        """Turn exactly this live claim into an unacknowledged exhaustion holding ``error``."""
        now = self.clock()
        with self._write(self._record_sync) as conn:
            conn.execute(_EXHAUST_OWNED, (str(error), now, *_key(identity), now))
            return conn.changes() == 1

    def due_exhaustions(self, after: Identity | None = None, limit: int = 100) -> list[Exhaustion]:
        """Unacknowledged exhaustions in ``update_id`` order, strictly after ``after`` (a page cursor)."""
        if limit < 1:
            raise ConfigurationError(f"limit={limit!r} must be at least 1")
        start = -1 if after is None else after.update_id
        with self._read() as conn:
            rows = conn.execute(_DUE_EXHAUSTIONS, (start, limit)).fetchall()
        return [
            Exhaustion(Identity(u, a, c or ""), json.loads(p), chat, err or "", when)
            for u, a, c, p, chat, err, when in rows
        ]

    def acknowledge_exhaustion(self, identity: Identity) -> bool:
        """Make the exhaustion with exactly this identity prunable; ``False`` when there is none."""
        now = self.clock()
        with self._write(self._record_sync) as conn:
            conn.execute(_ACKNOWLEDGE, (now, *_key(identity)))
            return conn.changes() == 1

    # --- runtime support ------------------------------------------------------------------------

    def release(self, identity: Identity, *, attempt_counts: bool = True) -> bool:
        """End exactly this live claim now so any worker may claim the update at once.

        With ``attempt_counts=True`` (a handler ran and hung or timed out) the row stays claimed
        with an expired lease, so the attempt counts towards ``max_attempts`` and its writes are
        refused from now on. With ``False`` (claimed but never started, e.g. at shutdown) the row
        goes back to pending and the attempt is given back. ``False`` when the claim is not live.
        """
        now = self.clock()
        sql = _RELEASE_LEASE if attempt_counts else _UNCLAIM
        with self._write(self._work_sync) as conn:
            conn.execute(sql, (now, now, *_key(identity), now))
            return conn.changes() == 1

    def backlog(self) -> int:
        """How many updates are claimed now or due now: the work in front of the workers.

        Updates waiting for a retry later are not counted. The poller uses it for backpressure.
        """
        with self._read() as conn:
            return int(conn.execute(_BACKLOG, (self.clock(),)).fetchone()[0])

    def begin_generation(self, pid: int | None = None) -> int:
        """Start a new poller generation and return its number (1, 2, …; never reused)."""
        with self._write(self._record_sync) as conn:
            return int(conn.execute(_BEGIN_GENERATION, (pid or os.getpid(), self.clock())).fetchone()[0])

    def mark_progress(self, generation: int) -> None:
        """Record that ``generation``'s poller completed a ``getUpdates`` call now."""
        with self._write(self._work_sync) as conn:
            conn.execute(_PROGRESS, (self.clock(), generation))

    def end_generation(self, generation: int, reason: str) -> None:
        """Record why ``generation``'s poller ended (once; later calls keep the first reason)."""
        with self._write(self._record_sync) as conn:
            conn.execute(_END_GENERATION, (self.clock(), reason, generation))

    def stats(self) -> dict[str, Any]:
        """Counts by state, the cursor, the oldest open update's age, and the latest poller generation."""
        counts = {"pending": 0, "claimed": 0, "settled": 0, "skipped": 0, "exhausted": 0, "acknowledged": 0}
        with self._read() as conn:
            rows = conn.execute(_STATE_COUNTS).fetchall()
            oldest = conn.execute(_OLDEST_OPEN).fetchone()[0]
            generation = conn.execute(_LATEST_GENERATION).fetchone()
            version = int(conn.pragma("user_version"))
        for state, acknowledged, count in rows:
            if state == EXHAUSTED:
                counts["acknowledged" if acknowledged else "exhausted"] += count
            else:
                name = _STATE_NAMES.get(state, f"state{state}")
                counts[name] = counts.get(name, 0) + count
        now = self.clock()
        gen_info = None
        if generation is not None:
            number, pid, started, progress, ended, reason = generation
            gen_info = {
                "generation": number,
                "pid": pid,
                "started_at": started,
                "progress_at": progress,
                "ended_at": ended,
                "end_reason": reason,
            }
        return {
            **counts,
            "cursor": self.next_offset(),
            "oldest_open_age": None if oldest is None else max(0.0, now - oldest),
            "generation": gen_info,
            "schema_version": version,
        }


def _lapsed(attempt: int, max_attempts: int) -> str:
    """The error kept for an update whose last attempt lost its lease."""
    return f"attempt {attempt} of {max_attempts} lost its lease (the worker died or hung)"


def _key(identity: Identity) -> tuple[int, int, str]:
    if not isinstance(identity, Identity):
        raise TypeError(f"expected an Identity(update_id, attempt, claim_id), got {type(identity).__name__}")
    return identity.update_id, identity.attempt, identity.claim_id

