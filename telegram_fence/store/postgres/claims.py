"""Claiming on PostgreSQL: ``exchange`` (settle and claim in one transaction), and the exhaustion of updates
whose attempts are spent, found while claiming.

Candidate rows are locked ``FOR UPDATE SKIP LOCKED`` inside the limited scan (the limit counts rows this
claimer locked, so concurrent claimers take disjoint rows), then a transaction-scoped advisory lock is
taken per chat and the chat checked again on a snapshot taken after it: two hosts never hold one chat.
A claim that finds every due row held by other claimers waits for one of them to commit (for its chat
lock, bounded by ``lock_timeout``) and looks again, instead of answering "nothing is due".

May import psycopg (through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`,
the contract types of :mod:`telegram_fence.store` and its siblings. Thread safety: as
:class:`~.support.StoreSupport`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import psycopg

from ..contract import Claim, Identity
from ..values import check_claim, check_limit, decode, key, lapsed_reason, new_claim_ids
from .connection import translated
from .round_sql import settled_count
from .rounds import SPARE, RoundResult, Rounds

__all__ = ["Claims"]

log = logging.getLogger("telegram_fence.store.postgres.claims")

#: Rows a claim locks beyond its limit: spares for candidates whose chat another claimer holds. Kept small,
#: because every row a claimer locks is one its rivals pass over until it commits.
_SPARE = SPARE
#: How many times one claim waits for another claimer's commit before it answers with what it has. Each
#: wait ends when some claimer commits, so the claims around it make progress meanwhile.
_WAITS = 16


class Claims(Rounds):
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
        run: int = 1,
    ) -> tuple[int, list[Claim], bool]:
        """Settle ``settle`` and claim up to ``limit`` due updates in ONE transaction.

        Returns ``(how many were still live and got settled, the claims, more)``; ``more`` is ``False``
        when nothing claimable was left out. With ``chats`` (and ``chatless`` update ids) only the next
        update of each of those chats (and those updates) are candidates: the same rules, one index probe
        per chat instead of a scan of the backlog; with ``chats`` and ``run`` > 1 a chat yields up to ``run``
        consecutive due updates at once, for a caller that runs them one after another in ``update_id``
        order (never side by side).

        One round (:mod:`.rounds`) unless every due row was held by other claimers (then it waits for one of
        them, see :meth:`_claim_in`).
        """
        self._require_fenced("exchange")
        check_limit(limit, 0)
        identities = list(settle)
        keys = [key(identity) for identity in identities]
        if limit <= 0 or (chats is not None and not chats and not chatless):
            if not keys:
                return 0, [], False
            with translated("exchange"):  # the settle alone, its identities as one JSON text
                rows = self._rows("exchange", settled_count(self._sql),
                                         {"now": self._now(), "settle": json.dumps(keys)})
            return int(rows[0][0]), [], False
        self._check_claim(lease, max_attempts)
        with translated("exchange"):
            done = self._round("exchange", keys, lease, limit, max_attempts=max_attempts, known=known,
                              chats=chats, chatless=chatless, run=run)
        if not done.waiting:
            return done.settled, done.claims, done.more
        with self._tx("exchange") as conn, translated("exchange"):
            claims, more = self._claim_in(conn, lease, limit, max_attempts, (), known, chats, chatless)
        return done.settled, claims, more

    def _check_claim(self, lease: float, max_attempts: int | None) -> None:
        check_claim(lease, max_attempts)

    def _round(self, where: str, keys: list[tuple[int, int, str]], lease: float, limit: int,
              **options: Any) -> RoundResult:
        """:meth:`~.rounds.Rounds._round_on` in the thread's open transaction, or in one of its own."""
        conn = self._conns.current()
        if conn is not None:
            return self._round_on(conn, keys, lease, limit, **options)
        with self._one(where) as conn:
            return self._round_on(conn, keys, lease, limit, **options)

    def _claim_in(
        self,
        conn: psycopg.Connection[Any],
        lease: float,
        limit: int,
        max_attempts: int | None,
        exclude_chats: Collection[int],
        known: Mapping[int, Mapping[str, Any]] | None,
        chats: Collection[int] | None = None,
        chatless: Collection[int] = (),
    ) -> tuple[list[Claim], bool]:
        """The claims, and whether more may be claimable (the limit or the scan window cut them off)."""
        check_claim(lease, max_attempts)
        now = self._now()
        scan = limit + _SPARE
        if chats is None:
            candidates = self._scan(conn, now, scan)
        else:
            candidates = []
            if chats:
                heads = {"now": now, "chats": list(chats), "ns": self._chat_ns, "scan": len(chats)}
                candidates += conn.execute(self._sql.chat_heads, heads).fetchall()
            if chatless:
                candidates += conn.execute(self._sql.chatless, {"now": now, "ids": list(chatless)}).fetchall()
            candidates.sort()
            scan = len(candidates) + 1  # every candidate of the hinted chats was seen
        picked, lapsed, busy = _pick(candidates, limit, max_attempts, exclude_chats)
        waits = 0
        while chats is None and not picked and not lapsed and waits < _WAITS:
            if not self._wait_for_a_claimer(conn, now, scan, candidates):
                break
            waits += 1
            candidates = self._scan(conn, now, scan)
            picked, lapsed, busy = _pick(candidates, limit, max_attempts, exclude_chats)
        if lapsed:
            conn.execute(self._sql.exhaust_lapsed, {
                "now": now, "ids": [u for u, _ in lapsed], "reasons": [r for _, r in lapsed],
            })
            for update_id, _reason in lapsed:
                log.error("update exhausted: attempts spent", extra={"update_id": update_id})
            self._found_exhaustion(conn)
        more = len(picked) >= limit or len(candidates) >= scan or bool(lapsed) or busy
        if not picked:
            return [], more
        with_payload = known is None or any(u not in known for u, _ in picked)
        rows = conn.execute(self._sql.take, {
            "now": now, "lease": float(lease), "ids": [u for u, _ in picked],
            "claim_ids": new_claim_ids(len(picked)), "with_payload": with_payload,
        }).fetchall()
        claims = []
        undecodable = []
        for update_id, chat_id, attempt, claim_id, until, payload in sorted(rows):
            update = known.get(update_id) if known is not None else None
            if update is None:
                update = decode(payload)
                if update is None:  # too deep for Python's reader here: an exhaustion, as on every backend
                    undecodable.append(update_id)
                    continue
            claims.append(Claim(Identity(update_id, attempt, claim_id), update, chat_id, until))
        if undecodable:
            self._exhaust_undecodable(conn, undecodable, now)
        if len(rows) < len(picked):
            more = True
        return claims, more

    def _scan(self, conn: psycopg.Connection[Any], now: float | None, scan: int) -> list[Any]:
        """Up to ``scan`` candidates over the backlog, locked (rows other claimers hold are passed over)."""
        params = {"now": now, "scan": scan, "ns": self._chat_ns, "window": scan * 8 + 64}
        candidates = conn.execute(self._sql.candidates, params).fetchall()
        if len(candidates) < scan:  # the first rows are mostly behind busy chats: look at every chat's head
            seen = {row[0] for row in candidates}
            candidates += [row for row in conn.execute(self._sql.all_heads, params) if row[0] not in seen]
            candidates.sort()
        return candidates

    def _wait_for_a_claimer(
        self, conn: psycopg.Connection[Any], now: float | None, scan: int, candidates: list[Any]
    ) -> bool:
        """When this claim found nothing to take only because other claimers hold what is due, wait until one
        of them commits and return ``True`` (look again); ``False`` when nothing is due (or this claim holds
        a chat lock, so it must not wait).

        The wait is for a chat lock, never for a row: the claimer holding a due row holds its chat's lock
        until it commits (its row lock ends a moment before). The lock is taken at session level and let go
        in the same statement, so this claim holds no chat lock afterwards; it holds none while it waits
        either, and its rows are skipped by other claimers, never waited for: no wait can close a cycle.
        Bounded by ``lock_timeout``.
        """
        if candidates:
            if any(row[3] for row in candidates):
                return False  # this claim holds a chat lock: never wait while holding one
            chat = candidates[0][1]  # a row it locked whose chat another (committing) claimer still holds
        else:
            row = conn.execute(self._sql.contended, {"now": now, "window": scan * 8 + 64}).fetchone()
            if row is None:
                return False  # nothing is due: the empty answer is true
            chat = row[1]
        if chat is not None:
            conn.execute(
                "SELECT pg_advisory_lock(%(ns)s::integer, hashint8(%(chat)s::bigint)), "
                "pg_advisory_unlock(%(ns)s::integer, hashint8(%(chat)s::bigint))",
                {"ns": self._chat_ns, "chat": chat},
            )
        return True


def _pick(
    candidates: list[Any], limit: int, max_attempts: int | None, exclude_chats: Collection[int]
) -> tuple[list[tuple[int, int | None]], list[tuple[int, str]], bool]:
    """The candidates to claim (at most ``limit``, one per chat), those whose attempts are spent (with the
    reason), and whether a candidate's chat was held by another transaction."""
    picked: list[tuple[int, int | None]] = []
    lapsed: list[tuple[int, str]] = []
    taken = set(exclude_chats)
    busy = False
    for update_id, chat_id, attempt, chat_locked in candidates:
        if not chat_locked:
            busy = True
            continue
        if chat_id is not None and chat_id in taken:
            continue
        if max_attempts is not None and attempt >= max_attempts:
            lapsed.append((update_id, lapsed_reason(attempt, max_attempts)))
            continue
        picked.append((update_id, chat_id))
        if chat_id is not None:
            taken.add(chat_id)
        if len(picked) >= limit:
            break
    return picked, lapsed, busy
