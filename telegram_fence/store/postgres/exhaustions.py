"""Exhaustions on PostgreSQL: turning a claim into a terminal failure, listing the unacknowledged ones,
acknowledging.

May import psycopg (through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`,
the contract types of :mod:`telegram_fence.store` and its siblings. Thread safety: as
:class:`~.support.StoreSupport`.
"""

from __future__ import annotations

import json

from ...errors import ConfigurationError
from ..contract import Exhaustion, Identity
from .connection import translated
from .support import StoreSupport
from .values import identity_params

__all__ = ["Exhaustions"]


class Exhaustions(StoreSupport):
    """Terminal failures: made from a live claim, listed in pages, acknowledged (then prunable)."""

    def exhaust(self, identity: Identity, error: str) -> bool:
        """Turn exactly this live claim into an unacknowledged exhaustion holding ``error``."""
        self._require_fenced("exhaust")
        with self._tx("exhaust") as conn, translated("exhaust"):
            return conn.execute(self._sql.exhaust_owned, {**identity_params(identity), "error": str(error),
                                                          "now": self._now()}).rowcount == 1

    def due_exhaustions(self, after: Identity | None = None, limit: int = 100) -> list[Exhaustion]:
        """Unacknowledged exhaustions in ``update_id`` order, strictly after ``after`` (a page cursor)."""
        self._require_fenced("due_exhaustions")
        if limit < 1:
            raise ConfigurationError(f"limit={limit!r} must be at least 1")
        start = -1 if after is None else after.update_id
        with self._tx("due_exhaustions") as conn, translated("due_exhaustions"):
            rows = conn.execute(self._sql.due_exhaustions, {"after": start, "limit": limit}).fetchall()
        return [
            Exhaustion(Identity(u, a, c or ""), json.loads(p), chat, err or "", when)
            for u, a, c, p, chat, err, when in rows
        ]

    def acknowledge_exhaustion(self, identity: Identity) -> bool:
        """Make the exhaustion with exactly this identity prunable; ``False`` when there is none."""
        self._require_fenced("acknowledge_exhaustion")
        with self._tx("acknowledge_exhaustion") as conn, translated("acknowledge_exhaustion"):
            return conn.execute(self._sql.acknowledge, {**identity_params(identity), "now": self._now()}).rowcount == 1
