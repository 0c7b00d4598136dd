"""``SqliteUpdateStore``: the update store in one SQLite file (WAL) through APSW, composed by concern."""

from __future__ import annotations

from .claims import Claims
from .fenced import Fenced
from .recording import Recording
from .upkeep import Upkeep

__all__ = ["SqliteUpdateStore"]


class SqliteUpdateStore(Recording, Claims, Fenced, Upkeep):
    """The durable update store in one SQLite file.

    ``SqliteUpdateStore(path, *, clock=time.time, synchronous="FULL", work_synchronous="NORMAL",
    busy_timeout=5.0, schema_version=LATEST)``.

    ``synchronous`` is the durability of the inbox write and of exhaustions; ``work_synchronous`` that of claims,
    renewals, settlements and fenced transactions (with WAL, ``NORMAL`` commits survive a process crash; power
    loss can only rerun a handler). May be shared between threads. A symlink, a non-database file or a newer
    schema raise at construction (:class:`StoreCorrupt`, :class:`SchemaError`); a lock held past
    ``busy_timeout`` raises :class:`StoreUnavailable`.
    """
