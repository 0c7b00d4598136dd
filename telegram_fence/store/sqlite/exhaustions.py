"""Exhaustions: turning a claim into a terminal failure, listing the unacknowledged ones, acknowledging.

May import ``errors``, ``store`` (the contract) and its siblings. Thread safety: as
:class:`~.connection.StoreBase`.
"""

from __future__ import annotations

from typing import Any, cast

from ..contract import Exhaustion, Identity
from ..values import check_limit, decode, key, storable_text
from . import sql
from .connection import StoreBase

__all__ = ["Exhaustions"]


class Exhaustions(StoreBase):
    """The durable level: terminal failures that survive restarts until acknowledged."""

    def exhaust(self, identity: Identity, error: str) -> bool:
        """Turn exactly this live claim into an unacknowledged exhaustion holding ``error``."""
        now = self.clock()
        with self._write(self._record_sync) as conn:
            conn.execute(sql.EXHAUST_OWNED, (storable_text(error), now, *key(identity), now))
            return conn.changes() == 1

    def due_exhaustions(self, after: Identity | None = None, limit: int = 100) -> list[Exhaustion]:
        """Unacknowledged exhaustions in ``update_id`` order, strictly after ``after`` (a page cursor).

        An update whose payload nests too deep for Python to decode is listed as ``{"update_id": ...}``.
        """
        check_limit(limit)
        start = -1 if after is None else after.update_id
        with self._read() as conn:
            rows = cast(
                "list[tuple[int, int, str | None, str, int | None, str | None, float]]",
                conn.execute(sql.DUE_EXHAUSTIONS, (start, limit)).fetchall(),
            )
        # A payload too deep for Python to decode is listed as {"update_id": ...}: the list never fails.
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
