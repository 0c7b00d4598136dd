"""``PostgresUpdateStore``: the three contract levels of the update store on PostgreSQL.

May import psycopg (through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`,
:mod:`telegram_fence.updates` and the contract types of :mod:`telegram_fence.store`.

The semantics are those of :class:`~telegram_fence.store.sqlite.SqliteUpdateStore` (the conformance
suite checks both); what differs is how they are kept between hosts:

- claims lock their candidate rows ``FOR UPDATE SKIP LOCKED`` (racing claimers never wait for, nor
  take, each other's rows), then take a transaction-scoped advisory lock per chat and check again, on a
  snapshot taken after that lock, that the chat has no live claim: two hosts never hold one chat;
- ``transaction(identity)`` locks the row of the claim before checking it, so no reclaim can commit
  between the check and the commit; every wait for a lock ends after ``lock_timeout`` with
  :class:`~telegram_fence.errors.StoreUnavailable`;
- "now" is the database server's clock unless ``clock=`` is given.

Composed by concern, as the SQLite store is: :mod:`.connection` (the pool, transactions), :mod:`.support`
(opening, time, runtime support), :mod:`.recording`, :mod:`.claims` and :mod:`.fenced`.
"""

from __future__ import annotations

from .claims import Claims
from .fenced import Fenced
from .recording import Recording

__all__ = ["PostgresUpdateStore"]


class PostgresUpdateStore(Recording, Claims, Fenced):
    """The durable update store (all three capability levels) in PostgreSQL, shareable between hosts.

    ``conninfo``: a libpq connection string (the store opens a pool of up to ``pool_size`` connections and
    closes it in :meth:`close`). ``table``: the inbox table; ``{table}_meta``, ``{table}_generations`` and
    ``{table}_leader`` sit beside it (see :func:`~telegram_fence.store.postgres.schema_sql`).
    ``create_table=True`` applies the schema (idempotent, serialised between processes); with ``False``
    the application applies it, and a table or column of it missing is :class:`~telegram_fence.errors.SchemaError`.
    ``clock``: ``None`` (every time from the database server) or a ``() -> float`` used instead (tests).
    ``lock_timeout`` bounds every wait for a row lock, ``connect_timeout`` the wait for a connection,
    ``statement_timeout`` every statement (the server's own setting, the application's statements inside
    :meth:`write` and ``transaction()`` included); a
    statement the server has not answered within twice ``statement_timeout`` (a server, or a proxy, that accepted
    the session and stopped answering) has its connection cut on this side. All end in
    :class:`~telegram_fence.errors.StoreUnavailable`. The connections use TCP keepalives (see
    :data:`~telegram_fence.store.postgres.connection.KEEPALIVES`).

    May be shared between threads (each thread's transaction has its own pooled connection). Never
    raises psycopg exceptions: connection problems are ``StoreUnavailable``, a missing table or column
    ``SchemaError``, anything else the database refuses ``StoreError``.
    """

    #: ``write()`` and ``transaction()`` yield a psycopg connection: SQL placeholders are ``%s``.
    paramstyle = "format"
