"""The call journal's rows in the store: one per Bot API call of a handler, keyed ``(update_id, seq)``; and the
dialect the journal's, the steps' and the conversations' statements are written in.

Statements are written for SQLite (APSW, ``:name`` parameters) and adapted once for psycopg (:func:`pg_text`): on
PostgreSQL the tables sit beside the store's inbox as ``{table}_calls``, ``{table}_pauses``, ``{table}_buckets``,
``{table}_step_results``. Each :class:`Journal` method runs in its own transaction on the calling thread's
connection; its reads go through the store's ``read()`` where it has one (SQLite: no write lock). May import
``store`` (types, table names), ``calls.verdicts`` and the standard library. Safe from any thread.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ..store import Identity
from ..store.tables import is_sqlite, outbox_table
from .verdicts import INTENT, UNCERTAIN

__all__ = ["CallRow", "Journal", "JournalStore", "OneTripJournalStore", "list_calls", "pg_text", "reader", "run",
           "spend"]


class JournalStore(Protocol):
    """What the journal and the steps need of a store: the fenced transaction and a plain write transaction."""

    def transaction(self, identity: Identity, complete: bool = False) -> AbstractContextManager[Any]: ...

    def write(self, *, durable: bool = False) -> AbstractContextManager[Any]: ...


@runtime_checkable
class ReadableJournalStore(JournalStore, Protocol):
    """A store that also reads without taking the write lock (``SqliteUpdateStore.read``)."""

    def read(self) -> AbstractContextManager[Any]: ...


@runtime_checkable
class OneTripJournalStore(ReadableJournalStore, Protocol):
    """A store that runs one statement and its commit in one round trip (``PostgresUpdateStore``), with its
    ownership check (``owned_statement``) or without (``one_statement``, ``flush=False``: its commit does not wait
    for the disk). ``table``: its inbox table, which names the tables."""

    table: str

    def owned_statement(self, identity: Identity, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]: ...

    def one_statement(self, sql: str, params: dict[str, Any], *, flush: bool = True) -> list[tuple[Any, ...]]: ...


def reader(store: JournalStore) -> Callable[[], AbstractContextManager[Any]]:
    """How to read ``store``: its ``read()`` (no write lock) when it has one, else its ``write()``."""
    return store.read if isinstance(store, ReadableJournalStore) else store.write


class CallRow(NamedTuple):
    """One journaled call as the journal keeps it (``answer``: the server's body, as text)."""

    update_id: int
    seq: int
    method: str
    chat_id: int | None
    fingerprint: str
    state: str
    attempt: int
    status: int | None
    answer: str | None
    created_at: float
    changed_at: float

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values (what ``telegram-fence calls --json`` prints)."""
        return {name: getattr(self, name) for name in ("update_id", "seq", "method", "chat_id", "state", "attempt",
                                                       "status", "created_at", "changed_at", "answer")}


log = logging.getLogger("telegram_fence.calls.journal")

_COLUMNS = "update_id, seq, method, chat_id, fingerprint, state, attempt, status, answer, created_at, changed_at"

FIND = f"SELECT {_COLUMNS} FROM fence_calls WHERE update_id = :u AND seq = :s"
# The intent, unless the position is journaled already (then nothing is returned and the row is read); it returns
# when the shared pauses of the call's scope and of the whole bot end. ``INTENT_OWNED`` checks the claim in the same
# statement (``owned_statement``'s ``fence_owner``, PostgreSQL only: hence the casts).
_INTENT = (
    "INSERT INTO fence_calls(update_id, seq, method, chat_id, fingerprint, state, attempt, claim_id, "
    "created_at, changed_at) SELECT CAST(:u AS bigint), CAST(:s AS integer), CAST(:method AS text), "
    "CAST(:chat AS bigint), CAST(:fp AS text), 'intent', CAST(:attempt AS integer), CAST(:claim AS text), "
    "CAST(:now AS float8), CAST(:now AS float8) /*owner*/ "
    "ON CONFLICT (update_id, seq) DO NOTHING RETURNING seq, (SELECT max(until) FROM fence_pauses "
    "WHERE (scope = CAST(:scope AS text) OR scope = 'bot') AND until > CAST(:now AS float8))"
)
INTENT_ROW, INTENT_OWNED = _INTENT.replace("/*owner*/", "WHERE true"), _INTENT.replace("/*owner*/", "FROM fence_owner")
QUEUE_ROW = (
    "INSERT INTO fence_calls(update_id, seq, method, chat_id, fingerprint, state, attempt, claim_id, request, "
    "created_at, changed_at) VALUES (:u, :s, :method, :chat, :fp, 'queued', :attempt, :claim, :request, :now, :now)"
)
# A row left in flight by an earlier attempt: nobody knows whether it reached Telegram.
LAPSED = ("UPDATE fence_calls SET state = 'uncertain', changed_at = :now "
          "WHERE update_id = :u AND seq = :s AND state = 'intent'")
# The answer of a request this claim sent, onto its own intent only: a row a later attempt found and made
# uncertain (and answered its handler so) never changes again.
OUTCOME = ("UPDATE fence_calls SET state = :state, status = :status, answer = :answer, changed_at = :now "
           "WHERE update_id = :u AND seq = :s AND claim_id = :claim AND state = 'intent' RETURNING seq")
FORGET = "DELETE FROM fence_calls WHERE update_id = :u AND seq = :s AND claim_id = :claim AND state = 'intent'"
TAKE_QUEUED = ("UPDATE fence_calls SET state = 'intent', claim_id = :claim, changed_at = :now "
               "WHERE update_id = :u AND seq = :s AND state = 'queued' RETURNING request")
REQUEUE = ("UPDATE fence_calls SET state = 'queued', changed_at = :now "
           "WHERE update_id = :u AND seq = :s AND claim_id = :claim AND state = 'intent'")
QUEUED_ROWS = "SELECT update_id, seq FROM fence_calls WHERE state = 'queued' ORDER BY update_id, seq LIMIT :n"
QUEUED_REQUEST = "SELECT request FROM fence_calls WHERE update_id = :u AND seq = :s AND state = 'queued'"
IN_FLIGHT_ROWS = f"SELECT {_COLUMNS} FROM fence_calls WHERE state = 'intent' ORDER BY update_id, seq LIMIT :n"
COUNTS = "SELECT state, count(*) FROM fence_calls GROUP BY state"
PAUSE = ("INSERT INTO fence_pauses(scope, until) VALUES (:scope, :until) "
         "ON CONFLICT (scope) DO UPDATE SET until = excluded.until WHERE fence_pauses.until < excluded.until")
PAUSED_UNTIL = ("SELECT max(until) FROM fence_pauses WHERE (scope = :scope OR scope = 'bot') AND until > :now")
DROP_PAUSES = "DELETE FROM fence_pauses WHERE until <= :now"
LIST = f"SELECT {_COLUMNS} FROM fence_calls"
NEW_BUCKET = ("INSERT INTO fence_buckets(scope, tokens, at) VALUES (:scope, :burst, :now) "
              "ON CONFLICT (scope) DO NOTHING")
BUCKET = "SELECT tokens, at FROM fence_buckets WHERE scope = :scope /*lock*/"
SPEND = "UPDATE fence_buckets SET tokens = :tokens, at = :now WHERE scope = :scope"

_PARAM = re.compile(r":([a-z]+)\b")
_TABLES = re.compile(r"\bfence_(calls|pauses|buckets|step_results|states|steps)\b")
_pg_cache: dict[tuple[str, str], str] = {}


def pg_text(statement: str, table: str) -> str:
    """``statement`` for psycopg: ``%(name)s`` and ``%s`` parameters (for ``:name`` and ``?``), ``/*lock*/`` as
    ``FOR UPDATE``, and each ``fence_X`` table of the journal, the steps or the conversations as ``{table}_X``
    (``table``: the store's inbox table)."""
    text = _pg_cache.get((statement, table))
    if text is None:
        text = _PARAM.sub(r"%(\1)s", statement).replace("?", "%s").replace("/*lock*/", "FOR UPDATE")
        text = _pg_cache[(statement, table)] = _TABLES.sub(rf"{table}_\1", text)
    return text


def run(conn: Any, statement: str, params: Mapping[str, Any] | Sequence[Any]) -> list[tuple[Any, ...]]:
    """Run ``statement`` (``:name`` or ``?`` parameters) on ``conn`` (APSW, or psycopg lent by a PostgreSQL store)
    and return all its rows."""
    args = dict(params) if isinstance(params, Mapping) else tuple(params)
    if is_sqlite(conn):
        return [tuple(row) for row in conn.execute(statement, args)]
    outbox = str(outbox_table(conn, "fence_updates_outbox"))
    cursor = conn.execute(pg_text(statement, outbox.removesuffix("_outbox")), args)
    return [tuple(row) for row in cursor.fetchall()] if cursor.description is not None else []


def _key(identity: Identity, seq: int) -> dict[str, Any]:
    return {"u": identity.update_id, "s": seq, "claim": identity.claim_id}


class Journal:
    """The journal's reads and writes (see the module docstring); rows are stamped with ``time.time()``."""

    def __init__(self, store: JournalStore) -> None:
        self._store = store
        self._read = reader(store)
        # PostgreSQL: the intent and the outcome in one round trip each (else a transaction of three)
        self._one_trip = store if isinstance(store, OneTripJournalStore) else None

    def _write_one(self, statement: str, params: dict[str, Any], flush: bool = True) -> list[tuple[Any, ...]]:
        """Run ``statement`` in a write transaction of its own (one round trip on PostgreSQL, its commit waiting for
        the disk only with ``flush``); its rows."""
        fast = self._one_trip
        if fast is not None:
            return fast.one_statement(pg_text(statement, fast.table), params, flush=flush)
        with self._store.write() as conn:
            return run(conn, statement, params)

    def open_call(self, identity: Identity, seq: int, method: str, chat_id: int | None,
                  digest: str, *, settled: bool = False) -> tuple[CallRow | None, float]:
        """Write the intent of call ``seq`` and return ``(None, when the shared pauses of scope and bot end)``, or
        ``(the row journaled there already, 0.0)``; an ``intent`` row an earlier attempt left is made ``uncertain``.

        Fenced: :class:`~telegram_fence.errors.OwnershipLost` (nothing written) for a stale attempt, unless
        ``settled`` (this attempt settled the update itself: no other can run it).
        """
        now = time.time()
        params = {**_key(identity, seq), "method": method, "chat": chat_id, "fp": digest,
                  "attempt": identity.attempt, "now": now,
                  "scope": "bot" if chat_id is None else f"chat:{chat_id}"}
        fast = self._one_trip
        if fast is not None:
            if settled:
                opened = fast.one_statement(pg_text(INTENT_ROW, fast.table), params)
            else:  # OwnershipLost when the claim is not live
                opened = fast.owned_statement(identity, pg_text(INTENT_OWNED, fast.table), params)
            if opened:
                return None, 0.0 if opened[0][1] is None else float(opened[0][1])
            # journaled already (a retry reaches the position): read it in a transaction as below
        while True:
            with self._store.write() if settled else self._store.transaction(identity) as conn:
                opened = run(conn, INTENT_ROW, params)
                if opened:  # the first time this position is reached: one statement
                    return None, 0.0 if opened[0][1] is None else float(opened[0][1])
                found = run(conn, FIND, params)
                if not found:  # its intent was forgotten in between (PostgreSQL): write this one
                    continue
                row = CallRow(*found[0])
                if row.state == INTENT:
                    run(conn, LAPSED, params)
                    row = row._replace(state=UNCERTAIN, changed_at=now)
                    lapsed = True
                else:
                    lapsed = False
            if lapsed:
                log.warning("update %s: %s (call %s) was left in flight by attempt %s (killed, or its update taken "
                            "away mid-request): it may or may not have reached Telegram; recorded uncertain, not "
                            "sent again", row.update_id, row.method,
                            row.seq, row.attempt, extra={"update_id": row.update_id, "method": row.method,
                                                         "seq": row.seq, "chat_id": row.chat_id})
            return row, 0.0

    def find(self, identity: Identity, seq: int) -> CallRow | None:
        """The row journaled at ``(identity.update_id, seq)``, or ``None`` (a read)."""
        found = self._reading(FIND, _key(identity, seq))
        return CallRow(*found[0]) if found else None

    def record(self, identity: Identity, seq: int, state: str, status: int | None, answer: str | None, *,
               flush: bool = False) -> bool:
        """Record the outcome of call ``seq`` onto ``identity``'s intent (a queued call's sender: its claim id);
        ``False`` (nothing changed) when a later attempt made the row ``uncertain``. On PostgreSQL its commit waits
        for the disk only with ``flush``: else any later commit that lets another attempt run flushes it first (a
        server crash before that leaves the call uncertain)."""
        params = {**_key(identity, seq), "state": state, "status": status, "answer": answer, "now": time.time()}
        return bool(self._write_one(OUTCOME, params, flush=flush))

    def forget(self, identity: Identity, seq: int) -> None:
        """Delete the intent of call ``seq``: its request certainly did nothing, a later attempt sends it."""
        self._write_one(FORGET, _key(identity, seq))

    def requeue(self, identity: Identity, seq: int) -> None:
        """Put a queued call its sender ``identity`` certainly did not send back to ``queued`` (the next start sends
        it)."""
        self._write_one(REQUEUE, {**_key(identity, seq), "now": time.time()})

    def queue(self, conn: Any, identity: Identity, calls: Iterable[tuple[int, str, int | None, str, str]]) -> None:
        """Write queued calls ``(seq, method, chat_id, digest, request_json)`` in the caller's transaction ``conn``."""
        now = time.time()
        for seq, method, chat_id, digest, request in calls:
            run(conn, QUEUE_ROW, {**_key(identity, seq), "method": method, "chat": chat_id, "fp": digest,
                                   "attempt": identity.attempt, "request": request, "now": now})

    def take_queued(self, update_id: int, seq: int, claim_id: str) -> dict[str, Any] | None:
        """Turn a queued call into an intent of ``claim_id``; its request, or ``None`` when another sender took it."""
        rows = self._write_one(TAKE_QUEUED, {"u": update_id, "s": seq, "claim": claim_id, "now": time.time()})
        return json.loads(rows[0][0]) if rows else None  # type: ignore[no-any-return]

    def queued_request(self, update_id: int, seq: int) -> dict[str, Any] | None:
        """The request of the call queued at ``(update_id, seq)`` while it is still queued, else ``None``."""
        rows = self._reading(QUEUED_REQUEST, {"u": update_id, "s": seq})
        return json.loads(rows[0][0]) if rows else None  # type: ignore[no-any-return]

    def _reading(self, statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._read() as conn:
            return run(conn, statement, params)

    def in_flight(self, limit: int = 1000) -> list[CallRow]:
        """The calls in flight (``intent``: being sent, or left by a process that stopped mid-request)."""
        return [CallRow(*values) for values in self._reading(IN_FLIGHT_ROWS, {"n": limit})]

    def queued(self, limit: int = 100) -> list[tuple[int, int]]:
        """``(update_id, seq)`` of queued calls not sent yet, oldest first."""
        return [(int(u), int(s)) for u, s in self._reading(QUEUED_ROWS, {"n": limit})]

    def counts(self) -> dict[str, int]:
        """How many journaled calls are in each state."""
        return {str(state): int(n) for state, n in self._reading(COUNTS, {})}

    def pause(self, scope: str, until: float) -> None:
        """Record that ``scope`` may not be sent to before ``until`` (wall clock; a later pause wins), and drop
        the pauses that are over."""
        with self._store.write() as conn:
            run(conn, DROP_PAUSES, {"now": time.time()})
            run(conn, PAUSE, {"scope": scope, "until": until})

    def take_tokens(self, buckets: list[tuple[str, float, float]], now: float) -> float:
        """Take one token from each shared bucket ``(scope, rate per second, burst)`` in one transaction: 0.0, or
        (nothing taken) the seconds until every bucket has one."""
        with self._store.write() as conn:
            def level(scope: str, burst: float) -> tuple[float, float]:
                run(conn, NEW_BUCKET, {"scope": scope, "burst": burst, "now": now})
                tokens, at = run(conn, BUCKET, {"scope": scope})[0]
                return float(tokens), float(at)

            return spend(buckets, now, level, lambda scope, value: run(
                conn, SPEND, {"scope": scope, "tokens": value[0], "now": value[1]}))

    def paused_until(self, scope: str, now: float) -> float:
        """When the later of ``scope``'s pause and the whole bot's ends (``0.0``: neither is paused)."""
        rows = self._reading(PAUSED_UNTIL, {"scope": scope, "now": now})
        return 0.0 if not rows or rows[0][0] is None else float(rows[0][0])


def spend(buckets: list[tuple[str, float, float]], now: float, read: Callable[[str, float], tuple[float, float]],
          write: Callable[[str, tuple[float, float]], Any]) -> float:
    """Take one token from each bucket ``(scope, rate per second, burst)``, whose ``(tokens, at)`` ``read(scope,
    burst)`` gives and ``write(scope, (tokens, at))`` keeps: 0.0, or (nothing taken) the seconds until each has one.
    A bucket's time never goes back (it would refill twice for the same span)."""
    delay, levels = 0.0, []
    for scope, rate, burst in buckets:
        tokens, at = read(scope, float(burst))
        stamp = max(now, at)
        level = min(float(burst), tokens + (stamp - at) * rate)
        levels.append((scope, (level - 1.0, stamp)))
        if level < 1.0:
            delay = max(delay, (1.0 - level) / rate)
    if delay <= 0:
        for scope, value in levels:
            write(scope, value)
    return delay


def list_calls(conn: Any, *, update_id: int | None = None, uncertain: bool = False,
               limit: int = 1000) -> Iterator[CallRow]:
    """Journaled calls read on ``conn`` (any connection), by update and position; ``uncertain=True``: only
    ``uncertain`` and ``intent`` ones."""
    return (CallRow(*values) for values in listed(conn, LIST, "seq", update_id, uncertain, limit))


def listed(conn: Any, select: str, order: str, update_id: int | None, uncertain: bool,
           limit: int) -> list[tuple[Any, ...]]:
    """The rows of ``select`` (of ``update_id`` only when given; ``uncertain``: only ``uncertain`` and ``intent``
    ones), by update and ``order``."""
    where = (["update_id = :u"] if update_id is not None else []) + (
        [f"state IN ('{UNCERTAIN}', '{INTENT}')"] if uncertain else [])
    statement = select + (" WHERE " + " AND ".join(where) if where else "") + f" ORDER BY update_id, {order} LIMIT :n"
    return run(conn, statement, {"n": limit, "u": update_id})
