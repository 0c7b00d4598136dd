"""Server-side prepared statements for the scripts of ``PostgresUpdateStore`` (one round trip, several statements).

A script sent as one simple query is planned again on every call (the claim's statements: ≈ 2 ms of planning
on this machine, more than the round trip they save). So each statement of a script is prepared once per
session (``PREPARE name AS ...``, sent in front of the first script that needs it, in the same round trip) and
called as ``EXECUTE name(...)``. Which statements a session holds is remembered per connection; when that memory
is wrong (a session reset by the application, a ``PREPARE`` undone), the call fails with psycopg's
``InvalidSqlStatementName`` or ``DuplicatePreparedStatement``: :meth:`Prepared.forget` reloads the truth from
``pg_prepared_statements`` and the caller sends the script again.

May import psycopg and the standard library. Thread safety: one :class:`Prepared` serves every thread (a lock
guards the memory); a connection is used by one thread at a time.
"""

from __future__ import annotations

import hashlib
import re
import threading
import weakref
from typing import Any

import psycopg
import psycopg.errors

__all__ = ["RETRY", "Prepared"]

#: The errors of a script whose prepared statements the session did not hold as remembered.
RETRY = (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement)

_NAMED = re.compile(r"%\((\w+)\)s")


class _Statement:
    """One statement with ``%(name)s`` placeholders, as a ``PREPARE`` (``$n``) and an ``EXECUTE`` (``%(name)s``)."""

    def __init__(self, sql: str) -> None:
        order: list[str] = []
        for name in _NAMED.findall(sql):
            if name not in order:
                order.append(name)
        self.name = "telegram_fence_" + hashlib.sha1(sql.encode()).hexdigest()[:16]
        body = _NAMED.sub(lambda m: f"${order.index(m.group(1)) + 1}", sql)
        self.prepare = f"PREPARE {self.name} AS {body}"
        self.execute = f"EXECUTE {self.name}({', '.join(f'%({n})s' for n in order)})" if order else \
            f"EXECUTE {self.name}"


class Prepared:
    """The prepared statements of a store's scripts, and which sessions hold them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._statements: dict[str, _Statement] = {}
        self._held: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[str]] = weakref.WeakKeyDictionary()

    def script(self, conn: psycopg.Connection[Any], parts: list[str]) -> tuple[str, list[str]]:
        """``parts`` (statements with ``%(name)s`` placeholders) as ``EXECUTE`` calls, with the ``PREPARE``s
        ``conn``'s session still needs; returns ``(the PREPAREs to send first, joined; the calls)``. Call
        :meth:`held` once the script succeeded."""
        with self._lock:
            held = self._held.get(conn, set())
            statements = []
            for sql in parts:
                statement = self._statements.get(sql)
                if statement is None:
                    statement = self._statements[sql] = _Statement(sql)
                statements.append(statement)
        missing = [s.prepare for s in statements if s.name not in held]
        return "; ".join(missing), [s.execute for s in statements]

    def held(self, conn: psycopg.Connection[Any], parts: list[str]) -> None:
        """Remember that ``conn``'s session holds the statements of ``parts`` (its script succeeded)."""
        with self._lock:
            names = {self._statements[sql].name for sql in parts}
            self._held.setdefault(conn, set()).update(names)

    def forget(self, conn: psycopg.Connection[Any]) -> None:
        """Learn again which statements ``conn``'s session holds (after a :data:`RETRY` error). Raises psycopg's
        exceptions."""
        rows = conn.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'telegram\\_fence\\_%'")
        names = {row[0] for row in rows}
        with self._lock:
            self._held[conn] = names
