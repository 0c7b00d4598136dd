"""The call journal's rows in the store: one per Bot API call of a handler, keyed ``(update_id, seq)``.

Written for SQLite (APSW, ``:name`` parameters) and adapted once for psycopg: a PostgreSQL store's
connections name its outbox table ``{table}_outbox``, and the journal lives beside it as ``{table}_calls``
(the pauses as ``{table}_pauses``). May import APSW, ``errors``, ``store`` (types), ``calls.verdicts``
and the standard library (layer 2).

Thread safety: :class:`Journal` holds no state of its own besides the store; every method runs in its own
transaction of the store (on the calling thread's connection) and may be called from any thread. The methods
that only read (:meth:`Journal.find`, :meth:`Journal.queued`, :meth:`Journal.counts`, :meth:`Journal.pauses`,
:meth:`Journal.paused_until`) go through the store's ``read()`` where it has one (SQLite: no write lock, so they
answer while another connection or process holds it), else through a transaction that writes nothing
(PostgreSQL, where a reader never waits for a writer).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from ..records import Record
from ..store import Identity
from ..store.tables import is_sqlite, outbox_table
from .verdicts import INTENT, UNCERTAIN

__all__ = ["CallRow", "Journal", "JournalStore", "OneTripJournalStore", "list_calls", "sql_for"]


class JournalStore(Protocol):
    """What the journal needs of a store: the fenced transaction and a plain write transaction."""

    def transaction(self, identity: Identity, complete: bool = False) -> AbstractContextManager[Any]: ...

    def write(self, *, durable: bool = False) -> AbstractContextManager[Any]: ...


@runtime_checkable
class ReadableJournalStore(JournalStore, Protocol):
    """A store that also reads without taking the write lock (``SqliteUpdateStore.read``)."""

    def read(self) -> AbstractContextManager[Any]: ...


@runtime_checkable
class OneTripJournalStore(JournalStore, Protocol):
    """A store that runs one statement and its commit in one round trip (``PostgresUpdateStore``): the intent with
    its ownership check, and the outcome (whose commit need not wait for the server's disk, see
    :meth:`Journal.record_as`). ``table``: its inbox table, which names the journal's tables."""

    table: str

    def owned_statement(self, identity: Identity, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]: ...

    def one_statement(self, sql: str, params: dict[str, Any], *, flush: bool = True) -> list[tuple[Any, ...]]: ...


class CallRow(Record):
    """One journaled call as the journal keeps it (``answer``: the server's body, as text)."""

    __slots__ = (
        "answer",
        "attempt",
        "changed_at",
        "chat_id",
        "created_at",
        "fingerprint",
        "method",
        "seq",
        "state",
        "status",
        "update_id",
    )
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

    def __init__(self, update_id: int, seq: int, method: str, chat_id: int | None, fingerprint: str, state: str,
                 attempt: int, status: int | None, answer: str | None, created_at: float, changed_at: float) -> None:
        object.__setattr__(self, "update_id", update_id)
        object.__setattr__(self, "seq", seq)
        object.__setattr__(self, "method", method)
        object.__setattr__(self, "chat_id", chat_id)
        object.__setattr__(self, "fingerprint", fingerprint)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "attempt", attempt)
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "answer", answer)
        object.__setattr__(self, "created_at", created_at)
        object.__setattr__(self, "changed_at", changed_at)

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values (what ``telegram-fence calls --json`` prints)."""
        return {
            "update_id": self.update_id, "seq": self.seq, "method": self.method, "chat_id": self.chat_id,
            "state": self.state, "attempt": self.attempt, "status": self.status,
            "created_at": self.created_at, "changed_at": self.changed_at, "answer": self.answer,
        }


log = logging.getLogger("telegram_fence.calls.journal")

_COLUMNS = "update_id, seq, method, chat_id, fingerprint, state, attempt, status, answer, created_at, changed_at"

FIND = f"SELECT {_COLUMNS} FROM fence_calls WHERE update_id = :u AND seq = :s"
# The intent, unless the position is journaled already (then nothing is returned and the row is read); it returns
# when the shared pauses of the call's scope and of the whole bot end (the rate limits' read, in the same statement).
INTENT_ROW = (
    "INSERT INTO fence_calls(update_id, seq, method, chat_id, fingerprint, state, attempt, claim_id, "
    "created_at, changed_at) VALUES (:u, :s, :method, :chat, :fp, 'intent', :attempt, :claim, :now, :now) "
    "ON CONFLICT (update_id, seq) DO NOTHING RETURNING seq, (SELECT max(until) FROM fence_pauses "
    "WHERE (scope = :scope OR scope = 'bot') AND until > :now)"
)
QUEUE_ROW = (
    "INSERT INTO fence_calls(update_id, seq, method, chat_id, fingerprint, state, attempt, claim_id, request, "
    "created_at, changed_at) VALUES (:u, :s, :method, :chat, :fp, 'queued', :attempt, :claim, :request, :now, :now)"
)
# The intent as one statement that checks the claim itself (``OneTripJournalStore.owned_statement``: it reads the
# claim's row, locked, from ``fence_owner``); PostgreSQL only, so its casts name PostgreSQL's types.
INTENT_OWNED = (
    "INSERT INTO fence_calls(update_id, seq, method, chat_id, fingerprint, state, attempt, claim_id, "
    "created_at, changed_at) SELECT CAST(:u AS bigint), CAST(:s AS integer), CAST(:method AS text), "
    "CAST(:chat AS bigint), CAST(:fp AS text), 'intent', CAST(:attempt AS integer), CAST(:claim AS text), "
    "CAST(:now AS float8), CAST(:now AS float8) FROM fence_owner "
    "ON CONFLICT (update_id, seq) DO NOTHING RETURNING seq, (SELECT max(until) FROM fence_pauses "
    "WHERE (scope = CAST(:scope AS text) OR scope = 'bot') AND until > CAST(:now AS float8))"
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
PAUSES = "SELECT scope, until FROM fence_pauses WHERE until > :now"
PAUSED_UNTIL = ("SELECT max(until) FROM fence_pauses WHERE (scope = :scope OR scope = 'bot') AND until > :now")
DROP_PAUSES = "DELETE FROM fence_pauses WHERE until <= :now"
LIST = f"SELECT {_COLUMNS} FROM fence_calls"
NEW_BUCKET = ("INSERT INTO fence_buckets(scope, tokens, at) VALUES (:scope, :burst, :now) "
              "ON CONFLICT (scope) DO NOTHING")
BUCKET = "SELECT tokens, at FROM fence_buckets WHERE scope = :scope /*lock*/"
SPEND = "UPDATE fence_buckets SET tokens = :tokens, at = :now WHERE scope = :scope"

_PARAM = re.compile(r":([a-z]+)\b")
_pg_cache: dict[tuple[str, str], str] = {}


def sql_for(conn: Any, statement: str) -> str:
    """``statement`` as ``conn`` runs it: unchanged on APSW; on psycopg with ``%(name)s`` parameters and the
    journal's tables named after the store's table."""
    if is_sqlite(conn):
        return statement  # (a write transaction on SQLite is BEGIN IMMEDIATE: the /*lock*/ comment is moot)
    outbox = str(outbox_table(conn, "fence_updates_outbox"))
    return _pg_text(statement, outbox[: -len("_outbox")] if outbox.endswith("_outbox") else "fence_updates")


def _pg_text(statement: str, table: str) -> str:
    """``statement`` for psycopg (``%(name)s`` parameters), the journal's tables named after the inbox ``table``."""
    text = _pg_cache.get((statement, table))
    if text is None:
        text = _PARAM.sub(r"%(\1)s", statement).replace("/*lock*/", "FOR UPDATE")
        for name in ("calls", "pauses", "buckets"):
            text = text.replace(f"fence_{name}", f"{table}_{name}")
        _pg_cache[(statement, table)] = text
    return text


def _run(conn: Any, statement: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Run one statement and return all its rows (cursors are always exhausted)."""
    cursor = conn.execute(sql_for(conn, statement), dict(params))
    if is_sqlite(conn):
        return [tuple(row) for row in cursor]
    return [tuple(row) for row in cursor.fetchall()] if cursor.description is not None else []


def _row(values: tuple[Any, ...]) -> CallRow:
    return CallRow(*values)


def _key(identity: Identity, seq: int) -> dict[str, Any]:
    return {"u": identity.update_id, "s": seq, "claim": identity.claim_id}


class Journal:
    """The journal's reads and writes (see the module docstring); ``clock`` gives the rows' times."""

    def __init__(self, store: JournalStore, clock: Any = time.time) -> None:
        self._store = store
        self._clock = clock
        self._read: Any = store.read if isinstance(store, ReadableJournalStore) else store.write
        # PostgreSQL: the intent and the outcome in one round trip each (else a transaction of three)
        self._one_trip = store if isinstance(store, OneTripJournalStore) else None

    def _write_one(self, statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run the one statement ``statement`` in a write transaction of its own, committed as ``write()`` commits
        (on PostgreSQL waiting for the disk); its rows. On a :class:`OneTripJournalStore` that is one round trip (else
        a ``write()`` block)."""
        fast = self._one_trip
        if fast is not None:
            return fast.one_statement(_pg_text(statement, fast.table), params)
        with self._store.write() as conn:
            return _run(conn, statement, params)

    def open_call(self, identity: Identity, seq: int, method: str, chat_id: int | None,
                  digest: str, *, settled: bool = False, scope: str | None = None) -> tuple[CallRow | None, float]:
        """Write the intent of call ``seq`` and return ``(None, pause)``, or return ``(the row already journaled at
        that position, 0.0)``. ``pause``: when the shared pauses of ``scope`` (default: the call's chat's, see
        :func:`~telegram_fence.calls.limits.scope_of`) and of the whole bot end, as :meth:`paused_until`
        reads them, but in the intent's own statement (0.0: none holds it).

        Runs in the store's fenced transaction: raises :class:`~telegram_fence.errors.OwnershipLost` (and writes
        nothing) when ``identity`` no longer owns its update, so a stale attempt cannot send. An ``intent`` row
        an earlier attempt left is turned ``uncertain`` (and returned so). ``settled=True``: this attempt
        itself settled the update (``ctx.transaction(complete=True)``), so no other attempt can run it: the
        intent is written without the ownership check.
        """
        now = self._clock()
        params = {**_key(identity, seq), "method": method, "chat": chat_id, "fp": digest,
                  "attempt": identity.attempt, "now": now,
                  "scope": scope if scope is not None else ("bot" if chat_id is None else f"chat:{chat_id}")}
        fast = self._one_trip
        if fast is not None:
            if settled:
                opened = fast.one_statement(_pg_text(INTENT_ROW, fast.table), params)
            else:  # OwnershipLost when the claim is not live
                opened = fast.owned_statement(identity, _pg_text(INTENT_OWNED, fast.table), params)
            if opened:
                return None, 0.0 if opened[0][1] is None else float(opened[0][1])
            # journaled already (a retry reaches the position): read it in a transaction as below
        while True:
            with self._store.write() if settled else self._store.transaction(identity) as conn:
                opened = _run(conn, INTENT_ROW, params)
                if opened:  # the first time this position is reached: one statement
                    return None, 0.0 if opened[0][1] is None else float(opened[0][1])
                found = _run(conn, FIND, params)
                if not found:  # its intent was forgotten in between (PostgreSQL): write this one
                    continue
                row = _row(found[0])
                if row.state == INTENT:
                    _run(conn, LAPSED, params)
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
        with self._read() as conn:
            found = _run(conn, FIND, _key(identity, seq))
        return _row(found[0]) if found else None

    def record(self, identity: Identity, seq: int, state: str, status: int | None, answer: str | None) -> bool:
        """Record the outcome of call ``seq`` sent by ``identity`` onto its intent. ``False`` (nothing changed) when
        the row is not this claim's intent any more: a later attempt found it and made it ``uncertain``, and a row
        another attempt judged never changes.

        On a :class:`OneTripJournalStore` (PostgreSQL) it is one statement whose commit does not wait for the
        server's disk: the outcome is read only by a later attempt of the update, and whatever lets one run (the
        settle, a retry, a reclaim: later commits, which wait) makes it durable too, since the server flushes its
        log in order. A crash of the server before then loses it, as a crash of this process between the answer
        and this call would: the call is then ``uncertain``, never sent again.
        """
        fast = self._one_trip
        if fast is None:
            return self.record_as(identity.update_id, seq, identity.claim_id, state, status, answer)
        params = {"u": identity.update_id, "s": seq, "claim": identity.claim_id, "state": state, "status": status,
                  "answer": answer, "now": self._clock()}
        return bool(fast.one_statement(_pg_text(OUTCOME, fast.table), params, flush=False))

    def record_as(self, update_id: int, seq: int, claim_id: str, state: str, status: int | None,
                  answer: str | None) -> bool:
        """:meth:`record` for a call sent as ``claim_id`` (a queued call's sender), committed as ``write()`` commits
        (on PostgreSQL waiting for the disk: its update may be settled already, and no later commit need follow)."""
        return bool(self._write_one(OUTCOME, {"u": update_id, "s": seq, "claim": claim_id, "state": state,
                                              "status": status, "answer": answer, "now": self._clock()}))

    def forget(self, identity: Identity, seq: int) -> None:
        """Delete the intent of call ``seq``: its request certainly did nothing, a later attempt sends it."""
        self._write_one(FORGET, _key(identity, seq))

    def requeue(self, update_id: int, seq: int, claim_id: str) -> None:
        """Put a queued call that certainly was not sent back to ``queued`` (the next start sends it)."""
        self._write_one(REQUEUE, {"u": update_id, "s": seq, "claim": claim_id, "now": self._clock()})

    def queue(self, conn: Any, identity: Identity, calls: Iterable[tuple[int, str, int | None, str, str]]) -> None:
        """Write queued calls ``(seq, method, chat_id, digest, request_json)`` on ``conn`` (the caller's fenced
        transaction): they commit with its writes or not at all."""
        now = self._clock()
        for seq, method, chat_id, digest, request in calls:
            _run(conn, QUEUE_ROW, {**_key(identity, seq), "method": method, "chat": chat_id, "fp": digest,
                                   "attempt": identity.attempt, "request": request, "now": now})

    def take_queued(self, update_id: int, seq: int, claim_id: str) -> dict[str, Any] | None:
        """Turn a queued call into an intent of ``claim_id``; return its request, or ``None`` when another
        sender took it first (or it is gone)."""
        rows = self._write_one(TAKE_QUEUED, {"u": update_id, "s": seq, "claim": claim_id, "now": self._clock()})
        if not rows:
            return None
        request: dict[str, Any] = json.loads(rows[0][0])
        return request

    def queued_request(self, update_id: int, seq: int) -> dict[str, Any] | None:
        """The request of the call queued at ``(update_id, seq)`` while it is still queued, else ``None`` (a read)."""
        with self._read() as conn:
            rows = _run(conn, QUEUED_REQUEST, {"u": update_id, "s": seq})
        if not rows:
            return None
        request: dict[str, Any] = json.loads(rows[0][0])
        return request

    def in_flight(self, limit: int = 1000) -> list[CallRow]:
        """The calls in flight (``intent``: being sent now, or left by a process that stopped mid-request), by
        update and position (a read)."""
        with self._read() as conn:
            return [_row(values) for values in _run(conn, IN_FLIGHT_ROWS, {"n": limit})]

    def queued(self, limit: int = 100) -> list[tuple[int, int]]:
        """``(update_id, seq)`` of queued calls not sent yet, oldest first (a read)."""
        with self._read() as conn:
            return [(int(u), int(s)) for u, s in _run(conn, QUEUED_ROWS, {"n": limit})]

    def counts(self) -> dict[str, int]:
        """How many journaled calls are in each state (a read: it takes no write lock, see the module docstring)."""
        with self._read() as conn:
            return {str(state): int(n) for state, n in _run(conn, COUNTS, {})}

    def pause(self, scope: str, until: float) -> None:
        """Record that ``scope`` may not be sent to before ``until`` (wall clock; a later pause wins), and drop
        the pauses that are over."""
        with self._store.write() as conn:
            _run(conn, DROP_PAUSES, {"now": self._clock()})
            _run(conn, PAUSE, {"scope": scope, "until": until})

    def take_tokens(self, buckets: list[tuple[str, float, float]], now: float) -> float:
        """Take one token from each bucket ``(scope, rate per second, burst)`` in one transaction, or none.

        Returns 0 when they were taken, else the seconds until every bucket has one (nothing taken). The
        buckets are rows every process of the bot shares (locked while read, on PostgreSQL).
        """
        with self._store.write() as conn:
            delay = 0.0
            levels: list[tuple[str, float, float]] = []
            for scope, rate, burst in buckets:
                _run(conn, NEW_BUCKET, {"scope": scope, "burst": float(burst), "now": now})
                tokens, at = _run(conn, BUCKET, {"scope": scope})[0]
                # A caller that read its clock before another took a token later: the bucket's time never goes
                # back (it would refill twice for the same span).
                stamp = max(now, float(at))
                level = min(float(burst), float(tokens) + (stamp - float(at)) * rate)
                levels.append((scope, level, stamp))
                if level < 1.0:
                    delay = max(delay, (1.0 - level) / rate)
            if delay > 0:
                return delay
            for scope, level, stamp in levels:
                _run(conn, SPEND, {"scope": scope, "tokens": level - 1.0, "now": stamp})
        return 0.0

    def pauses(self, now: float) -> dict[str, float]:
        """The pauses still running at ``now``, by scope (a read)."""
        with self._read() as conn:
            rows = _run(conn, PAUSES, {"now": now})
        return {str(scope): float(until) for scope, until in rows}

    def paused_until(self, scope: str, now: float) -> float:
        """When the later of ``scope``'s pause and the whole bot's ends (a read; ``0.0``: neither is paused)."""
        with self._read() as conn:
            rows = _run(conn, PAUSED_UNTIL, {"scope": scope, "now": now})
        value = rows[0][0] if rows else None
        return 0.0 if value is None else float(value)


def list_calls(conn: Any, *, update_id: int | None = None, uncertain: bool = False,
               limit: int = 1000) -> Iterator[CallRow]:
    """Journaled calls read on ``conn`` (any connection, a read-only one included), by update and position.

    ``uncertain=True``: only the calls whose outcome is unknown, ``uncertain`` ones and ``intent`` ones (in
    flight now, or left by a process that died mid-request).
    """
    where: list[str] = []
    params: dict[str, Any] = {"n": limit}
    if update_id is not None:
        where.append("update_id = :u")
        params["u"] = update_id
    if uncertain:  # an intent is in flight now, or was left by a process that died mid-request
        where.append(f"state IN ('{UNCERTAIN}', '{INTENT}')")
    statement = LIST + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY update_id, seq LIMIT :n"
    for values in _run(conn, statement, params):
        yield _row(values)


