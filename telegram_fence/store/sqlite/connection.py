"""The SQLite store's connections and transactions: a small pool of APSW connections, WAL, busy timeout,
synchronous levels, temporary data in memory, and the ``_read``/``_write``/``write`` contexts every other part
of the store uses.

Thread safety: a thread borrows a connection for its outermost read or transaction and gives it back after;
write transactions of one process take an in-process lock before ``BEGIN IMMEDIATE`` (so no thread sleeps in
SQLite's busy handler). Between processes the busy timeout applies.

Who has the file open: every open store holds a shared ``flock`` on the sidecar ``PATH-owners`` until it closes
(or its process dies). A store that gets it exclusively as it opens knows that no other store has the file open:
every live claim in the file belongs to a process that is gone, and it releases them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import apsw

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: a store is never alone, the leases stay the bound
    fcntl = None  # type: ignore[assignment]

from ...errors import ConfigurationError, StoreCorrupt, StoreError, StoreUnavailable
from ..deadline import PerThread, ThreadBound
from ..owners import TAG_SEPARATOR, owner_is_alive
from ..schema import LATEST, migrate
from ..values import corrupt_message
from . import sql

__all__ = ["Clock", "StoreBase", "first", "one", "sync_level", "translate"]

log = logging.getLogger("telegram_fence.store.sqlite.connection")

Clock = Callable[[], float]

_SYNC_LEVELS = {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}

#: Connections kept open between uses; more are opened while more threads read at once, and closed after.
IDLE_CONNECTIONS = 4

_BUSY_SNAPSHOT = 517  # SQLITE_BUSY_SNAPSHOT: SQLite answers it at once, without the busy handler


def locked_message(path: str, exc: apsw.BusyError, waited: float, busy_timeout: float, doing: str) -> str:
    """What a user can act on when ``doing`` (e.g. "start a write transaction") failed with ``exc``: how long it
    waited and why (a stale snapshot of this connection, or another connection's lock)."""
    if getattr(exc, "extendedresult", None) == _BUSY_SNAPSHOT:
        return (
            f"{path}: could not {doing} (SQLite answered busy after {waited:.3f} s, without waiting): this "
            "thread's connection still reads an old snapshot of the file, because a statement of an earlier "
            "transaction on this thread was left open; exhaust or close every cursor (fetchall(), or "
            "cursor.close() after fetchone()) before its write() block ends"
        )
    return (
        f"{path}: could not {doing}: the file stayed locked for {waited:.3f} s (busy_timeout="
        f"{busy_timeout:g}) by another connection to it (another process, or another store object "
        "on the same file in this process) holding a write transaction"
    )


def translate(exc: BaseException, path: str) -> StoreError:
    """The store's error for a foreign failure ``exc`` of a statement on the file ``path``: :class:`StoreCorrupt`
    for a damaged file, :class:`StoreUnavailable` for locks, a full disk, I/O or a closed connection,
    :class:`StoreError` for anything else."""
    if isinstance(exc, (apsw.CorruptError, apsw.NotADBError)):
        return StoreCorrupt(corrupt_message(f"the database file {path}", exc))
    if isinstance(exc, (apsw.BusyError, apsw.LockedError)):
        return StoreUnavailable(f"{path} stayed locked: {exc}")
    if isinstance(exc, apsw.FullError):
        return StoreUnavailable(f"{path}: the disk is full ({exc}); free some space, nothing was written")
    if isinstance(exc, (apsw.IOError, apsw.CantOpenError, apsw.ReadOnlyError, apsw.PermissionsError,
                        apsw.ConnectionClosedError, apsw.CursorClosedError, apsw.InterruptError)):
        return StoreUnavailable(f"{path} cannot be used now: {exc}")
    if isinstance(exc, UnicodeError):
        return StoreError(f"{path}: a value could not be stored as UTF-8 ({exc}); nothing was written")
    return StoreError(f"{path}: SQLite refused a statement of the store: {exc}")


def _holders_lock(path: str) -> int | None:
    """The open sidecar ``PATH-owners`` (made when missing); ``None`` where it cannot be had (never alone then)."""
    if fcntl is None:
        return None
    try:
        return os.open(path + "-owners", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        return None


def _alone(fd: int) -> bool:
    """Try to hold the sidecar exclusively, without waiting: whether no other store has the file open."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _switch_to_wal(conn: apsw.Connection, patience: float) -> str:
    """Put the file in WAL mode; return the journal mode. Retried with backoff for up to ``patience`` seconds: two
    processes switching a new file at once get BUSY without SQLite's busy handler."""
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


def sync_level(name: str, option: str) -> int:
    """The SQLite number of the synchronous level ``name``; :class:`ConfigurationError` for an unknown name."""
    level = _SYNC_LEVELS.get(str(name).upper())
    if level is None:
        raise ConfigurationError(f"{option}={name!r} is not a SQLite synchronous level; use 'FULL' or 'NORMAL'")
    return level


def _wall_clock() -> float:
    """``time.time()`` looked up at each call (so monkeypatching reaches it)."""
    return time.time()


def first(cursor: apsw.Cursor) -> tuple[Any, ...] | None:
    """The first row of ``cursor`` (``None`` when it yields none), with the cursor closed: a statement left open
    keeps its read snapshot, and the thread's next ``BEGIN IMMEDIATE`` fails with ``SQLITE_BUSY_SNAPSHOT``."""
    try:
        return cursor.fetchone()
    finally:
        cursor.close()


def one(cursor: apsw.Cursor) -> tuple[Any, ...]:
    """The row of a statement that always yields one, with the cursor closed; :class:`StoreCorrupt` for none."""
    row = first(cursor)
    if row is None:
        raise StoreCorrupt("a statement that always yields a row yielded none; the database may be damaged")
    return row


class _Local(PerThread):
    #: the connection this thread borrowed for its outermost read or transaction
    conn: apsw.Connection | None = None
    depth: int = 0


class StoreBase(ThreadBound):
    """Owns the file and the pooled connections; the parts of the store build on its transactions.
    ``_record_sync`` is the inbox's synchronous level, ``_work_sync`` that of claims and fenced work."""

    path: str
    clock: Clock
    _record_sync: int
    _work_sync: int

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
        self._record_sync = sync_level(synchronous, "synchronous")
        self._work_sync = sync_level(work_synchronous, "work_synchronous")
        if busy_timeout < 0:
            raise ConfigurationError(f"busy_timeout={busy_timeout!r} must be >= 0 seconds")
        self._busy_ms = int(busy_timeout * 1000)
        self._local = _Local()
        self._lock = threading.RLock()
        self._idle: list[apsw.Connection] = []
        self._sync: dict[apsw.Connection, int] = {}  # each open connection's synchronous level, once set
        self._conns_lock = threading.Lock()
        self._closed = False
        self._prepare_file()
        started = time.monotonic()
        try:
            with self._borrowed() as conn:
                migrate(conn, schema_version)
        except apsw.BusyError as exc:
            raise StoreUnavailable(
                locked_message(self.path, exc, time.monotonic() - started, busy_timeout, "upgrade its schema")
            ) from exc
        except apsw.Error as exc:  # migrate() turns a failed migration into SchemaError; this is a damaged file
            raise translate(exc, self.path) from exc
        #: the live claims this store found of stores gone from the file, released as it opened: {owner tag: count}
        self._gone_claims: dict[str, int] = {}
        self._holders = _holders_lock(self.path)
        if self._holders is not None:
            try:
                if _alone(self._holders):  # no other store has the file open: every live claim's process is gone
                    self._gone_claims = self._release_owners(lambda tag: not owner_is_alive(tag))
            except StoreError:
                log.warning("could not release the claims of the stores gone from %s; they wait for their leases",
                            self.path, exc_info=True)
            finally:
                fcntl.flock(self._holders, fcntl.LOCK_SH)  # held shared, as by every open store

    def _release_owners(self, gone: Callable[[str], bool]) -> dict[str, int]:
        """End now (as if their leases ran out) the live tagged claims of every owner that ``gone(tag)`` says is
        gone; return the count per owner. Reads first: no write lock is taken without such a claim."""
        with self._read() as reading:
            found = list(reading.execute(sql.LIVE_OWNER_COUNTS, (self.clock(),)))
        tags = [str(tag) for tag, _n in found if gone(str(tag))]
        released: dict[str, int] = {}
        if tags:
            with self._write(self._work_sync) as conn:
                now = self.clock()
                for tag in tags:
                    conn.execute(sql.RELEASE_OWNER, (now, now, now, len(tag) + 1, tag + TAG_SEPARATOR))
                    if conn.changes():
                        released[tag] = conn.changes()
        return released

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
            deadline = self._local.deadline  # opened inside bounded(): the opening waits no longer either
            busy_ms = self._busy_ms if deadline is None else max(1, min(self._busy_ms,
                                                                        int((deadline - time.monotonic()) * 1000)))
            conn.set_busy_timeout(busy_ms)
            conn.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)  # double quotes name identifiers, never strings
            conn.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
            # Savepoints' undo journals, temporary tables and sorts in memory, not in temporary files.
            conn.pragma("temp_store", 2)
            mode = _switch_to_wal(conn, busy_ms / 1000)
            conn.set_busy_timeout(self._busy_ms)
        except apsw.Error as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, apsw.NotADBError):
                raise StoreCorrupt(f"{self.path} is not a SQLite database; refusing to touch it") from exc
            if isinstance(exc, apsw.BusyError):
                raise StoreUnavailable(f"{self.path} stayed locked while switching it to WAL") from exc
            raise translate(exc, self.path) from exc
        if mode != "wal":
            conn.close()
            raise StoreUnavailable(f"{self.path} could not be put in WAL mode (journal_mode is {mode})")
        return conn

    @contextmanager
    def _borrowed(self) -> Iterator[apsw.Connection]:
        """This thread's connection for the block: its enclosing block's, else one of the pool (or a new one), given
        back when the block ends."""
        local = self._local
        if local.conn is not None:
            yield local.conn
            return
        with self._conns_lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._open()
        local.conn = conn
        try:
            yield conn
        finally:
            local.conn = None
            with self._conns_lock:
                keep = not self._closed and len(self._idle) < IDLE_CONNECTIONS
                if keep:
                    self._idle.append(conn)
                else:
                    self._sync.pop(conn, None)
            if not keep:
                conn.close()

    def close(self) -> None:
        """Close every connection of this store (after every thread using it stopped); later calls raise
        :class:`StoreUnavailable`."""
        self._closed = True
        holders, self._holders = getattr(self, "_holders", None), None
        if holders is not None:
            with contextlib.suppress(OSError):
                os.close(holders)
        with self._conns_lock:
            conns, self._idle = self._idle, []
            self._sync.clear()
        for conn in conns:
            try:
                conn.close()
            except apsw.Error:  # pragma: no cover - closing is best effort
                log.warning("closing a store connection failed", exc_info=True)
        self._local = _Local()

    @contextmanager
    def _read(self) -> Iterator[apsw.Connection]:
        """This thread's connection for reads, its lock wait cut to what :meth:`bounded` leaves; APSW errors of the
        block are raised as :class:`StoreError`."""
        started = time.monotonic()
        deadline = None if self._local.depth else self._local.deadline  # (in a transaction the lock is had)
        left = None if deadline is None else deadline - started
        if left is not None and left <= 0:
            raise StoreUnavailable(f"{self.path}: no time left to read (the bound of bounded() ran out)")
        try:
            with self._borrowed() as conn:
                if left is None:
                    yield conn
                    return
                conn.set_busy_timeout(max(1, int(left * 1000)))
                try:
                    yield conn
                finally:
                    conn.set_busy_timeout(self._busy_ms)
        except apsw.BusyError as exc:
            waited = time.monotonic() - started
            if left is None:
                raise StoreUnavailable(locked_message(self.path, exc, waited, self._busy_ms / 1000, "read")) from exc
            raise StoreUnavailable(
                f"{self.path}: could not read within {left:.3f} s: the file stayed locked for {waited:.3f} s "
                f"by another connection to it ({exc})"
            ) from exc
        except (apsw.Error, UnicodeError) as exc:
            raise translate(exc, self.path) from exc

    @contextmanager
    def _statements(self) -> Iterator[None]:
        """APSW errors of the store's own statements inside a caller's block become :class:`StoreError`."""
        try:
            yield
        except (apsw.Error, UnicodeError) as exc:
            raise translate(exc, self.path) from exc

    # --- transactions ---------------------------------------------------------------------------

    @contextmanager
    def _write(self, sync: int, *, own: bool = True) -> Iterator[apsw.Connection]:
        """An IMMEDIATE transaction on a borrowed connection (a savepoint when nested). APSW errors of the begin and
        the commit become :class:`StoreError`s, and so do the block's when it is the store's own (``own``)."""
        local = self._local
        if local.depth:
            conn = local.conn
            assert conn is not None
            if sync > self._sync[conn]:  # SQLite cannot raise the level of a transaction already open
                raise ConfigurationError(
                    "a store call inside write() (record(), exhaust() or a generation change) would commit "
                    "below its synchronous level; open the block with write(durable=True)"
                )
            try:
                with conn:  # APSW turns a nested block into a savepoint
                    local.depth += 1
                    try:
                        yield conn
                    finally:
                        local.depth -= 1
            except (apsw.Error, UnicodeError) as exc:
                if own:
                    raise translate(exc, self.path) from exc
                raise
            return
        with self._lock, self._borrowed() as conn:
            started = time.monotonic()
            try:
                if self._sync.get(conn) != sync:
                    conn.pragma("synchronous", sync)
                    self._sync[conn] = sync
                conn.execute("BEGIN IMMEDIATE")
            except apsw.BusyError as exc:
                waited = time.monotonic() - started
                raise StoreUnavailable(
                    locked_message(self.path, exc, waited, self._busy_ms / 1000, "start a write transaction")
                ) from exc
            except apsw.Error as exc:
                raise translate(exc, self.path) from exc
            local.depth = 1
            local.exhausted = False
            try:
                yield conn
            except BaseException as exc:
                self._roll_back(conn)
                if own and isinstance(exc, (apsw.Error, UnicodeError)):
                    raise translate(exc, self.path) from exc
                raise
            else:
                try:
                    conn.execute("COMMIT")
                except apsw.Error as exc:
                    self._roll_back(conn)
                    raise translate(exc, self.path) from exc
            finally:
                local.depth = 0
            if local.exhausted:
                self._tell_exhausted()

    def _roll_back(self, conn: apsw.Connection) -> None:
        """Roll back the open transaction, if any (a failure is logged: SQLite rolls back what was not committed)."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except apsw.Error:
            log.warning("rolling back a failed transaction failed", exc_info=True)

    def read(self) -> Any:
        """This thread's connection for the application's own reads, taking no write lock (inside a :meth:`write`
        block on this thread it sees that block's writes). SQLite's lock errors become :class:`StoreUnavailable`."""
        return self._read()

    def write(self, *, durable: bool = False) -> Any:
        """A write transaction (``BEGIN IMMEDIATE``) yielding the APSW connection; commits when the block ends, rolls
        back when it raises; store calls inside it on this thread join it as savepoints. ``durable=True`` commits at
        the stronger of ``synchronous`` and ``work_synchronous``; without it a ``record()`` inside raises
        :class:`ConfigurationError` when the inbox's level is the stronger."""
        return self._write(max(self._record_sync, self._work_sync) if durable else self._work_sync, own=False)

