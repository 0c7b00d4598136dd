"""Operations on claims: renew, settle, retry, release, exhaust (one or many), the ownership check, the fenced
transaction, and the exhaustions' listing and acknowledgement.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import apsw

from ...errors import OwnershipLost
from ..contract import Exhaustion, Identity
from ..values import check_due, check_lease, check_limit, decode, identities_json, key, storable_text
from . import sql
from .connection import StoreBase, first

__all__ = ["Fenced"]


class Fenced(StoreBase):
    """What the holder of a claim may do with it (every method matches the claim's full identity), and the
    exhaustions."""

    def renew_many(self, identities: Iterable[Identity], lease: float) -> set[Identity]:
        """Renew several claims in one transaction; return exactly the identities that were still live
        (matched on update, attempt and claim id)."""
        check_lease(lease)
        wanted = {key(identity): identity for identity in identities}
        if not wanted:
            return set()
        now = self.clock()
        ids = identities_json(wanted.values())
        with self._write(self._work_sync) as conn:
            rows = conn.execute(sql.RENEW_MANY, {"until": now + lease, "now": now, "ids": ids})
            renewed = {(update_id, attempt, claim_id) for update_id, attempt, claim_id in rows}
        # Matched on all three fields: a stale identity of the same update is not the live one.
        return {identity for three, identity in wanted.items() if three in renewed}

    def owns(self, identity: Identity, at: float | None = None) -> bool:
        """``True`` only for exactly this claim, unexpired at ``at`` (default: now)."""
        when = self.clock() if at is None else at
        with self._write(self._work_sync) as conn:
            return first(conn.execute(sql.OWNS, (*key(identity), when))) is not None

    def settle_many(self, identities: Iterable[Identity]) -> int:
        """Settle several live claims in one transaction; return how many were still live."""
        ids = identities_json(identities)
        if ids == "[]":
            return 0
        now = self.clock()
        with self._write(self._work_sync) as conn:
            conn.execute(sql.SETTLE_MANY, {"now": now, "ids": ids})
            return conn.changes()

    def retry_owned(self, identity: Identity, at: float, error: str) -> bool:
        """Put exactly this live claim back to pending, due at ``at``, keeping ``error``; ``False`` when it is not
        live. :class:`ConfigurationError` for an ``at`` that is no finite time."""
        check_due(at)
        now = self.clock()
        with self._write(self._work_sync) as conn:
            conn.execute(sql.RETRY_OWNED, (at, storable_text(error), now, *key(identity), now))
            return conn.changes() == 1

    @contextmanager
    def transaction(self, identity: Identity, complete: bool = False) -> Iterator[apsw.Connection]:
        """A write transaction yielding the APSW connection that commits only while ``identity`` owns its update
        (else :class:`OwnershipLost`, before the block runs); ``complete=True`` settles the update in it."""
        with self._write(self._work_sync, own=False) as conn:
            now = self.clock()
            with self._statements():
                owned = first(conn.execute(sql.OWNS, (*key(identity), now))) is not None
            if not owned:
                raise OwnershipLost(identity, "expired, reclaimed, settled or pruned")
            yield conn
            if complete:
                with self._statements():
                    conn.execute(sql.SETTLE_OWNED, (now, *key(identity), now))

    def release(self, identity: Identity, *, attempt_counts: bool = True) -> bool:
        """End exactly this live claim now (``attempt_counts=False``: back to pending, the attempt given back);
        ``False`` when it is not live."""
        now = self.clock()
        statement = sql.RELEASE_LEASE if attempt_counts else sql.UNCLAIM
        with self._write(self._work_sync) as conn:
            conn.execute(statement, (now, now, *key(identity), now))
            return conn.changes() == 1

    def exhaust(self, identity: Identity, error: str) -> bool:
        """Turn exactly this live claim into an unacknowledged exhaustion holding ``error``."""
        now = self.clock()
        with self._write(self._record_sync) as conn:
            conn.execute(sql.EXHAUST_OWNED, (storable_text(error), now, *key(identity), now))
            return conn.changes() == 1

    def due_exhaustions(self, after: Identity | None = None, limit: int = 100) -> list[Exhaustion]:
        """Unacknowledged exhaustions in ``update_id`` order, strictly after ``after``; a payload too deep for
        Python to decode is listed as ``{"update_id": ...}``, so the list never fails."""
        check_limit(limit)
        start = -1 if after is None else after.update_id
        with self._read() as conn:
            rows: list[Any] = conn.execute(sql.DUE_EXHAUSTIONS, (start, limit)).fetchall()
        return [
            Exhaustion(Identity(u, a, c or ""), _decoded(p, u), chat, err or "", when)
            for u, a, c, p, chat, err, when in rows
        ]

    def acknowledge_exhaustion(self, identity: Identity) -> bool:
        """Make the exhaustion with exactly this identity prunable; ``False`` when there is none."""
        now = self.clock()
        with self._write(self._record_sync) as conn:
            conn.execute(sql.ACKNOWLEDGE, (now, *key(identity)))
            return conn.changes() == 1


def _decoded(payload: str, update_id: int) -> Any:
    decoded = decode(payload)
    return {"update_id": update_id} if decoded is None else decoded
