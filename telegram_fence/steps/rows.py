"""Durable steps' rows in the store: one per (update, step name), ``fence_step_results`` (PostgreSQL:
``{table}_step_results`` beside the inbox table).

A row's ``state``: ``intent`` (the step's function was called and has not returned, or the process died while it
ran), ``done`` (``result`` holds its JSON result), ``failed`` (``result`` holds a final exception as JSON),
``uncertain`` (a later attempt found the intent: nobody knows whether the work happened). Statements are written
for SQLite (``:name`` parameters) and adapted once for psycopg; on PostgreSQL the first reach's intent and the
outcome are one round trip each (the ownership check in the same statement).

May import ``store`` (types, table names), ``records`` and the standard library. Thread safety: the functions hold
no state; each runs on the caller's thread's connection of the store.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from ..records import Record
from ..store import Identity
from ..store.tables import is_sqlite, outbox_table

__all__ = ["DONE", "FAILED", "INTENT", "UNCERTAIN", "OneTripStepStore", "StepRow", "StepStore", "counts", "finish",
           "forget", "list_steps", "open_step"]

INTENT, DONE, FAILED, UNCERTAIN = "intent", "done", "failed", "uncertain"


class StepStore(Protocol):
    """What steps need of a store: the fenced transaction and a plain write transaction."""

    def transaction(self, identity: Identity, complete: bool = False) -> AbstractContextManager[Any]: ...

    def write(self, *, durable: bool = False) -> AbstractContextManager[Any]: ...


@runtime_checkable
class OneTripStepStore(StepStore, Protocol):
    """A store that runs one statement with its ownership check and its commit in one round trip
    (``PostgresUpdateStore``); ``table``: its inbox table, which names the steps' table."""

    table: str

    def owned_statement(self, identity: Identity, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]: ...

    def read(self) -> AbstractContextManager[Any]: ...


class StepRow(Record):
    """One step as the store keeps it (``result``: JSON text, or ``None`` while no outcome is recorded)."""

    __slots__ = ("attempt", "changed_at", "claim_id", "created_at", "name", "result", "runs", "state", "update_id")
    update_id: int
    name: str
    state: str
    attempt: int
    claim_id: str | None
    runs: int
    result: str | None
    created_at: float
    changed_at: float

    def __init__(self, update_id: int, name: str, state: str, attempt: int, claim_id: str | None, runs: int,
                 result: str | None, created_at: float, changed_at: float) -> None:
        object.__setattr__(self, "update_id", update_id)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "attempt", attempt)
        object.__setattr__(self, "claim_id", claim_id)
        object.__setattr__(self, "runs", runs)
        object.__setattr__(self, "result", result)
        object.__setattr__(self, "created_at", created_at)
        object.__setattr__(self, "changed_at", changed_at)

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values (what ``telegram-fence steps --json`` prints; the claim id left out)."""
        return {"update_id": self.update_id, "name": self.name, "state": self.state, "attempt": self.attempt,
                "runs": self.runs, "result": self.result, "created_at": self.created_at,
                "changed_at": self.changed_at}


_COLUMNS = "update_id, name, state, attempt, claim_id, runs, result, created_at, changed_at"

OPEN = ("INSERT INTO fence_step_results(update_id, name, state, attempt, claim_id, created_at, changed_at) "
        "VALUES (:u, :name, 'intent', :attempt, :claim, :now, :now) ON CONFLICT (update_id, name) DO NOTHING "
        "RETURNING runs")
FIND = f"SELECT {_COLUMNS} FROM fence_step_results WHERE update_id = :u AND name = :name"
# An intent an earlier attempt left: nobody knows whether the step's work happened.
LAPSED = ("UPDATE fence_step_results SET state = 'uncertain', changed_at = :now "
          "WHERE update_id = :u AND name = :name AND state = 'intent'")
# A step declared safe to repeat takes the intent over: only this claim may record its outcome from now on.
TAKE_OVER = ("UPDATE fence_step_results SET state = 'intent', attempt = :attempt, claim_id = :claim, "
             "runs = runs + 1, changed_at = :now "
             "WHERE update_id = :u AND name = :name AND state IN ('intent', 'uncertain')")
FINISH = ("UPDATE fence_step_results SET state = :state, result = :result, changed_at = :now "
          "WHERE update_id = :u AND name = :name AND claim_id = :claim AND state = 'intent' RETURNING runs")
FORGET = ("DELETE FROM fence_step_results "
          "WHERE update_id = :u AND name = :name AND claim_id = :claim AND state = 'intent'")
# The intent and the outcome as one statement each that checks the claim itself (``owned_statement``: the claim's
# row, locked, as ``fence_owner``); PostgreSQL only, so the casts name PostgreSQL's types.
OPEN_OWNED = ("INSERT INTO fence_step_results(update_id, name, state, attempt, claim_id, created_at, changed_at) "
              "SELECT CAST(:u AS bigint), CAST(:name AS text), 'intent', CAST(:attempt AS integer), "
              "CAST(:claim AS text), CAST(:now AS float8), CAST(:now AS float8) FROM fence_owner "
              "ON CONFLICT (update_id, name) DO NOTHING RETURNING runs")
FINISH_OWNED = ("UPDATE fence_step_results SET state = CAST(:state AS text), result = CAST(:result AS text), "
                "changed_at = CAST(:now AS float8) FROM fence_owner "
                "WHERE update_id = CAST(:u AS bigint) AND name = CAST(:name AS text) "
                "AND claim_id = CAST(:claim AS text) AND state = 'intent' RETURNING fence_step_results.runs")
COUNTS = "SELECT state, count(*) FROM fence_step_results GROUP BY state"
LIST = f"SELECT {_COLUMNS} FROM fence_step_results"

_PARAM = re.compile(r":([a-z]+)\b")
_pg_cache: dict[tuple[str, str], str] = {}


def sql_for(conn: Any, statement: str) -> str:
    """``statement`` as ``conn`` runs it: unchanged on APSW; on psycopg with ``%(name)s`` parameters and the table
    named after the store's inbox table."""
    if is_sqlite(conn):
        return statement
    outbox = str(outbox_table(conn, "fence_updates_outbox"))
    return _pg_text(statement, outbox[: -len("_outbox")] if outbox.endswith("_outbox") else "fence_updates")


def _pg_text(statement: str, table: str) -> str:
    """``statement`` for psycopg (``%(name)s`` parameters), the steps' table named after the inbox ``table``."""
    text = _pg_cache.get((statement, table))
    if text is None:
        text = _PARAM.sub(r"%(\1)s", statement).replace("fence_step_results", f"{table}_step_results")
        _pg_cache[(statement, table)] = text
    return text


def run(conn: Any, statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run one statement on ``conn`` and return all its rows."""
    cursor = conn.execute(sql_for(conn, statement), params)
    if is_sqlite(conn):
        return [tuple(row) for row in cursor]
    return [tuple(row) for row in cursor.fetchall()] if cursor.description is not None else []


def _key(identity: Identity, name: str) -> dict[str, Any]:
    return {"u": identity.update_id, "name": name, "claim": identity.claim_id, "attempt": identity.attempt}


def open_step(store: StepStore, identity: Identity, name: str, now: float, *,
              take_over: bool) -> tuple[StepRow | None, bool]:
    """Record the intent of step ``name`` for ``identity``'s update and return ``(None, repeated)``, or return
    ``(the row an earlier attempt recorded, False)``.

    Runs in the store's fenced transaction: raises :class:`~telegram_fence.errors.OwnershipLost` (nothing written)
    when ``identity`` no longer owns its update. An ``intent`` row is returned as ``uncertain`` (and so recorded);
    with ``take_over`` an ``intent`` or ``uncertain`` row becomes this attempt's intent instead (``(None, True)``:
    the caller runs the step again).
    """
    params = {**_key(identity, name), "now": now}
    if isinstance(store, OneTripStepStore):
        # The first reach in one round trip (OwnershipLost when not live). A step recorded already (a retry reaches
        # it) whose outcome is known is read in one more; an intent left by another attempt is settled below.
        if store.owned_statement(identity, _pg_text(OPEN_OWNED, store.table), params):
            return None, False
        with store.read() as conn:
            found = run(conn, FIND, params)
        if found and found[0][2] in (DONE, FAILED):
            return StepRow(*found[0]), False
    with store.transaction(identity) as conn:
        if run(conn, OPEN, params):
            return None, False
        row = StepRow(*run(conn, FIND, params)[0])
        if row.state in (INTENT, UNCERTAIN) and take_over:
            run(conn, TAKE_OVER, params)
            return None, True
        if row.state == INTENT:
            run(conn, LAPSED, params)
            row = row._replace(state=UNCERTAIN, changed_at=now)
        return row, False


def finish(store: StepStore, identity: Identity, name: str, state: str, result: str, now: float) -> bool:
    """Record the outcome (``done`` or ``failed``, with its JSON text) of the intent ``identity`` holds for step
    ``name``, in the store's fenced transaction. Raises :class:`~telegram_fence.errors.OwnershipLost` (nothing
    written) when ``identity`` no longer owns its update; ``False`` when the intent is not this attempt's (a later
    attempt took it over)."""
    params = {**_key(identity, name), "state": state, "result": result, "now": now}
    if isinstance(store, OneTripStepStore):
        return bool(store.owned_statement(identity, _pg_text(FINISH_OWNED, store.table), params))
    with store.transaction(identity) as conn:
        return bool(run(conn, FINISH, params))


def forget(store: StepStore, identity: Identity, name: str) -> None:
    """Delete the intent ``identity`` holds for step ``name``: its function raised, so the next attempt calls it
    again. Fenced: raises :class:`~telegram_fence.errors.OwnershipLost` (the intent stays, so the next attempt meets
    the step as uncertain) when ``identity`` no longer owns its update, since what the function did before it
    raised is then nobody's to declare undone."""
    with store.transaction(identity) as conn:
        run(conn, FORGET, _key(identity, name))


def counts(conn: Any) -> dict[str, int]:
    """How many steps are recorded in each state, read on ``conn``."""
    return {str(state): int(n) for state, n in run(conn, COUNTS, {})}


def list_steps(conn: Any, *, update_id: int | None = None, uncertain: bool = False,
               limit: int = 1000) -> Iterator[StepRow]:
    """Recorded steps read on ``conn`` (any connection, a read-only one included), by update and name.

    ``uncertain=True``: only the steps whose outcome is unknown: ``uncertain`` ones and ``intent`` ones (running
    now, or left by a process that died while the step ran).
    """
    where: list[str] = []
    params: dict[str, Any] = {"n": limit}
    if update_id is not None:
        where.append("update_id = :u")
        params["u"] = update_id
    if uncertain:
        where.append(f"state IN ('{UNCERTAIN}', '{INTENT}')")
    statement = LIST + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY update_id, name LIMIT :n"
    for values in run(conn, statement, params):
        yield StepRow(*values)
