"""One statement in one round trip, inside the thread's open transaction (as a savepoint) or in one of its own:
the scripts of ``PostgresUpdateStore``'s record and settle (a base class of :class:`~.record_trip.RecordTrip` and
:class:`~.claims.Claims`).

The statement is prepared once per session (:mod:`.prepared`) and sent with its transaction's ends as one simple
query, run on its generic plan (planning it again on every call would cost more than it takes):
``BEGIN; SET LOCAL plan_cache_mode ...; EXECUTE ...; COMMIT``, or, inside the thread's transaction, the same between
``SAVEPOINT`` and ``RELEASE`` with the plan setting put back as it was before the release (the application's
statements in that transaction keep their own). Its arguments are written into the script as literals
(:func:`~.prepared.literal`): texts the caller builds cheaply (array literals, one JSON text) rather than arrays
psycopg would adapt.

May import psycopg, the standard library and its siblings. Thread safety: as :class:`~.support.StoreSupport`.
"""

from __future__ import annotations

from typing import Any

import psycopg

from .prepared import run_script
from .support import StoreSupport

__all__ = ["Trips"]

#: The savepoint of a one-trip statement inside the thread's open transaction.
SAVEPOINT = "telegram_fence_trip"
_KEEP_PLAN_MODE = ("SELECT set_config('telegram_fence.plan_cache_mode', current_setting('plan_cache_mode'), true), "
                   "set_config('plan_cache_mode', 'force_generic_plan', true)")
_RESTORE_PLAN_MODE = "SELECT set_config('plan_cache_mode', current_setting('telegram_fence.plan_cache_mode'), true)"


class Trips(StoreSupport):
    """Statements sent in one round trip with their transaction (or savepoint)."""

    def _in_one_trip(self, where: str, sql: str, params: dict[str, Any]) -> list[Any]:
        """Run ``sql`` (``%(name)s`` placeholders; a statement that returns rows) with ``params`` in one round
        trip: a savepoint of the thread's open transaction, or a transaction of its own on a pooled connection; its
        rows. Raises psycopg's exceptions (the caller translates them; nothing of the statement stays) and
        :class:`StoreUnavailable` when no connection can be had (``where`` names the caller)."""
        conn = self._conns.current()
        if conn is not None:
            return self._send(conn, [sql], params)
        with self._one(where) as conn:
            return self._send(conn, [sql], params)

    def _send(self, conn: psycopg.Connection[Any], parts: list[str], params: dict[str, Any]) -> list[Any]:
        """Run ``parts`` (prepared statements, the last returning rows) as one script on ``conn``: in a savepoint of
        its open transaction, or in a transaction of its own; the rows of the last part. Undoes the script and raises
        psycopg's exceptions when it fails."""
        nested = conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

        def frame(calls: list[str]) -> list[str]:
            if nested:
                return [f"SAVEPOINT {SAVEPOINT}", _KEEP_PLAN_MODE, *calls, _RESTORE_PLAN_MODE,
                        f"RELEASE SAVEPOINT {SAVEPOINT}"]
            return ["BEGIN", "SET LOCAL plan_cache_mode = force_generic_plan", *calls, "COMMIT"]

        results = run_script(conn, self._conns.prepared, parts, params, SAVEPOINT if nested else None, frame)
        rows = [r.rows for r in results if r.rows is not None]
        return rows[1] if nested else rows[0]  # (nested: after the plan setting's row)
