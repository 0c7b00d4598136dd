"""The outbox's SQL on either backend: each statement is written once per backend (:class:`Sql`), and :func:`db`
runs the one that fits the connection it is handed.

A :class:`~telegram_fence.store.postgres.PostgresUpdateStore` notes the name of its outbox table
(``{table}_outbox``) beside each psycopg connection it lends (:func:`telegram_fence.store.tables.outbox_table`); the
PostgreSQL text names the table ``{outbox}`` and takes ``%s`` placeholders, the SQLite text uses ``fence_outbox``
and ``?``. Both sides offer ``execute`` and ``changes`` as on an APSW connection. May import APSW, the standard
library and ``store.tables`` (layer 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...store.tables import is_sqlite, outbox_table

if TYPE_CHECKING:
    import apsw


@dataclass(frozen=True)
class Sql:
    """One outbox statement in each backend's own SQL: ``sqlite`` (``?`` placeholders, table ``fence_outbox``)
    and ``postgres`` (``%s`` placeholders, table ``{outbox}``)."""

    sqlite: str
    postgres: str


class _SqliteDb:
    """``execute`` (of :class:`Sql` statements) and ``changes`` over an APSW connection. Not shared between
    threads."""

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def execute(self, sql: Sql, params: Sequence[Any] = ()) -> Any:
        return self._conn.execute(sql.sqlite, tuple(params))

    def changes(self) -> int:
        return int(self._conn.changes())


class _PgDb:
    """``execute`` (of :class:`Sql` statements) and ``changes`` over a psycopg connection. Not shared between
    threads."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._table = str(outbox_table(conn, "fence_outbox"))
        self._changes = 0

    def execute(self, sql: Sql, params: Sequence[Any] = ()) -> Any:
        cursor = self._conn.execute(sql.postgres.format(outbox=self._table), tuple(params))
        self._changes = max(0, cursor.rowcount)
        return cursor

    def changes(self) -> int:
        return self._changes


def first(cursor: Any) -> Any:
    """The first row of an APSW or psycopg ``cursor`` (``None`` when it yields none), with the cursor closed.

    A statement left open when its transaction commits keeps an APSW connection's read snapshot, and the
    thread's next write then fails at once (see ``store.sqlite.connection.first``): every single-row read
    of the outbox goes through here.
    """
    try:
        return cursor.fetchone()
    finally:
        cursor.close()


def db(conn: Any) -> Any:
    """The outbox's interface over ``conn``: an APSW connection (SQLite store) or a psycopg one (PostgreSQL
    store); ``conn`` itself when it is one already."""
    if isinstance(conn, (_SqliteDb, _PgDb)):
        return conn
    return _SqliteDb(conn) if is_sqlite(conn) else _PgDb(conn)
