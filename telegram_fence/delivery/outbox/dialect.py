"""The outbox's SQL on either backend: :class:`Sql` holds each statement's text per backend, and :func:`db` runs
the one that fits the connection it is handed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...store.tables import is_sqlite, outbox_table

if TYPE_CHECKING:
    import apsw


class Sql:
    """One outbox statement, written once with ``?`` placeholders and ``{outbox}`` for the table.

    ``sqlite`` names the table ``fence_outbox``; ``postgres`` takes ``%s`` placeholders and keeps ``{outbox}``
    (the store's own table name is filled in per connection). Pass ``postgres=`` where the dialects differ.
    """

    __slots__ = ("postgres", "sqlite")

    def __init__(self, text: str, postgres: str | None = None) -> None:
        self.sqlite = text.format(outbox="fence_outbox")
        self.postgres = postgres or text.replace("?", "%s")


class _SqliteDb:
    """``execute`` (of :class:`Sql` statements) and ``changes`` over an APSW connection."""

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def execute(self, sql: Sql, params: Sequence[Any] = ()) -> Any:
        return self._conn.execute(sql.sqlite, tuple(params))

    def changes(self) -> int:
        return int(self._conn.changes())


class _PgDb:
    """``execute`` (of :class:`Sql` statements) and ``changes`` over a psycopg connection."""

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

    An APSW statement left open at commit keeps its read snapshot and fails the thread's next write: every
    single-row read of the outbox goes through here.
    """
    try:
        return cursor.fetchone()
    finally:
        cursor.close()


def db(conn: Any) -> Any:
    """The outbox's interface over an APSW or psycopg connection (``conn`` itself when it is one already)."""
    if isinstance(conn, (_SqliteDb, _PgDb)):
        return conn
    return _SqliteDb(conn) if is_sqlite(conn) else _PgDb(conn)
