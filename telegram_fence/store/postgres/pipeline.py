"""The split round of ``PostgresUpdateStore`` (:class:`~telegram_fence.store.pipeline.PipelinedUpdateStore`): one
script, ``BEGIN; settle; record (claiming); backlog and cursor; the chats conversing; COMMIT``, sent without waiting,
its answer read later.

While the server works on the script (its statements, the commit's WAL flush), the caller's thread is free: the
dispatcher runs the handlers of claims committed before. The script is sent and read through psycopg's own
non-blocking generators (``send`` and ``fetch_many``, waited on with ``Connection.wait``) on a connection of the
store's own pool that the round keeps until :meth:`Pending.result`; the statements are the prepared ones of the
synchronous paths (:func:`~.round_sql.settled_count`, :func:`~.record_sql.record_statement`), called with their
arguments as literals (:mod:`.prepared`). When the session lost its prepared statements, or the server cannot read
the ``getUpdates`` answer the payloads were to come from, the round is made again at once, synchronously (the same
statements; the encoded payloads).

May import psycopg (through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`,
:mod:`telegram_fence.updates`, the contract of :mod:`telegram_fence.store` and its siblings. Thread safety: a
:class:`Pending` belongs to the thread that began it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg.errors
import psycopg.generators
import psycopg.pq

from ...errors import ConfigurationError, LeadershipLost
from ...updates import UnreadableUpdate
from ..contract import Identity
from ..pipeline import RoundOutcome
from ..values import check_lease, check_offset, key, repeated_in_batch, validate
from .connection import translate
from .prepared import RETRY, run_script, undo_script
from .record_trip import UNREADABLE
from .recording import Recording, encoded, first_places, placed, text_of
from .round_sql import settled_count

__all__ = ["Pending", "Pipelined"]

log = logging.getLogger("telegram_fence.store.postgres.pipeline")

_BEGIN = ("BEGIN", "SET LOCAL plan_cache_mode = force_generic_plan")
_OK = (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK)


def _frame(calls: list[str]) -> list[str]:
    return [*_BEGIN, *calls, "COMMIT"]


def _typed(result: psycopg.pq.abc.PGresult, row: int) -> tuple[Any, ...]:
    """Row ``row`` of a script's result in text format as Python values: the settle's count (one ``int8``), the
    backlog and the cursor (two ``int8``, the cursor maybe ``NULL``), or a record row (``int4``, ``int8``, ``text``,
    ``float8``, each maybe ``NULL``)."""
    values = [result.get_value(row, column) for column in range(result.nfields)]
    if len(values) == 1:
        return (int(values[0] or 0),)
    if len(values) == 2:
        return int(values[0] or 0), None if values[1] is None else int(values[1])
    kind, update_id, claim_id, until = values
    return (int(kind or 0), None if update_id is None else int(update_id),
            None if claim_id is None else claim_id.decode(), None if until is None else float(until))


class Pending:
    """A round in flight on its own connection (see the module docstring)."""

    def __init__(self, store: Pipelined, lent: AbstractContextManager[psycopg.Connection[Any]],
                 conn: psycopg.Connection[Any], parts: list[str], params: dict[str, Any], round_: _Round,
                 carried: bool) -> None:
        """``carried``: the script sent carried ``PREPARE``s (a failure puts the session's memory in doubt)."""
        self._store = store
        self._carried = carried
        self._lent = lent
        self._conn = conn
        self._parts = parts
        self._params = params
        self._round = round_
        self._done = False

    def result(self) -> RoundOutcome:
        """See :meth:`~telegram_fence.store.pipeline.PendingRound.result`."""
        if self._done:
            raise RuntimeError("a round's result is read once")
        self._done = True
        failed: BaseException | None = None
        try:
            try:
                rows = self._read()
            except (*RETRY, *UNREADABLE) as exc:
                rows = self._again(exc)
            outcome = self._store._outcome(self._round, rows)
        except psycopg.Error as exc:
            failed = exc
            raise translate(exc, "round") from exc
        except BaseException as exc:
            failed = exc
            raise
        finally:
            exc_info = (type(failed), failed, failed.__traceback__) if failed is not None else (None, None, None)
            self._lent.__exit__(*exc_info)
        return outcome

    def _read(self) -> list[list[Any]]:
        """The answer of the script sent: each result's rows, the settle's count first (when it settles). Undoes
        the transaction and raises psycopg's exception when a statement failed."""
        conn = self._conn
        pgconn = conn.pgconn
        try:
            with conn.lock:
                results = conn.wait(psycopg.generators.fetch_many(pgconn))
        except BaseException:
            self._failed()
            raise
        rows: list[list[Any]] = []
        for result in results:
            if result.status not in _OK:
                error = psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
                self._failed()
                raise error
            if result.status == psycopg.pq.ExecStatus.TUPLES_OK:
                rows.append([_typed(result, r) for r in range(result.ntuples)])
        self._store._conns.prepared.held(conn, self._parts)
        return rows

    def _failed(self) -> None:
        """The script failed: undo it; a ``PREPARE`` it carried may stay in the session (it is not transactional), so
        what the session holds is learnt again before its next script (see :mod:`.prepared`)."""
        if self._carried:
            self._store._conns.prepared.doubt(self._conn)
        undo_script(self._conn, None)

    def _again(self, exc: BaseException) -> list[list[Any]]:
        """The round made again synchronously after ``exc`` (nothing of the script stayed): once the session's
        prepared statements are known again (:data:`RETRY`), or with the encoded payloads when the server could not
        read the answer's body (:data:`UNREADABLE`)."""
        store, conn, round_ = self._store, self._conn, self._round
        if isinstance(exc, RETRY):
            store._conns.prepared.forget(conn)
        elif round_.body is None:
            raise exc
        else:
            again = store._encoded_round(round_)
            if again is None:  # an update that cannot be stored as it is: the synchronous record keeps it
                raise exc
            self._round = again
            self._parts, self._params = store._script(again)
        results = run_script(conn, store._conns.prepared, self._parts, self._params, None, _frame)
        return [r.rows for r in results if r.rows is not None]


@dataclass
class _Round:
    """What a round was asked to do (kept for reading its answer and for the synchronous retry)."""

    settle: list[tuple[int, int, str]]
    updates: Sequence[Mapping[str, Any]]
    ids: list[int]
    order: list[int]
    skip: set[int]
    next_offset: int
    generation: int | None
    repeated: list[int]
    claim: tuple[float, int, int]
    held: list[str]
    body: str | None
    conversations: bool = False
    batch: dict[str, list[Any]] = field(default_factory=dict)


class Pipelined(Recording):
    """The split round (a base class of :class:`~.store.PostgresUpdateStore`)."""

    def begin_round(
        self,
        settle: Iterable[Identity],
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        *,
        lease: float,
        limit: int,
        run: int = 1,
        held: Collection[Identity] = (),
        skip: Collection[int] = (),
        generation: int | None = None,
        body: bytes | str | None = None,
        conversations: bool = False,
    ) -> Pending | None:
        """See :meth:`~telegram_fence.store.pipeline.PipelinedUpdateStore.begin_round`. ``None`` (go the synchronous
        way) for an empty batch, an update that cannot be stored as it is, and whenever the one-trip record could not
        be used (a leadership acquired and lost: the synchronous record raises ``LeadershipLost``)."""
        self._require_fenced("begin_round")
        check_lease(lease)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"limit={limit!r} must be a non-negative integer")
        ids = validate(updates)
        check_offset(next_offset)
        leadership = self._leadership
        if not ids or (leadership is not None and leadership.acquired_once and not leadership.held):
            return None
        if any(isinstance(u, UnreadableUpdate) for u in updates):
            return None
        order = first_places(ids)
        skipped = set(skip)
        answer = text_of(body) if body is not None else None
        round_ = _Round(settle=[key(identity) for identity in settle], updates=updates, ids=ids, order=order,
                        skip=skipped, next_offset=next_offset, generation=generation,
                        repeated=repeated_in_batch(updates, ids), claim=(float(lease), limit, max(1, run)),
                        held=[identity.claim_id for identity in held], body=answer, conversations=conversations)
        if answer is not None:
            round_.batch = placed(updates, ids, order, skipped)
        elif self._encoded_round(round_) is None:
            return None
        parts, params = self._script(round_)
        lent = self._conns.alone("round")
        if lent is None:
            return None
        conn = lent.__enter__()
        try:
            prepare, calls = self._conns.prepared.script(conn, parts, params)
            text = "; ".join(_frame([*([prepare] if prepare else []), *calls]))
            with conn.lock:
                conn.pgconn.send_query(text.encode())
                conn.wait(psycopg.generators.send(conn.pgconn))
        except BaseException as exc:
            self._conns.prepared.doubt(conn)  # (a PREPARE may have been sent)
            undo_script(conn, None)
            lent.__exit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, psycopg.Error):
                raise translate(exc, "round") from exc
            raise
        return Pending(self, lent, conn, parts, params, round_, bool(prepare))

    def _encoded_round(self, round_: _Round) -> _Round | None:
        """``round_`` with its payloads encoded (not taken from the answer's body); ``None`` when an update cannot
        be stored as it is."""
        batch, poisoned = encoded(round_.updates, round_.ids, round_.order, round_.skip)
        if poisoned:
            return None
        round_.batch, round_.body = batch, None
        return round_

    def _script(self, round_: _Round) -> tuple[list[str], dict[str, Any]]:
        """The round's statements (the settle when it settles, the record, the backlog and the cursor for the
        poller) and their arguments."""
        sql, params = self._record_script(round_.batch, round_.next_offset, round_.generation, len(round_.repeated),
                                          round_.claim, round_.body, round_.held)
        reads = [self._sql.backlog_and_cursor, *([self._sql.conversing] if round_.conversations else [])]
        if not round_.settle:
            return [sql, *reads], params
        params["settle"] = json.dumps(round_.settle)
        return [settled_count(self._sql), sql, *reads], params

    def _outcome(self, round_: _Round, rows: list[list[Any]]) -> RoundOutcome:
        """What the committed round's ``rows`` say (its settle's count, then the record's rows as text, then the
        backlog and the cursor)."""
        settled = 0
        if round_.settle:
            settled = int(rows[0][0][0])
            rows = rows[1:]
        record, (counts,) = rows[0], rows[1]
        conversing = frozenset(int(row[0]) for row in rows[2]) if round_.conversations else None
        updates = [round_.updates[i] for i in round_.order]
        try:
            trip = self._read_record(record, round_.batch, updates)
        except LeadershipLost as exc:
            return RoundOutcome(settled, 0, [], refused=exc)  # the settle committed; the batch was not stored
        if trip is None:  # ids stored before: the record from the answer refused them; record the encoded payloads
            lease, limit, run = round_.claim
            new, claims = self.record_and_claim(round_.updates, round_.next_offset, lease=lease, limit=limit, run=run,
                                                skip=round_.skip, generation=round_.generation)
            return RoundOutcome(settled, new, claims)  # (counted before this record: not carried)
        self._warn_conflicts(trip.differing + list(round_.repeated))
        backlog, cursor = counts
        return RoundOutcome(settled, len(trip.new), trip.claims, backlog=int(backlog),
                            cursor=None if cursor is None else int(cursor), conversing=conversing)
