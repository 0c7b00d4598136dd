"""Releasing the claims of processes known to be gone, on PostgreSQL (see :mod:`telegram_fence.store.owners`).

May import psycopg (through :mod:`.connection`), the standard library and :mod:`telegram_fence.store`. Thread
safety: as :class:`~.support.StoreSupport`.
"""

from __future__ import annotations

from ..owners import TAG_SEPARATOR, owner_is_dead
from .connection import translated
from .schema import NOW
from .support import StoreSupport

__all__ = ["Owners"]


class Owners(StoreSupport):
    """The live claims of dead processes, released."""

    def release_dead_claims(self) -> dict[str, int]:
        """End now every live claim whose owner tag names a process of this host that is gone (its attempt counts,
        as when a lease runs out), so a restart claims those updates at once. Returns how many claims of each dead
        owner were released (none of another host, nor of a live process)."""
        t = self._sql.table
        live = f"state = 1 AND due_at > {NOW}"
        with self._tx("release_dead_claims") as conn, translated("release_dead_claims"):
            owners = [row[0] for row in conn.execute(
                f"SELECT DISTINCT split_part(claim_id, %(sep)s, 1) FROM {t} WHERE {live} "
                "AND strpos(claim_id, %(sep)s) > 1", {"sep": TAG_SEPARATOR, "now": self._now()})]
            released: dict[str, int] = {}
            for tag in owners:
                if owner_is_dead(tag):
                    count = conn.execute(
                        f"UPDATE {t} SET due_at = {NOW}, changed_at = {NOW} WHERE {live} "
                        "AND left(claim_id, %(n)s) = %(prefix)s",
                        {"n": len(tag) + 1, "prefix": tag + TAG_SEPARATOR, "now": self._now()}).rowcount
                    if count:
                        released[tag] = count
        return released
