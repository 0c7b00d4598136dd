"""Recording a batch on PostgreSQL in one round trip (:func:`~.record_sql.record_statement`): the fast path of
``record`` and ``record_and_claim``, inside the thread's open transaction (the dispatcher's round) or on its own.

Sent as one script of prepared statements (:mod:`.trips`). May import psycopg
(through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`, the contract types of
:mod:`telegram_fence.store` and its siblings. Thread safety: as :class:`~.support.StoreSupport`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ...errors import LeadershipLost
from ..contract import Claim, Identity
from ..values import new_claim_ids
from .record_sql import record_statement
from .support import PENDING
from .trips import Trips

__all__ = ["RecordTrip", "Trip"]


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


class RecordTrip(Trips):
    """The one-trip record (a base class of :class:`~.recording.Recording`)."""

    def _record_trip(
        self,
        batch: dict[str, list[Any]],
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        generation: int | None,
        repeated: int,
        claim: tuple[float, int, int] | None,
    ) -> Trip:
        """Store ``batch`` (the rows of ``updates``, in order), raise the cursor, count ``repeated`` more payload
        conflicts and mark ``generation``'s progress, claiming some new rows when ``claim`` (lease, limit, run)
        says so, in one round trip on the thread's transaction (as a savepoint) or one of its own.

        Raises :class:`LeadershipLost` when this store's leadership was acquired once and its epoch is no longer
        the database's (nothing stored), and psycopg's exceptions (the caller translates them; nothing stored)."""
        leadership = self._leadership
        guarded = leadership is not None and leadership.acquired_once
        lease, limit, run = claim if claim is not None else (0.0, 0, 1)
        if limit:
            limit = min(limit, sum(1 for state in batch["states"] if state == PENDING))
        params = {
            "ids": _literal(batch["ids"]), "chats": _literal(batch["chats"]), "states": _literal(batch["states"]),
            "payloads": _texts(batch["payloads"]), "now": self._now(), "lease": float(lease),
            "limit": limit, "run": max(1, run), "claim_ids": json.dumps(new_claim_ids(limit)), "repeated": repeated,
            "offset": next_offset, "generation": generation,
            "stamp": self._stamp() if generation is not None else None,
            "epoch": leadership.epoch if guarded and leadership is not None else None,
        }
        rows = self._in_one_trip("record", record_statement(self.table, guarded=guarded, generations=self._support),
                                 params)
        new: set[int] = set()
        claimed: list[tuple[int, str, float]] = []
        differing: list[int] = []
        found: Any = None
        for kind, update_id, claim_id, until in rows:
            if kind == 0:
                new.add(update_id)
                if claim_id is not None:
                    claimed.append((update_id, claim_id, until))
            elif kind == 1:
                differing.append(update_id)
            else:
                found = update_id
        if guarded and leadership is not None and found != leadership.epoch:
            raise LeadershipLost(leadership.epoch, found)  # the statement wrote nothing
        claims: list[Claim] = []
        if claimed:
            where = {update_id: index for index, update_id in enumerate(batch["ids"])}
            for update_id, claim_id, until in sorted(claimed):
                index = where[update_id]
                claims.append(Claim(Identity(update_id, 1, claim_id), updates[index], batch["chats"][index], until))
        return Trip(new, claims, differing)
