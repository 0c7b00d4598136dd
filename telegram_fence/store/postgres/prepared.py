"""Server-side prepared statements for the scripts of ``PostgresUpdateStore`` (one round trip, several statements).

A script sent as one simple query is planned again on every call (the claim's statements: ≈ 2 ms of planning
on this machine, more than the round trip they save). So each statement of a script is prepared once per
session (``PREPARE name AS ...``, sent in front of the first script that needs it, in the same round trip) and
called as ``EXECUTE name(...)``. Which statements a session holds is remembered per connection; when that memory
is wrong (a session reset by the application, a ``PREPARE`` undone), the call fails with psycopg's
``InvalidSqlStatementName`` or ``DuplicatePreparedStatement``: :meth:`Prepared.forget` reloads the truth from
``pg_prepared_statements`` and the caller sends the script again where it may (:func:`send_script`, the one place
that does). A ``PREPARE`` is not transactional: one sent with a script that failed stays in the session, so a failed
script puts its session's memory in doubt (:meth:`Prepared.doubt`), learnt again before the next script.

The calls' arguments are written into the script as SQL literals here (:func:`literal`), not by the driver's
client-side adaptation: the script's values are a few numbers and texts, and psycopg's machinery for them cost
more client CPU than the round trip's statements took on the server.

May import psycopg and the standard library. Thread safety: one :class:`Prepared` serves every thread (a lock
guards the memory); a connection is used by one thread at a time.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import psycopg
import psycopg.errors

T = TypeVar("T")
__all__ = ["RETRY", "Prepared", "ScriptResult", "literal", "run_script", "send_script", "statement_rows", "undo_script"]

def undo_script(conn: psycopg.Connection[Any], savepoint: str | None) -> None:
    """Undo what a failed one-round-trip script left open: its ``savepoint`` in the thread's transaction (a
    nested script), or (``None``) the transaction it began. Never raises: on a broken connection the server ends
    the transaction and the pool replaces the connection."""
    try:
        if savepoint is not None:
            conn.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
            conn.execute(f"RELEASE SAVEPOINT {savepoint}")
        elif conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")
    except psycopg.Error:
        pass


class ScriptResult(NamedTuple):
    """One statement's result in a script: its command tag (``UPDATE 3``), its row count, its rows (``None`` when it
    returns none)."""

    status: str
    rowcount: int
    rows: list[Any] | None


def _all_results(cur: psycopg.ClientCursor[Any]) -> list[ScriptResult]:
    """Every statement's result of the script ``cur`` sent, in order."""
    results: list[ScriptResult] = []
    while True:
        rows = cur.fetchall() if cur.pgresult is not None and \
            cur.pgresult.status == psycopg.pq.ExecStatus.TUPLES_OK else None
        results.append(ScriptResult(cur.statusmessage or "", cur.rowcount, rows))
        if not cur.nextset():
            return results


def statement_rows(cur: psycopg.ClientCursor[Any]) -> list[Any]:
    """The rows of the one statement that returns rows in the script ``cur`` sent (``[]`` when none does)."""
    rows: list[Any] = []
    while True:  # past the BEGIN and the PREPAREs, to the statement's rows
        if cur.pgresult is not None and cur.pgresult.status == psycopg.pq.ExecStatus.TUPLES_OK:
            rows = cur.fetchall()
        if not cur.nextset():
            return rows


def send_script(
    conn: psycopg.Connection[Any], prepared: Prepared, parts: list[str], params: dict[str, Any],
    frame: Callable[[list[str]], list[str]], read: Callable[[psycopg.ClientCursor[Any]], T],
    undo: Callable[[], None] | None,
) -> T:
    """Send ``parts`` as ONE script on ``conn`` (one round trip): their ``EXECUTE`` calls behind the ``PREPARE``s the
    session lacks, framed by ``frame`` (which adds the script's begin and end); return ``read(cursor)`` of its answer.
    The one place where a script of prepared statements is sent again.

    ``undo`` says whose transaction the script runs in, and so whether it may be sent again:

    - the script's own (it begins its transaction or savepoint, or runs alone on an idle session): ``undo()``
      undoes what a failure left open (it must not raise); after a :data:`RETRY` error (the session did not hold the
      statements as remembered) the script is sent once more, after learning which the session holds;
    - ``None``, the caller's (the script runs inside a transaction the caller began, e.g. the ``COMMIT`` of
      :meth:`~.connection.Connections.scripted`): an error aborted that transaction, so nothing can be sent again
      here: the error is raised and the caller rolls back.

    Either way a failed script leaves the memory of ``conn``'s session in doubt when it carried ``PREPARE``s (a
    ``PREPARE`` is not transactional: it stays though a later statement of the script failed) or met a
    :data:`RETRY` error it did not retry: the next script on ``conn`` learns it again first (:meth:`Prepared.doubt`),
    so one failure never makes every later script on that session fail. Raises psycopg's exceptions."""
    for last_try in (False, True):
        prepare, calls = prepared.script(conn, parts, params)
        cur = psycopg.ClientCursor(conn)
        try:
            cur.execute("; ".join(frame([*([prepare] if prepare else []), *calls])))
            answer = read(cur)
        except RETRY:
            if undo is not None:
                undo()
            if last_try or undo is None:
                prepared.doubt(conn)
                raise
            prepared.forget(conn)
            continue
        except BaseException:
            if prepare:
                prepared.doubt(conn)
            if undo is not None:
                undo()
            raise
        finally:
            cur.close()
        if prepare:
            prepared.held(conn, parts)
        return answer
    raise AssertionError("unreachable")  # pragma: no cover


def run_script(
    conn: psycopg.Connection[Any], prepared: Prepared, parts: list[str], params: dict[str, Any], savepoint: str | None,
    frame: Callable[[list[str]], list[str]],
) -> list[ScriptResult]:
    """Run ``parts`` as ONE script on ``conn`` (one round trip, see :func:`send_script`), in a transaction or savepoint
    of its own that ``frame`` opens and closes: ``savepoint`` is the one it opens in the thread's open transaction,
    ``None`` for a transaction of its own. Returns every statement's result, in order. When the session lost its
    prepared statements the script runs once more after learning which it holds. On failure the script is undone
    (:func:`undo_script`) and psycopg's exception raised."""
    return send_script(conn, prepared, parts, params, frame, _all_results, lambda: undo_script(conn, savepoint))


#: The errors of a script whose prepared statements the session did not hold as remembered.
RETRY = (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement)

_NAMED = re.compile(r"%\((\w+)\)s")


def _text(value: str) -> str:
    if "\x00" in value:
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    return "E'" + value.replace("'", "''") + "'"


def _float(value: float) -> str:
    value = float(value)
    if value != value or value in (math.inf, -math.inf):
        return f"'{value!r}'::float8".replace("inf", "Infinity").replace("nan", "NaN")
    return repr(value)


def _other(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return _text(value)
    raise TypeError(f"no SQL literal for a {type(value).__name__} here")


#: The writers of the exact types a script carries (a subclass goes through :func:`_other`).
_WRITERS: dict[type, Callable[[Any], str]] = {
    type(None): lambda _value: "NULL", bool: lambda value: "true" if value else "false", int: str, float: _float,
    str: _text,
}


def literal(value: object) -> str:
    """``value`` (``None``, a bool, an int, a float or a str) as a SQL literal, whatever the server's
    ``standard_conforming_strings`` (texts are written ``E'...'``). Raises ``psycopg.DataError`` for a text
    holding a NUL character (PostgreSQL cannot store one, as psycopg itself refuses) and ``TypeError`` for a
    value of another type."""
    return _WRITERS.get(type(value), _other)(value)


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
        self.order = tuple(order)
        self.execute = f"EXECUTE {self.name}({', '.join(f'%({n})s' for n in order)})" if order else \
            f"EXECUTE {self.name}"

    def call(self, params: dict[str, Any]) -> str:
        """The ``EXECUTE`` with ``params`` written in as literals (see :func:`literal`)."""
        if not self.order:
            return f"EXECUTE {self.name}"
        write = _WRITERS.get
        values = [params[n] for n in self.order]
        return f"EXECUTE {self.name}({', '.join([write(type(v), _other)(v) for v in values])})"


class Prepared:
    """The prepared statements of a store's scripts, and which sessions hold them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._statements: dict[str, _Statement] = {}
        self._held: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[str]] = weakref.WeakKeyDictionary()
        self._doubted: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()

    def script(
        self, conn: psycopg.Connection[Any], parts: list[str], params: dict[str, Any] | None = None
    ) -> tuple[str, list[str]]:
        """``parts`` (statements with ``%(name)s`` placeholders) as ``EXECUTE`` calls, with the ``PREPARE``s
        ``conn``'s session still needs; returns ``(the PREPAREs to send first, joined; the calls)``. With
        ``params`` the calls carry their arguments as literals (send the script without parameters: it holds no
        placeholder then); without, they keep ``%(name)s`` placeholders for the driver. Call :meth:`held` once
        the script succeeded (a no-op when no PREPARE was needed). Raises as :func:`literal` for a value it
        cannot write; psycopg's exceptions when ``conn``'s memory was in doubt (:meth:`doubt`) and reading which
        statements its session holds failed."""
        if conn in self._doubted:
            self.forget(conn)
        with self._lock:
            held = self._held.get(conn, set())
            statements = []
            for sql in parts:
                statement = self._statements.get(sql)
                if statement is None:
                    statement = self._statements[sql] = _Statement(sql)
                statements.append(statement)
        missing = [s.prepare for s in statements if s.name not in held]
        if params is None:
            return "; ".join(missing), [s.execute for s in statements]
        return "; ".join(missing), [s.call(params) for s in statements]

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
            self._doubted.discard(conn)

    def doubt(self, conn: psycopg.Connection[Any]) -> None:
        """What ``conn``'s session holds is no longer known (a script failed after its ``PREPARE``s, or inside a
        transaction that could not send it again): the next :meth:`script` on ``conn`` learns it first."""
        with self._lock:
            self._doubted.add(conn)
