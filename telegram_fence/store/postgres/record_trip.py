"""Recording a batch on PostgreSQL in one statement (:func:`~.record_sql.record_statement`): the fast path of
``record`` and ``record_and_claim``, inside the thread's open transaction (the dispatcher's round) or on its own.

May import psycopg
(through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`, the contract types of
:mod:`telegram_fence.store` and its siblings. Thread safety: as :class:`~.support.StoreSupport`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import psycopg
import psycopg.errors

from ...errors import LeadershipLost
from ..contract import Claim, Identity
from ..values import new_claim_ids
from .record_sql import record_statement
from .support import PENDING, StoreSupport

__all__ = ["UNREADABLE", "RecordTrip", "Trip"]

#: What the server answers for an answer it cannot read as JSON of the expected shape (not JSON to it, such as an
#: escaped lone surrogate; nested deeper than its stack allows; ``result`` not an array; an ``update_id`` that is
#: not an integer).
UNREADABLE = (psycopg.DataError, psycopg.errors.StatementTooComplex)  # (SQLSTATE class 22; 54001)


class Trip(NamedTuple):
    """What the one-trip record stored: the new ids, the claims (in ``update_id`` order), the ids stored before
    with another payload."""

    new: set[int]
    claims: list[Claim]
    differing: list[int]


def _literal(values: Sequence[int | None]) -> str:
    """Integers (``None``: ``NULL``) as the text of a PostgreSQL array literal (no escaping needed)."""
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def _texts(values: Sequence[str]) -> str:
    """Texts as a PostgreSQL array literal (each element double-quoted, its backslashes and quotes escaped)."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


class RecordTrip(StoreSupport):
    """The one-trip record (a base class of :class:`~.recording.Recording`)."""

    def _record_trip(
        self,
        batch: dict[str, list[Any]],
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        generation: int | None,
        repeated: int,
        claim: tuple[float, int, int] | None,
        body: str | None = None,
    ) -> Trip | None:
        """Store ``batch`` (the rows of ``updates``: ``updates[i]`` is row ``i``), raise the cursor, count ``repeated``
        more payload conflicts and mark ``generation``'s progress, claiming some new rows when ``claim`` (lease,
        limit, run) says so, in one statement on the thread's transaction (as a savepoint) or one of its own.

        With ``body`` (the ``result`` array of the ``getUpdates`` answer ``updates`` came from, see
        :func:`~.recording.text_of`; ``batch["positions"]``: each row's 1-based
        place in it) the payloads are the answer's own texts, and ``None`` means nothing was stored: the server
        could not read the answer, or it does not hold the batch's ids at those places, or an id was stored before
        (its payload is compared with an encoded one); the caller then records ``batch`` with encoded payloads.

        Raises :class:`LeadershipLost` when this store's leadership was acquired once and its epoch is no longer
        the database's (nothing stored), and psycopg's exceptions (the caller translates them; nothing stored)."""
        sql, params = self._record_script(batch, next_offset, generation, repeated, claim, body)
        try:
            rows = self._rows("record", sql, params)
        except UNREADABLE:
            if body is None:
                raise
            return None  # the server did not take the answer as JSON of that shape (nothing of it was stored)
        return self._read_record(rows, batch, updates)

    def _record_script(
        self,
        batch: dict[str, list[Any]],
        next_offset: int,
        generation: int | None,
        repeated: int,
        claim: tuple[float, int, int] | None,
        body: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """The one-trip record's statement (:func:`~.record_sql.record_statement`) and its arguments (see
        :meth:`_record_trip`)."""
        leadership = self._leadership
        guarded = leadership is not None and leadership.acquired_once
        lease, limit, run = claim if claim is not None else (0.0, 0, 1)
        if limit:
            limit = min(limit, sum(1 for state in batch["states"] if state == PENDING))
        params = {
            "ids": _literal(batch["ids"]), "chats": _literal(batch["chats"]), "states": _literal(batch["states"]),
            "now": self._now(), "lease": float(lease),
            "limit": limit, "run": max(1, run), "claim_ids": "{" + ",".join(new_claim_ids(limit)) + "}",
            "repeated": repeated,
            "offset": next_offset, "generation": generation,
            "stamp": self._stamp() if generation is not None else None,
            "epoch": leadership.epoch if guarded and leadership is not None else None,
        }
        if body is None:
            params["payloads"] = _texts(batch["payloads"])
        else:
            params["body"], params["positions"] = body, _literal(batch["positions"])
        statement = record_statement(self.table, guarded=guarded, generations=self._support, from_body=body is not None)
        return statement, params

    def _read_record(self, rows: list[Any], batch: dict[str, list[Any]],
                     updates: Sequence[Mapping[str, Any]]) -> Trip | None:
        """What the one-trip record's ``rows`` say (see :meth:`_record_trip`): ``None`` when a record from the
        answer's body refused it. Raises :class:`LeadershipLost` when the statement found another epoch."""
        leadership = self._leadership
        guarded = leadership is not None and leadership.acquired_once
        new: set[int] = set()
        claimed: list[tuple[int, str, float]] = []
        differing: list[int] = []
        found: Any = None
        refused = 0
        for kind, update_id, claim_id, until in rows:
            if kind == 0:
                new.add(update_id)
                if claim_id is not None:
                    claimed.append((update_id, claim_id, until))
            elif kind == 1:
                differing.append(update_id)
            elif kind == 2:
                found = update_id
            else:
                refused = int(update_id)
        if guarded and leadership is not None and found != leadership.epoch:
            raise LeadershipLost(leadership.epoch, found)  # the statement wrote nothing
        if refused:
            return None  # the statement wrote nothing
        claims: list[Claim] = []
        if claimed:
            where = {update_id: index for index, update_id in enumerate(batch["ids"])}
            for update_id, claim_id, until in sorted(claimed):
                index = where[update_id]
                claims.append(Claim(Identity(update_id, 1, claim_id), updates[index], batch["chats"][index], until))
        return Trip(new, claims, differing)
