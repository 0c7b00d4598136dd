"""The outbox's SQL on either backend: its statements are written for SQLite (APSW) and adapted once for psycopg.

A :class:`~telegram_fence.store.postgres.PostgresUpdateStore` yields psycopg connections that carry the name of
its outbox table (``{table}_outbox``) as the attribute ``telegram_fence_outbox``; :func:`db` wraps such a
connection so that the outbox's statements (``?`` placeholders, SQLite functions) run there unchanged, with
``execute`` and ``changes`` as on an APSW connection. May import APSW and the standard library (layer 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apsw

_PG_REWRITES = (
    ("lower(hex(randomblob(12)))", "substr(md5(random()::text || clock_timestamp()::text), 1, 24)"),
    ("(SELECT value FROM json_each(?))", "(SELECT json_array_elements_text(?::json))"),
    ("?", "%s"),
)
_pg_statements: dict[tuple[str, str], str] = {}


class _PgDb:
    """``execute`` and ``changes`` of an APSW connection, over a psycopg connection. Not shared between threads."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._table = str(getattr(conn, "telegram_fence_outbox", "fence_outbox"))
        self._changes = 0

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        text = _pg_statements.get((sql, self._table))
        if text is None:
            text = sql.replace("fence_outbox", self._table)
            for old, new in _PG_REWRITES:
                text = text.replace(old, new)
            _pg_statements[(sql, self._table)] = text
        cursor = self._conn.execute(text, tuple(params))
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
    """``conn`` itself for APSW; for a psycopg connection (PostgreSQL store) the same interface over it."""
    return conn if isinstance(conn, (apsw.Connection, _PgDb)) else _PgDb(conn)
