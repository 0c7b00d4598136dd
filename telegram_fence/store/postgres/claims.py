"""Claiming on PostgreSQL: ``exchange`` (settle and claim in one round, one transaction), and the exhaustion of
updates whose attempts are spent, found while claiming.

A round (:func:`~.round_sql.round_parts`) locks its candidate rows ``FOR UPDATE SKIP LOCKED`` (racing claimers never
wait for, nor take, each other's rows), tries an advisory lock per chat and claims on a snapshot taken after those
locks: two hosts never hold one chat. A claim that finds every due row held by other claimers waits for one of them
to commit (for its chat lock, bounded by ``lock_timeout``) and looks again, instead of answering "nothing is due".

May import psycopg (through :mod:`.connection`), the standard library, the contract types and values of
:mod:`telegram_fence.store` and its siblings. Thread safety: as :class:`~.support.StoreSupport`.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import psycopg

from ..contract import Claim, Identity
from ..values import TOO_DEEP_TO_DECODE, check_claim, check_limit, decode, key, lapsed_reason, new_claim_ids
from .connection import translated
from .round_sql import contended, round_parts, settled_count
from .schema import NOW
from .support import StoreSupport

__all__ = ["MAX_ROUND_CLAIMS", "NO_FLUSH_WAIT", "Claims"]

log = logging.getLogger("telegram_fence.store.postgres.claims")

#: Rows a round locks beyond its limit: spares for candidates whose chat another claimer holds. Kept small, because
#: every row a claimer locks is one its rivals pass over until it commits.
SPARE = 4
#: How many times one claim waits for another claimer's commit before it answers with what it has.
_WAITS = 16
#: A round of its own that settles nothing commits without waiting for the WAL flush. A server crash can undo such a
#: commit (within about three ``wal_writer_delay``): the update is pending again and its handler may run again (at
#: least once holds, as after a lost lease). Nothing durable can depend on an undone claim: the WAL is flushed in
#: order, so any later durable commit flushes the claim first. (The fsync wait was half a claim-and-settle cycle's.)
NO_FLUSH_WAIT = "SET LOCAL synchronous_commit = off"
#: The most claims one round takes (its claim ids are made before the server knows how many rows are due); a caller
#: asking for more gets at most this many and ``more``.
MAX_ROUND_CLAIMS = 1000
#: ``max_attempts`` when none is given: no attempt count reaches it.
_NO_LIMIT = 2**62


def _ints(values: Collection[int]) -> str:
    """Integers as the text of a PostgreSQL array literal."""
    return "{" + ",".join(str(int(v)) for v in values) + "}"


@functools.lru_cache(maxsize=16)
def _reason(spent: int) -> str:
    """The lapse reason for ``max_attempts`` = ``spent`` with ``{attempt}`` for the server to fill in."""
    return lapsed_reason(-1, spent).replace("-1", "{attempt}", 1)


class Claims(StoreSupport):
    """Claims of due updates, one per chat at a time (across hosts), in ``update_id`` order."""

    def exchange(
        self,
        settle: Iterable[Identity],
        lease: float,
        limit: int,
        *,
        max_attempts: int | None = None,
        known: Mapping[int, Mapping[str, Any]] | None = None,
        chats: Collection[int] | None = None,
        chatless: Collection[int] = (),
    ) -> tuple[int, list[Claim], bool]:
        """Settle ``settle`` and claim up to ``limit`` due updates in one transaction.

        Returns ``(how many were still live and got settled, the claims, more)``; ``more`` is ``False`` when nothing
        claimable was left out. With ``chats`` (and ``chatless`` update ids) only the next update of each of those
        chats (and those updates) are candidates, one index probe per chat.
        """
        check_limit(limit, 0)
        keys = [key(identity) for identity in settle]
        if limit <= 0 or (chats is not None and not chats and not chatless):
            if not keys:
                return 0, [], False
            with self._one("exchange") as conn, translated("exchange"):
                (count,) = conn.execute(settled_count(self.table),
                                        {"now": self._now(), "settle": json.dumps(keys)}).fetchall()[0]
                return int(count), [], False
        check_claim(lease, max_attempts)
        options: dict[str, Any] = {"max_attempts": max_attempts, "known": known, "chats": chats,
                                   "chatless": chatless}
        with translated("exchange"):
            settled, claims, more, waiting = self._round(keys, lease, limit, **options)
            waits = 0
            # (never inside the thread's transaction: it may hold chat locks of its own)
            while waiting and waits < _WAITS and self._current() is None and self._wait_for_a_claimer(limit):
                waits += 1
                _, claims, more, waiting = self._round([], lease, limit, **options)
        return settled, claims, more

    def _round(
        self,
        settle: list[tuple[int, int, str]],
        lease: float,
        limit: int,
        *,
        max_attempts: int | None,
        known: Mapping[int, Mapping[str, Any]] | None,
        chats: Collection[int] | None,
        chatless: Collection[int],
    ) -> tuple[int, list[Claim], bool, bool]:
        """Settle ``settle`` and claim up to ``limit`` (at most :data:`MAX_ROUND_CLAIMS`) in one transaction (a
        savepoint of the thread's open one): ``(settled, claims, more, waiting)``, ``waiting`` when nothing was
        claimed while other claimers may hold what is due. Raises psycopg's exceptions; nothing is stored then."""
        limit = min(limit, MAX_ROUND_CLAIMS)
        hinted = chats is not None
        scan = (len(chats) + len(chatless) + 1) if chats is not None else limit + SPARE
        spent = _NO_LIMIT if max_attempts is None else max_attempts
        params = {
            "now": self._now(), "settle": json.dumps(settle), "lease": float(lease), "limit": limit, "run": 1,
            "scan": scan, "window": scan * 8 + 64, "ns": self._chat_ns, "chats": _ints(chats or ()),
            "chatless": _ints(chatless), "max_attempts": spent, "reason": _reason(spent), "known": _ints(known or ()),
            "claim_ids": json.dumps(new_claim_ids(limit)),
        }
        *steps, last = round_parts(self.table, settle=bool(settle), hinted=hinted)
        with self._joined("exchange") as conn:
            nested = conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE
            # Pipeline mode: the statements go out together and are answered together (their begin with them, the
            # commit on its own); each still runs on its own snapshot.
            with conn.pipeline(), conn.transaction():  # (a savepoint in the thread's transaction: its durability)
                if not nested and not settle:
                    conn.execute(NO_FLUSH_WAIT)
                done = [conn.execute(sql, params) for sql in steps]
                rows = conn.execute(last, params).fetchall()
            settled = max(0, done[0].rowcount) if settle else 0
            claims, undecodable, lapsed = [], [], 0
            candidates = busy = picked = 0
            for kind, update_id, chat_id, attempt, claim_id, until, payload in sorted(rows, key=lambda r: r[:2]):
                if kind == 2:
                    candidates, busy, picked = int(update_id), int(chat_id), int(attempt)
                elif kind == 1:
                    lapsed += 1
                    log.error("update exhausted: attempts spent", extra={"update_id": update_id})
                else:
                    update = known.get(update_id) if known is not None and payload is None else None
                    if update is None:
                        update = decode(payload)
                        if update is None:  # too deep for Python's reader here: an exhaustion, as on every backend
                            undecodable.append(update_id)
                            continue
                    claims.append(Claim(Identity(update_id, attempt, claim_id), update, chat_id, until))
            if undecodable:
                conn.execute(f"UPDATE {self.table} SET state = 3, acknowledged = false, changed_at = {NOW}, "
                             "error = %(reason)s, payload = '{\"update_id\":' || update_id || '}' "
                             "WHERE update_id = ANY(%(ids)s::bigint[]) AND state = 1",
                             {"ids": undecodable, "reason": TOO_DEEP_TO_DECODE, "now": self._now()})
                for update_id in undecodable:
                    log.error("update cannot be decoded; kept as an exhaustion without its payload",
                              extra={"update_id": update_id})
            if undecodable or lapsed:
                self._found_exhaustion()
        more = picked >= limit or candidates >= scan or bool(lapsed) or busy > 0 or len(claims) < picked
        return settled, claims, more, not hinted and picked == 0 and not lapsed

    def _wait_for_a_claimer(self, limit: int) -> bool:
        """When a claim found nothing to take, wait until the claimer holding the first due row commits and return
        ``True`` (look again); ``False`` when nothing is due. The wait is for that row's chat lock (held by its
        claimer until it commits), taken at session level and let go in the same statement: this claim holds no
        lock while it waits, so no wait can close a cycle. Bounded by ``lock_timeout``."""
        window = (min(limit, MAX_ROUND_CLAIMS) + SPARE) * 8 + 64
        with self._one("exchange") as conn:
            row = conn.execute(contended(self.table), {"now": self._now(), "window": window}).fetchone()
            if row is not None and row[1] is not None:
                conn.execute("SELECT pg_advisory_lock(%(ns)s::integer, hashint8(%(chat)s::bigint)), "
                             "pg_advisory_unlock(%(ns)s::integer, hashint8(%(chat)s::bigint))",
                             {"ns": self._chat_ns, "chat": row[1]})
        return row is not None
