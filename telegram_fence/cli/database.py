"""Which store a command may open, and within how long: the one check every database command runs first.

Nothing here creates or upgrades a schema (only the bot and ``telegram-fence migrate`` do); a read command answers
within its ``--timeout`` (:func:`left`) or raises :class:`~telegram_fence.errors.StoreUnavailable`.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import stat
import sys
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import apsw

from ..errors import FenceError, SchemaError, StoreUnavailable
from ..store.schema import LATEST
from ..store.sqlite import SqliteUpdateStore
from ..telegram import causes
from .args import positive_float

READ_TIMEOUT = 3.0  # seconds a read command may take by default: a supervisor's check must not hang on a lock


def add_timeout(parser: argparse.ArgumentParser, *, postgres: bool = True) -> None:
    """Add ``--timeout SECONDS`` to a read command's parser; its help names PostgreSQL only with ``postgres``."""
    what, note = (("a store locked longer, or a PostgreSQL server that does not answer,",
                   " (connecting to PostgreSQL takes whole seconds, at least 2)") if postgres
                  else ("a file locked longer by another connection", ""))
    parser.add_argument("--timeout", type=positive_float, default=READ_TIMEOUT, metavar="SECONDS",
                        help=f"answer within this (default %(default)g): {what} is one line on stderr and exit 1{note}")


def left(deadline: float) -> float:
    """Seconds until the monotonic ``deadline`` (at least a millisecond, so a last step still fails by its own
    timeout, not by 0)."""
    return max(0.001, deadline - time.monotonic())


def is_lock_error(exc: BaseException) -> bool:
    """Whether ``exc`` is (or was caused by) a driver's "another connection holds the lock" or "gave up waiting"
    error (psycopg's only when it is loaded)."""
    psycopg = sys.modules.get("psycopg")
    kinds: tuple[type[BaseException], ...] = (apsw.BusyError, apsw.LockedError)
    if psycopg is not None:
        kinds += (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)
    return any(isinstance(error, kinds) for error in causes(exc, context=False))


@contextmanager
def translated_locks(where: str) -> Iterator[None]:
    """A lock error of the block (:func:`is_lock_error`) raised as :class:`StoreUnavailable` naming ``where``."""
    try:
        yield
    except StoreUnavailable:
        raise
    except Exception as exc:
        if not is_lock_error(exc):
            raise
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise StoreUnavailable(f"{where}: {first}") from exc


def unread_line(exc: StoreUnavailable, seconds: float, consequence: str) -> str:
    """The one line for a store that did not answer within ``seconds``: why, and ``consequence``."""
    why = "another connection holds a lock on it" if is_lock_error(exc) else "it did not answer"
    detail = " ".join(str(exc).split())
    return f"the store could not be read within {seconds:g} s: {why}, {consequence} (nothing was written; {detail})"


_MAGIC = b"SQLite format 3\x00"


class DatabaseRefused(FenceError):
    """The path is not a database this command may open; the message is one line for the user."""


@dataclass(frozen=True)
class FenceFile:
    """A file :func:`inspect` found to be a telegram_fence database."""
    path: str
    version: int
    wal: bool


def is_conninfo(db: str) -> bool:
    """Whether ``db`` names a PostgreSQL server (a ``postgresql://`` URL or ``key=value`` settings), not a file."""
    return db.startswith(("postgresql://", "postgres://")) or ("=" in db and ("host=" in db or "dbname=" in db))


_PASSWORD = re.compile(r"(password\s*=\s*)('(?:\\.|[^'\\])*'|[^\s&]+)", re.IGNORECASE)


def shown_conninfo(conninfo: str) -> str:
    """``conninfo`` as a line may show it: a URL's ``user:password@`` left out, any ``password=`` value masked."""
    if "://" in conninfo:
        scheme, _, rest = conninfo.partition("://")
        authority, slash, tail = rest.partition("/")
        conninfo = f"{scheme}://{authority.rpartition('@')[2]}{slash}{tail}"
    return _PASSWORD.sub(r"\1***", conninfo)


def _not_fence(path: str, why: str) -> DatabaseRefused:
    return DatabaseRefused(f"{path}: not a telegram_fence database ({why})")


def _header(path: str) -> bytes:
    """The file's first 100 bytes, after checking it is an existing regular file (never follows a link)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        if is_conninfo(path):
            raise DatabaseRefused(f"{shown_conninfo(path)}: looks like a PostgreSQL connection string; this command "
                                  "works on a SQLite file only (status, exhaustions, updates, show, retry, prune, "
                                  "calls, steps and states take a connection string)") from None
        raise DatabaseRefused(f"{path}: no database file there; pass the file the bot runs with") from None
    except OSError as exc:
        raise DatabaseRefused(f"{path}: cannot be read: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise _not_fence(path, "it is a directory")
    if stat.S_ISLNK(mode):
        raise DatabaseRefused(f"{path}: is a symbolic link; pass the real path of the database file")
    if not stat.S_ISREG(mode):
        raise _not_fence(path, "not a regular file")
    try:
        with open(path, "rb") as handle:
            return handle.read(100)
    except OSError as exc:
        raise DatabaseRefused(f"{path}: cannot be read: {exc.strerror}") from None


def reader(path: str, busy_timeout: float = 5.0) -> apsw.Connection:
    """A read-only connection to ``path`` that creates no file: immutable when neither ``-wal`` nor ``-shm`` exists
    (SQLite would otherwise leave both behind), else through them with a busy timeout of ``busy_timeout``
    seconds. Raises :class:`DatabaseRefused` when SQLite cannot open it."""
    quoted = urllib.parse.quote(os.path.abspath(path))
    has_wal = os.path.exists(path + "-wal") or os.path.exists(path + "-shm")
    uri = f"file:{quoted}?" + ("mode=ro" if has_wal else "immutable=1")
    try:
        conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
        conn.set_busy_timeout(max(1, int(busy_timeout * 1000)))
    except apsw.Error as exc:
        raise DatabaseRefused(f"{path}: cannot be opened read-only: {exc}") from None
    return conn


def inspect(path: str | os.PathLike[str], busy_timeout: float = 5.0) -> FenceFile:
    """What ``path`` is, read-only: a telegram_fence database of some schema version, else :class:`DatabaseRefused`
    naming why in one line; :class:`StoreUnavailable` when it stayed locked ``busy_timeout`` seconds."""
    path = os.fspath(path)
    header = _header(path)
    if not header:
        raise _not_fence(path, "an empty file")
    if len(header) < 100 or not header.startswith(_MAGIC):
        raise _not_fence(path, "not a SQLite file")
    wal = header[18] == 2 and header[19] == 2
    conn = reader(path, busy_timeout)
    try:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        version = int(conn.pragma("user_version"))
    except apsw.NotADBError:
        raise _not_fence(path, "not a SQLite file") from None
    except (apsw.BusyError, apsw.LockedError) as exc:
        raise StoreUnavailable(f"{path} stayed locked for {busy_timeout:g} s by another connection: {exc}") from exc
    except apsw.Error as exc:
        raise DatabaseRefused(f"{path}: cannot be read: {exc}") from None
    finally:
        conn.close()
    if not {"fence_updates", "fence_meta"} <= names:
        raise _not_fence(path, "it has no fence_updates and fence_meta tables")
    if version < 1:
        raise _not_fence(path, f"it has fence tables but schema version {version}")
    return FenceFile(path, version, wal)


def require_current(path: str | os.PathLike[str], busy_timeout: float = 5.0, *, older: bool = False) -> FenceFile:
    """:func:`inspect`, and refuse (:class:`DatabaseRefused`) a newer version, and unless ``older`` an older one or
    rollback mode."""
    found = inspect(path, busy_timeout)
    name = found.path
    if found.version > LATEST:
        raise DatabaseRefused(f"{name}: schema version {found.version} is newer than this telegram_fence ({LATEST}); "
                              "use the telegram_fence that wrote it")
    if older:
        return found
    if found.version < LATEST:
        raise DatabaseRefused(f"{name}: schema version {found.version} is older than this telegram_fence ({LATEST}): "
                              f"run `telegram-fence migrate {name}` (or start the bot with this version)")
    if not found.wal:
        raise DatabaseRefused(f"{name}: a telegram_fence database not in WAL mode: run `telegram-fence migrate {name}` "
                              "once (or start the bot) to switch it back")
    return found


def open_current(path: str | os.PathLike[str], busy_timeout: float = 5.0) -> SqliteUpdateStore:
    """The store of a current fence database, after :func:`require_current`; opening it writes nothing."""
    return SqliteUpdateStore(require_current(path, busy_timeout).path)


@contextmanager
def read_only(db: str, table: str, timeout: float = 5.0) -> Iterator[Any]:
    """A connection that only reads, closed after: to a current fence file (:func:`require_current`, nothing
    created), or a transaction on the existing PostgreSQL ``table``'s store. Everything answers within ``timeout``
    seconds, else :class:`StoreUnavailable` (a lock error of the block's own statements included)."""
    deadline = time.monotonic() + timeout
    if not is_conninfo(db):
        found = require_current(db, left(deadline))
        conn = reader(found.path, left(deadline))
        try:
            with translated_locks(found.path):
                yield conn
        finally:
            conn.close()
        return
    with open_postgres(db, table, pool_size=1, timeout=timeout) as store, store.bounded(left(deadline)), \
            translated_locks(f"table {table}"), store.write() as conn:
        yield conn


@contextmanager
def open_postgres(conninfo: str, table: str, *, pool_size: int, timeout: float = 5.0) -> Iterator[Any]:
    """The PostgreSQL store on ``table`` (never created) for a command given a connection string; closed after.
    :func:`reach_postgres` first, so what is wrong is one :class:`FenceError` at once, not a pool's retries."""
    reach_postgres(conninfo, table, timeout)
    from ..store.postgres import PostgresUpdateStore

    try:
        store = PostgresUpdateStore(conninfo, table=table, create_table=False, pool_size=pool_size)
    except SchemaError:
        raise FenceError(f"table {table} is not a current telegram_fence store's (its companion tables or columns are "
                         "missing): check --table (nothing was changed), or let the bot create or migrate it on its "
                         "start") from None
    try:
        yield store
    finally:
        store.close()


def reach_postgres(conninfo: str, table: str, timeout: float = 5.0) -> None:
    """Connect once (within ``timeout``, in libpq's whole seconds, at least 2) or raise :class:`FenceError` naming
    what failed in one line: no psycopg, the server's first line, a bad ``table`` name
    (:class:`~telegram_fence.errors.ConfigurationError`), or no such table or ``_meta`` table. (The store, opened
    next without creating anything, refuses tables that are not a current fence store's.)"""
    try:
        import psycopg
    except ImportError:
        raise FenceError('a PostgreSQL connection string needs psycopg: pip install "telegram_fence[postgres]"') \
            from None
    from ..store.postgres.schema import split_table

    split_table(table)  # ConfigurationError naming what a table name may be, before any connection
    try:
        seconds = max(2, math.ceil(timeout))  # libpq counts whole seconds, at least 2
        conn = psycopg.connect(conninfo, connect_timeout=seconds)
    except psycopg.Error as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = lines[0] if lines else type(exc).__name__
        if "timeout expired" in reason:
            reason += f" (no answer within {seconds} s)"
        raise FenceError(f"cannot connect to PostgreSQL: {reason}") from None
    try:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
                           (table, f"{table}_meta")).fetchone()
    except psycopg.Error:
        row = None  # the store's own check, next, says what is wrong
    finally:
        conn.close()
    if row is not None and not row[0]:
        raise FenceError(f"no telegram_fence table {table} in that database (nor {table}_meta): check --table; "
                         f"the bot creates its tables on its first start, or apply `telegram-fence schema "
                         f"--postgres {table}`")
