"""Fenced operations on one claim on PostgreSQL: renew, settle, retry, the ownership check and the fenced
transaction (plus the base level's step-matched renew and settle, the batched settle, and pruning).

``transaction(identity)`` locks the claim's row before checking it, so no reclaim can commit between
the check and the commit; every wait for a lock ends after ``lock_timeout`` with ``StoreUnavailable``.

May import psycopg (through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`,
:mod:`telegram_fence.updates`, the contract types of :mod:`telegram_fence.store` and its siblings. Thread safety: as
:class:`~.support.StoreSupport`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from ...errors import OwnershipLost
from ...updates import REDELIVERY_WINDOW
from ..contract import Identity
from ..values import check_due, check_lease, storable_text
from .connection import translated
from .support import StoreSupport
from .values import identity_arrays, identity_params

__all__ = ["Fenced"]


class Fenced(StoreSupport):
    """Operations on a claim that succeed only while the claim is live."""

    def prune(self, settled_before: float) -> int:
        """Delete settled and skipped rows, and acknowledged exhaustions, last changed before ``settled_before``;
        never one Telegram may still deliver again (the cursor has not passed it and it was recorded less than
        :data:`~telegram_fence.updates.REDELIVERY_WINDOW` ago)."""
        with self._one("prune") as conn, translated("prune"):
            return conn.execute(self._sql.prune, {"before": settled_before, "window": REDELIVERY_WINDOW,
                                                  "now": self._now()}).rowcount

    def renew_owned(self, identity: Identity, lease: float) -> bool:
        """Extend exactly this live claim to at least now + ``lease``; never shortens it. Raises
        :class:`ConfigurationError` for a ``lease`` that is no positive finite number (PostgreSQL kept a NaN lease
        as never ending: a claim whose worker died was never taken again)."""
        self._require_fenced("renew_owned")
        check_lease(lease)
        with self._one("renew_owned") as conn, translated("renew_owned"):
            return conn.execute(self._sql.renew_owned, {**identity_params(identity), "lease": lease,
                                                        "now": self._now()}).rowcount == 1

    def owns(self, identity: Identity, at: float | None = None) -> bool:
        """``True`` only for exactly this claim, unexpired at ``at`` (default: now)."""
        self._require_fenced("owns")
        with self._one("owns") as conn, translated("owns"):
            row = conn.execute(self._sql.owns, {**identity_params(identity), "at": at, "now": self._now()}).fetchone()
        return row is not None

    def settle_owned(self, identity: Identity) -> bool:
        """Mark exactly this live claim handled; ``False`` (nothing changed) when it is not live."""
        self._require_fenced("settle_owned")
        with self._one("settle_owned") as conn, translated("settle_owned"):
            return conn.execute(self._sql.settle_owned, {**identity_params(identity), "now": self._now()}).rowcount == 1

    def settle_many(self, identities: Iterable[Identity]) -> int:
        """Settle several live claims in one statement; return how many were still live."""
        self._require_fenced("settle_many")
        keys = identity_arrays(identities)
        if not keys["ids"]:
            return 0
        with self._one("settle_many") as conn, translated("settle_many"):
            return conn.execute(self._sql.settle_many, {**keys, "now": self._now()}).rowcount

    def retry_owned(self, identity: Identity, at: float, error: str) -> bool:
        """Put exactly this live claim back to pending, due at ``at``, keeping ``error``. Raises
        :class:`ConfigurationError` for an ``at`` that is no finite time
        (:func:`~telegram_fence.store.values.check_due`)."""
        self._require_fenced("retry_owned")
        check_due(at)
        with self._one("retry_owned") as conn, translated("retry_owned"):
            params = {**identity_params(identity), "at": float(at), "error": storable_text(error), "now": self._now()}
            return conn.execute(self._sql.retry_owned, params).rowcount == 1

    def owned_statement(self, identity: Identity, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run the one data-modifying statement ``sql`` (``%(name)s`` placeholders, a ``RETURNING`` list) only while
        ``identity`` owns its update, in one statement: checked, written and committed together, as
        :meth:`transaction` would (the claim's row locked before it is checked), in a transaction of its own (or a
        savepoint of the thread's open one). ``sql`` sees the CTE ``fence_owner`` (one row while the claim is live,
        none otherwise) and must write only rows it selects from it (``INSERT ... SELECT ... FROM fence_owner``).

        Returns the rows ``sql`` returned. Raises :class:`OwnershipLost` (nothing written) when the claim is not
        live, and :class:`StoreError` subclasses for the database's failures.
        """
        self._require_fenced("owned_statement")
        statement = self._owned_sql.get(sql)
        if statement is None:
            statement = self._owned_sql[sql] = (
                f"WITH {self._sql.owned_with}, fence_body AS ({sql}) "
                "SELECT o.n, b.* FROM (SELECT count(*) AS n FROM fence_owner) AS o "
                "LEFT JOIN (SELECT true AS fence_row, * FROM fence_body) AS b ON true"
            )
        full = {**params, **{f"owner_{k}": v for k, v in identity_params(identity).items()}, "owner_now": self._now()}
        with self._one("owned_statement") as conn, translated("owned_statement"):
            rows = conn.cursor(row_factory=tuple_row).execute(statement, full).fetchall()
        if not rows or not rows[0][0]:
            raise OwnershipLost(identity, "expired, reclaimed, settled or pruned")
        return [tuple(row[2:]) for row in rows if row[1] is not None]

    @contextmanager
    def transaction(self, identity: Identity, complete: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A transaction that commits only while ``identity`` owns its update; yields the psycopg connection.

        The claim's row is locked (``FOR NO KEY UPDATE``, waiting at most ``lock_timeout``) and then
        checked, so no reclaim can commit before this transaction ends. When ownership is gone the
        transaction is rolled back and :class:`OwnershipLost` is raised before the block runs. With
        ``complete=True`` the update is settled in the same transaction. An exception from the block
        rolls everything back and propagates; a failed commit raises ``StoreUnavailable``.
        """
        self._require_fenced("transaction")
        key = identity_params(identity)
        with self._tx("transaction") as conn:
            with translated("transaction"):
                row = conn.execute(self._sql.lock_owned, {**key, "now": self._now()}).fetchone()
            if row is None:
                raise OwnershipLost(identity, "expired, reclaimed, settled or pruned")
            yield conn
            if complete:
                with translated("transaction"):
                    conn.execute(self._sql.settle_locked, {**key, "now": self._now()})
