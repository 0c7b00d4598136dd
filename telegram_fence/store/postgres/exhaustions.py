"""Exhaustions on PostgreSQL: turning a claim into a terminal failure, listing the unacknowledged ones,
acknowledging.

May import psycopg (through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`,
the contract types of :mod:`telegram_fence.store` and its siblings. Thread safety: as
:class:`~.support.StoreSupport`.
"""

from __future__ import annotations

from typing import Any

from ..contract import Exhaustion, Identity
from ..values import check_limit, decode, storable_text
from .connection import translated
from .support import StoreSupport
from .values import identity_params

__all__ = ["Exhaustions"]


class Exhaustions(StoreSupport):
    """Terminal failures: made from a live claim, listed in pages, acknowledged (then prunable)."""

    def exhaust(self, identity: Identity, error: str) -> bool:
        """Turn exactly this live claim into an unacknowledged exhaustion holding ``error``."""
        self._require_fenced("exhaust")
        with self._one("exhaust") as conn, translated("exhaust"):
            return conn.execute(self._sql.exhaust_owned, {**identity_params(identity), "error": storable_text(error),
                                                          "now": self._now()}).rowcount == 1

    def due_exhaustions(self, after: Identity | None = None, limit: int = 100) -> list[Exhaustion]:
        """Unacknowledged exhaustions in ``update_id`` order, strictly after ``after`` (a page cursor)."""
        self._require_fenced("due_exhaustions")
        check_limit(limit)
        start = -1 if after is None else after.update_id
        with self._one("due_exhaustions") as conn, translated("due_exhaustions"):
            rows = conn.execute(self._sql.due_exhaustions, {"after": start, "limit": limit}).fetchall()
        return [
            Exhaustion(Identity(u, a, c or ""), _payload(u, p), chat, err or "", when)
            for u, a, c, p, chat, err, when in rows
        ]

    def acknowledge_exhaustion(self, identity: Identity) -> bool:
        """Make the exhaustion with exactly this identity prunable; ``False`` when there is none."""
        self._require_fenced("acknowledge_exhaustion")
        with self._one("acknowledge_exhaustion") as conn, translated("acknowledge_exhaustion"):
            return conn.execute(self._sql.acknowledge, {**identity_params(identity), "now": self._now()}).rowcount == 1


def _payload(update_id: int, text: str) -> dict[str, Any]:
    """An exhaustion's stored update; ``{"update_id": ...}`` when it nests too deep for Python to decode
    here (the exhaustion is listed all the same, with its own error)."""
    update = decode(text)
    return update if isinstance(update, dict) else {"update_id": update_id}
