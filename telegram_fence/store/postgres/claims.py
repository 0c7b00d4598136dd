"""Claiming on PostgreSQL: ``exchange`` (settle and claim in one round, one transaction), and the exhaustion of
updates whose attempts are spent, found while claiming.

A claim needs two snapshots: the candidates are locked ``FOR UPDATE SKIP LOCKED`` (racing claimers never wait for,
nor take, each other's rows) and their chats' advisory locks tried on the first, and the chosen rows are claimed on
a second, taken after those locks, which sees any claim of those chats another transaction committed before letting
its lock go: two hosts never hold one chat. Each statement gets its own snapshot (``READ COMMITTED``); the locking
statement hands its candidates to the claim through a transaction-local setting as one JSON text (the statements go
out together in pipeline mode); the settled identities and the claim ids come as JSON texts too. A claim that finds
every due row held by other claimers waits for one of them to commit (for its chat lock, bounded by
``lock_timeout``) and looks again, instead of answering "nothing is due".

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
from .schema import NOW
from .support import StoreSupport

__all__ = ["MAX_ROUND_CLAIMS", "NO_FLUSH_WAIT", "Claims", "contended", "round_parts", "settled_count"]

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


#: The transaction-local setting that carries the locked candidates from the locking statement to the claim.
SETTING = "telegram_fence.candidates"


def _chat_free(t: str, u: str) -> str:
    """Row ``u`` is its chat's next: no live claim in the chat and no older open row (a retry waiting for its time
    holds the chat: a chat's updates keep their order, retries included)."""
    return (
        f"({u}.chat_id IS NULL OR (NOT EXISTS (SELECT 1 FROM {t} AS c WHERE c.chat_id = {u}.chat_id "
        f"AND c.state = 1 AND c.due_at > {NOW}) "
        f"AND NOT EXISTS (SELECT 1 FROM {t} AS o WHERE o.chat_id = {u}.chat_id AND o.state < 2 "
        f"AND o.update_id < {u}.update_id)))"
    )


def _window(t: str) -> str:
    """The first ``window`` open due rows in ``update_id`` order (no lock, no chat check)."""
    return f"SELECT update_id FROM {t} WHERE state < 2 AND due_at <= {NOW} ORDER BY update_id LIMIT %(window)s"


def _lock(t: str, chosen: str, *, upto: bool = False) -> str:
    """Lock, oldest first, up to ``scan`` of the rows ``chosen`` (update ids) that are still open, due and their
    chat's next, and try each locked row's chat lock (never waiting; ``false``: another claimer holds the chat).
    The ``LIMIT`` counts locked rows: rows other claimers hold are skipped, so racing claimers take disjoint rows.
    With ``upto`` the rows are those up to the last of ``chosen``, read in ``update_id`` order from the index."""
    among = (f"u.update_id <= (SELECT max(w.update_id) FROM ({chosen}) AS w)" if upto
             else f"u.update_id = ANY(ARRAY({chosen}))")
    return (
        f"WITH locked AS MATERIALIZED (SELECT u.update_id, u.chat_id, u.attempt FROM {t} AS u "
        f"WHERE {among} AND u.state < 2 AND u.due_at <= {NOW} "
        f"AND {_chat_free(t, 'u')} ORDER BY u.update_id LIMIT %(scan)s FOR UPDATE OF u SKIP LOCKED) "
        "SELECT u.update_id, u.chat_id, u.attempt, CASE WHEN u.chat_id IS NULL THEN true "
        "ELSE pg_try_advisory_xact_lock(%(ns)s::integer, hashint8(u.chat_id)) END AS chat_locked "
        "FROM locked AS u ORDER BY u.update_id"
    )


def contended(t: str) -> str:
    """The first pending row of the window that is its chat's next, unlocked (``[update_id, chat_id]``; none:
    nothing is due): when a round found every candidate held by other claimers, its claim waits for that row's
    chat lock (its claimer's commit) rather than answer "nothing is due"."""
    return (
        f"SELECT u.update_id, u.chat_id FROM {t} AS u WHERE u.update_id = ANY(ARRAY({_window(t)})) "
        f"AND u.state = 0 AND u.due_at <= {NOW} AND {_chat_free(t, 'u')} ORDER BY u.update_id LIMIT 1"
    )


def _settle(t: str) -> str:
    """Settle the live claims given as ``[[update_id, attempt, claim_id], ...]`` (``%(settle)s``, read as ``jsonb``:
    parsed once)."""
    return (
        f"UPDATE {t} AS u SET state = 2, changed_at = {NOW} "
        "FROM jsonb_array_elements(%(settle)s::jsonb) AS j(v) "
        "WHERE u.update_id = (j.v->>0)::bigint AND u.attempt = (j.v->>1)::integer AND u.claim_id = j.v->>2 "
        f"AND u.state = 1 AND u.due_at > {NOW}"
    )


def settled_count(t: str) -> str:
    """:func:`_settle` answering how many it settled (one row), for a settle sent alone."""
    return f"WITH s AS ({_settle(t)} RETURNING 1) SELECT count(*) FROM s"


def _heads(t: str) -> str:
    """The first open due row of each chat of ``%(chats)s`` that has no live claim, locked (rows other claimers hold
    passed over)."""
    return (
        "WITH heads AS MATERIALIZED (SELECT h.update_id FROM unnest(%(chats)s::bigint[]) AS g(chat_id) "
        f"CROSS JOIN LATERAL (SELECT o.update_id FROM {t} AS o WHERE o.chat_id = g.chat_id AND o.state < 2 "
        f"  AND o.due_at <= {NOW} ORDER BY o.update_id LIMIT 1) AS h "
        f"WHERE NOT EXISTS (SELECT 1 FROM {t} AS c WHERE c.chat_id = g.chat_id AND c.state = 1 AND c.due_at > {NOW})), "
        f"locked AS MATERIALIZED (SELECT u.update_id, u.chat_id, u.attempt FROM {t} AS u "
        f"WHERE u.update_id = ANY(ARRAY(SELECT update_id FROM heads)) AND u.state < 2 AND u.due_at <= {NOW} "
        "ORDER BY u.update_id LIMIT %(scan)s FOR UPDATE OF u SKIP LOCKED) "
        "SELECT l.update_id, l.chat_id, l.attempt, "
        "pg_try_advisory_xact_lock(%(ns)s::integer, hashint8(l.chat_id)) AS chat_locked FROM locked AS l"
    )


def _chatless(t: str) -> str:
    """The given updates without a chat (``%(chatless)s``) that are open and due, locked."""
    return (
        f"SELECT update_id, chat_id, attempt, true AS chat_locked FROM {t} "
        f"WHERE update_id = ANY(%(chatless)s::bigint[]) AND chat_id IS NULL AND state < 2 AND due_at <= {NOW} "
        "FOR UPDATE SKIP LOCKED"
    )


def _scan(t: str) -> str:
    """The candidates among the backlog's first rows (cheap when it spreads over many chats), and, only when those
    gave fewer than ``%(scan)s``, among every chat's next open due row (a backlog of few, busy chats)."""
    heads = (f"SELECT h.update_id FROM (SELECT DISTINCT ON (chat_id) update_id, chat_id FROM {t} "
             f"WHERE state < 2 AND due_at <= {NOW} AND chat_id IS NOT NULL ORDER BY chat_id, update_id) AS h "
             f"WHERE {_chat_free(t, 'h')} "
             f"UNION ALL SELECT update_id FROM {t} WHERE state < 2 AND due_at <= {NOW} AND chat_id IS NULL "
             "ORDER BY 1 LIMIT %(window)s")
    return (
        f"WITH a AS MATERIALIZED ({_lock(t, _window(t), upto=True)}), "
        f"b AS MATERIALIZED (SELECT q.* FROM ({_lock(t, heads)}) AS q "
        "  WHERE (SELECT count(*) FROM a) < %(scan)s) "
        "SELECT * FROM a UNION ALL SELECT * FROM b WHERE b.update_id NOT IN (SELECT update_id FROM a)"
    )


def _claim(t: str) -> str:
    """Claim what the locking statement kept (at most one row per chat): the rows whose chat lock it got, up to
    ``%(limit)s`` in ``update_id`` order, checked again on this statement's snapshot; a row whose attempts are spent
    (``%(max_attempts)s``) becomes an exhaustion instead (its error: ``%(reason)s`` with ``{attempt}`` filled in,
    unless it kept its last attempt's). Rows: the claims (kind 0, with the payload unless its id is in
    ``%(known)s``), the exhaustions (kind 1), one summary (kind 2: candidates, how many another claimer held, how
    many were picked)."""
    return (
        f"WITH c AS (SELECT * FROM json_to_recordset(current_setting('{SETTING}')::json) "
        "  AS c(u bigint, chat bigint, attempt integer, locked boolean)), "
        "runs AS (SELECT c.u, c.attempt >= %(max_attempts)s::bigint AS spent FROM c WHERE c.locked), "
        "picked AS (SELECT q.u, q.n FROM (SELECT s.u, row_number() OVER (ORDER BY s.u) AS n FROM runs AS s "
        "  WHERE NOT s.spent) AS q WHERE q.n <= %(limit)s), "
        f"lapsed AS (UPDATE {t} AS u SET state = 3, acknowledged = false, changed_at = {NOW}, "
        "  error = CASE WHEN u.state = 0 AND u.error IS NOT NULL THEN u.error "
        "  ELSE replace(%(reason)s, '{attempt}', u.attempt::text) END "
        "  FROM runs AS s WHERE s.spent AND u.update_id = s.u RETURNING u.update_id), "
        f"took AS (UPDATE {t} AS u SET state = 1, attempt = u.attempt + 1, due_at = {NOW} + %(lease)s, "
        f"  claim_id = (%(claim_ids)s::json)->>(p.n::integer - 1), changed_at = {NOW} FROM picked AS p "
        f"  WHERE u.update_id = p.u AND u.state < 2 AND u.due_at <= {NOW} AND {_chat_free(t, 'u')} "
        "  RETURNING u.update_id, u.chat_id, u.attempt, u.claim_id, u.due_at, "
        "  CASE WHEN u.update_id = ANY(%(known)s::bigint[]) THEN NULL ELSE u.payload END AS payload) "
        "SELECT 0, update_id, chat_id, attempt, claim_id, due_at, payload FROM took "
        "UNION ALL SELECT 1, update_id, NULL, NULL, NULL, NULL, NULL FROM lapsed "
        "UNION ALL SELECT 2, (SELECT count(*) FROM c), (SELECT count(*) FROM c WHERE NOT c.locked), "
        "  (SELECT count(*) FROM picked), NULL, NULL, NULL"
    )


@functools.lru_cache(maxsize=64)
def round_parts(t: str, *, settle: bool, hinted: bool) -> tuple[str, ...]:
    """The statements of one round on table ``t``, run in order in one transaction: settle (when ``settle``), lock
    the candidates into the setting (the hinted chats' next updates and chatless updates when ``hinted``, else a scan of
    the backlog), claim (its rows: see :func:`_claim`)."""
    rows = (f"SELECT * FROM ({_heads(t)}) AS r UNION ALL SELECT * FROM ({_chatless(t)}) AS s" if hinted
            else _scan(t))
    remember = (f"SELECT set_config('{SETTING}', coalesce((SELECT json_agg(json_build_object('u', x.update_id, "
                "'chat', x.chat_id, 'attempt', x.attempt, 'locked', x.chat_locked) ORDER BY x.update_id) "
                f"FROM ({rows}) AS x)::text, '[]'), true)")
    return (*([_settle(t)] if settle else []), remember, _claim(t))


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
            while waiting and waits < _WAITS and self._local.conn is None and self._wait_for_a_claimer(limit):
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
            "now": self._now(), "settle": json.dumps(settle), "lease": float(lease), "limit": limit,
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
