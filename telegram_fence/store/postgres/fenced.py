"""Operations on claims on PostgreSQL: renew, settle, retry, release, exhaust, the ownership check, the fenced
transaction and statement, the exhaustions' listing and acknowledgement, the dead owners' claims, and pruning.

``transaction(identity)`` locks the claim's row before checking it, so no reclaim can commit between the check and
the commit; every wait for a lock ends after ``lock_timeout`` with ``StoreUnavailable``.

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
from ..contract import Exhaustion, Identity
from ..owners import TAG_SEPARATOR, owner_is_dead
from ..values import check_due, check_lease, check_limit, decode, key, storable_text
from .connection import translated
from .schema import NOW
from .support import StoreSupport

__all__ = ["Fenced"]

#: Exactly this claim (``%(u)s``, ``%(a)s``, ``%(c)s``), and a live one.
_EXACT = "update_id = %(u)s AND attempt = %(a)s AND claim_id = %(c)s"
_LIVE = f"state = 1 AND due_at > {NOW}"
#: Several claims as arrays (``%(ids)s``, ``%(attempts)s``, ``%(claim_ids)s``), and the live ones among them.
_GIVEN = "unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(claim_ids)b::text[]) AS b(u, a, c)"
_GIVEN_LIVE = f"u.update_id = b.u AND u.attempt = b.a AND u.claim_id = b.c AND u.state = 1 AND u.due_at > {NOW}"


def _params(identity: Identity, **more: Any) -> dict[str, Any]:
    """``identity`` as the ``u``, ``a``, ``c`` parameters, with ``more``; :class:`TypeError` for another type."""
    update_id, attempt, claim_id = key(identity)
    return {"u": update_id, "a": attempt, "c": claim_id, **more}


def _arrays(keys: Iterable[tuple[int, int, str]], **more: Any) -> dict[str, Any]:
    """Claim keys as the ``ids``, ``attempts``, ``claim_ids`` array parameters, with ``more``."""
    keys = list(keys)
    return {"ids": [k[0] for k in keys], "attempts": [k[1] for k in keys], "claim_ids": [k[2] for k in keys], **more}


def _payload(update_id: int, text: str) -> dict[str, Any]:
    """An exhaustion's stored update; ``{"update_id": ...}`` when it nests too deep for Python to decode here."""
    update = decode(text)
    return update if isinstance(update, dict) else {"update_id": update_id}


class Fenced(StoreSupport):
    """Operations on a claim that succeed only while the claim is live, and the exhaustions they end in."""

    def _on_claim(self, where: str, sql: str, identity: Identity, **more: Any) -> bool:
        """Run ``sql`` (one statement on exactly ``identity``'s row) on its own; whether it changed one row."""
        params = _params(identity, now=self._now(), **more)
        with self._one(where) as conn, translated(where):
            return conn.execute(sql, params).rowcount == 1

    def retry_owned(self, identity: Identity, at: float, error: str) -> bool:
        """Put exactly this live claim back to pending, due at ``at``, keeping ``error``. :class:`ConfigurationError`
        for an ``at`` that is no finite time."""
        check_due(at)
        return self._on_claim("retry_owned", f"UPDATE {self.table} SET state = 0, due_at = %(at)s, error = %(error)s, "
                              f"changed_at = {NOW} WHERE {_EXACT} AND {_LIVE}", identity, at=float(at),
                              error=storable_text(error))

    def release(self, identity: Identity, *, attempt_counts: bool = True) -> bool:
        """End exactly this live claim now so any worker may claim the update at once: with ``attempt_counts`` the
        row stays claimed with an expired lease, else it is pending again with its attempt given back. ``False``
        when the claim is not live."""
        change = "" if attempt_counts else "state = 0, attempt = attempt - 1, "
        return self._on_claim("release", f"UPDATE {self.table} SET {change}due_at = {NOW}, changed_at = {NOW} "
                              f"WHERE {_EXACT} AND {_LIVE}", identity)

    def exhaust(self, identity: Identity, error: str) -> bool:
        """Turn exactly this live claim into an unacknowledged exhaustion holding ``error``."""
        return self._on_claim("exhaust", f"UPDATE {self.table} SET state = 3, acknowledged = false, "
                              f"error = %(error)s, changed_at = {NOW} WHERE {_EXACT} AND {_LIVE}", identity,
                              error=storable_text(error))

    def acknowledge_exhaustion(self, identity: Identity) -> bool:
        """Make the exhaustion with exactly this identity prunable (claim id ``""``: one the store made without a
        claim); ``False`` when there is none."""
        return self._on_claim("acknowledge_exhaustion", f"UPDATE {self.table} SET acknowledged = true, "
                              f"changed_at = {NOW} WHERE update_id = %(u)s AND attempt = %(a)s "
                              "AND coalesce(claim_id, '') = %(c)s AND state = 3 AND NOT acknowledged", identity)

    def owns(self, identity: Identity, at: float | None = None) -> bool:
        """``True`` only for exactly this claim, unexpired at ``at`` (default: now)."""
        params = _params(identity, at=at, now=self._now())
        with self._one("owns") as conn, translated("owns"):
            return conn.execute(f"SELECT 1 FROM {self.table} WHERE {_EXACT} AND state = 1 "
                                f"AND due_at > coalesce(%(at)s::float8, {NOW})", params).fetchone() is not None

    def settle_many(self, identities: Iterable[Identity]) -> int:
        """Settle several live claims in one statement; return how many were still live."""
        params = _arrays((key(i) for i in identities), now=self._now())
        if not params["ids"]:
            return 0
        with self._one("settle_many") as conn, translated("settle_many"):
            return conn.execute(f"UPDATE {self.table} AS u SET state = 2, changed_at = {NOW} FROM {_GIVEN} "
                                f"WHERE {_GIVEN_LIVE}", params).rowcount

    def renew_many(self, identities: Iterable[Identity], lease: float) -> set[Identity]:
        """Renew several claims in one statement; return the identities that were still live. A live row locked by
        another transaction (its owner's fenced transaction at work) is reported live without waiting for it."""
        check_lease(lease)
        wanted = {key(i): i for i in identities}
        if not wanted:
            return set()
        t = self.table
        with self._one("renew_many") as conn, translated("renew_many"):
            renewed = {row[0] for row in conn.execute(
                f"WITH live AS (SELECT u.update_id FROM {t} AS u JOIN {_GIVEN} ON {_GIVEN_LIVE}), "
                f"free AS (SELECT u.update_id FROM {t} AS u JOIN {_GIVEN} ON {_GIVEN_LIVE} "
                "  FOR NO KEY UPDATE OF u SKIP LOCKED), "
                f"renewed AS (UPDATE {t} AS u SET due_at = greatest(u.due_at, {NOW} + %(lease)s) "
                "  FROM free WHERE u.update_id = free.update_id RETURNING u.update_id) "
                "SELECT update_id FROM live UNION SELECT update_id FROM renewed",
                _arrays(wanted, lease=float(lease), now=self._now()))}
        return {identity for k, identity in wanted.items() if k[0] in renewed}

    def due_exhaustions(self, after: Identity | None = None, limit: int = 100) -> list[Exhaustion]:
        """Unacknowledged exhaustions in ``update_id`` order, strictly after ``after`` (a page cursor)."""
        check_limit(limit)
        params = {"after": -1 if after is None else after.update_id, "limit": limit}
        with self._one("due_exhaustions") as conn, translated("due_exhaustions"):
            rows = conn.execute(
                f"SELECT update_id, attempt, claim_id, payload, chat_id, error, changed_at FROM {self.table} "
                "WHERE state = 3 AND NOT acknowledged AND update_id > %(after)s ORDER BY update_id LIMIT %(limit)s",
                params).fetchall()
        return [Exhaustion(Identity(u, a, c or ""), _payload(u, p), chat, err or "", when)
                for u, a, c, p, chat, err, when in rows]

    def release_dead_claims(self) -> dict[str, int]:
        """End now every live claim whose owner tag names a process of this host that is gone (its attempt counts),
        so a restart claims those updates at once. Returns how many claims of each dead owner were released."""
        t = self.table
        with self._tx("release_dead_claims") as conn, translated("release_dead_claims"):
            owners = [row[0] for row in conn.execute(
                f"SELECT DISTINCT split_part(claim_id, %(sep)s, 1) FROM {t} WHERE {_LIVE} "
                "AND strpos(claim_id, %(sep)s) > 1", {"sep": TAG_SEPARATOR, "now": self._now()})]
            released: dict[str, int] = {}
            for tag in filter(owner_is_dead, owners):
                count = conn.execute(
                    f"UPDATE {t} SET due_at = {NOW}, changed_at = {NOW} WHERE {_LIVE} "
                    "AND left(claim_id, %(n)s) = %(prefix)s",
                    {"n": len(tag) + 1, "prefix": tag + TAG_SEPARATOR, "now": self._now()}).rowcount
                if count:
                    released[tag] = count
        return released

    def prune(self, settled_before: float) -> int:
        """Delete settled and skipped rows, and acknowledged exhaustions, last changed before ``settled_before``;
        never one Telegram may still deliver again (the cursor has not passed it and it was recorded less than
        :data:`~telegram_fence.updates.REDELIVERY_WINDOW` ago)."""
        t = self.table
        with self._one("prune") as conn, translated("prune"):
            return conn.execute(
                f"DELETE FROM {t} WHERE state >= 2 AND changed_at < %(before)s "
                "AND (state IN (2, 4) OR (state = 3 AND acknowledged)) "
                f"AND NOT (update_id >= coalesce((SELECT value FROM {t}_meta WHERE key = 'cursor'), 0) "
                f"AND recorded_at > {NOW} - %(window)s)",
                {"before": settled_before, "window": REDELIVERY_WINDOW, "now": self._now()}).rowcount

    def owned_statement(self, identity: Identity, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run the one data-modifying statement ``sql`` (``%(name)s`` placeholders, a ``RETURNING`` list) only while
        ``identity`` owns its update, checked (the claim's row locked first), written and committed together, in a
        transaction of its own (or a savepoint of the thread's open one). ``sql`` sees the CTE ``fence_owner`` (one
        row while the claim is live, none otherwise) and must write only rows it selects from it.

        Returns the rows ``sql`` returned. Raises :class:`OwnershipLost` (nothing written) when the claim is not
        live, and :class:`StoreError` subclasses for the database's failures.
        """
        owner = self._lock_owned.replace("%(", "%(owner_")
        statement = (f"WITH fence_owner AS MATERIALIZED ({owner}), fence_body AS ({sql}) "
                     "SELECT o.n, b.* FROM (SELECT count(*) AS n FROM fence_owner) AS o "
                     "LEFT JOIN (SELECT true AS fence_row, * FROM fence_body) AS b ON true")
        full = {**params, **{f"owner_{k}": v for k, v in _params(identity, now=self._now()).items()}}
        with self._one("owned_statement") as conn, translated("owned_statement"):
            rows = conn.cursor(row_factory=tuple_row).execute(statement, full).fetchall()
        if not rows or not rows[0][0]:
            raise OwnershipLost(identity, "expired, reclaimed, settled or pruned")
        return [tuple(row[2:]) for row in rows if row[1] is not None]

    @property
    def _lock_owned(self) -> str:
        """Lock the row of exactly this live claim (waiting for another transaction's lock at most ``lock_timeout``)."""
        return f"SELECT 1 FROM {self.table} WHERE {_EXACT} AND {_LIVE} FOR NO KEY UPDATE"

    @contextmanager
    def transaction(self, identity: Identity, complete: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A transaction that commits only while ``identity`` owns its update; yields the psycopg connection.

        The claim's row is locked and then checked, so no reclaim can commit before this transaction ends. When
        ownership is gone it rolls back and raises :class:`OwnershipLost` before the block runs. With
        ``complete=True`` the update is settled in the same transaction. An exception from the block rolls
        everything back and propagates; a failed commit raises ``StoreUnavailable``.
        """
        params = _params(identity)
        with self._tx("transaction") as conn:
            with translated("transaction"):
                row = conn.execute(self._lock_owned, {**params, "now": self._now()}).fetchone()
            if row is None:
                raise OwnershipLost(identity, "expired, reclaimed, settled or pruned")
            yield conn
            if complete:
                with translated("transaction"):
                    conn.execute(f"UPDATE {self.table} SET state = 2, changed_at = {NOW} WHERE {_EXACT} AND state = 1",
                                 {**params, "now": self._now()})
