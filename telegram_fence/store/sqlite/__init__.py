"""``SqliteUpdateStore``: the update store in one SQLite file (WAL) through APSW, composed by concern.

=================  =================================================================================
``connection``     pooled connections, WAL, busy timeout, synchronous levels, ``write()``
``sql``            the SQL statements
``recording``      ``record``, ``next_offset``; encoding of batches
``claims``         ``exchange``
``fenced``         ``retry_owned``, ``renew_many``, ``settle_many``, ``owns``, ``transaction``, ``release``,
                   ``exhaust``, ``due_exhaustions``, ``acknowledge_exhaustion``
``upkeep``         ``prune``, poller generations, ``stats``
=================  =================================================================================

May import ``errors``, ``updates`` and ``store`` (the contract, the schema). The import path
``telegram_fence.store.sqlite.SqliteUpdateStore`` is public.
"""

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

    ``synchronous`` is the durability of the inbox write (``record``: updates + cursor) and of
    exhaustions; ``work_synchronous`` that of claims, renewals, settlements and fenced
    transactions. With WAL, ``NORMAL`` commits survive a process crash; only power loss can roll
    back the last of them, which returns the update to an earlier state (claimed or pending) and
    so reruns its handler; nothing is lost (see ``docs/guarantees.md``).

    May be shared between threads (pooled connections; write transactions of one process take an in-process
    lock before ``BEGIN IMMEDIATE``; between processes the busy timeout applies). Errors: a symlink, a
    non-database file or a newer schema raise at construction (:class:`StoreCorrupt`, :class:`SchemaError`); a
    lock held past ``busy_timeout`` raises :class:`StoreUnavailable`.
    """
