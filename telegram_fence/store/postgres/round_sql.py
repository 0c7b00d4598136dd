"""The round's statements of ``PostgresUpdateStore``: settle, lock the candidates, claim, in one transaction.

A claim needs two snapshots: the candidates are locked (``FOR UPDATE SKIP LOCKED``) and their chats' advisory
locks tried on the first, and the chosen rows are claimed on a second, taken after those locks, which sees any
claim of those chats another transaction committed before letting its lock go (see :mod:`.claims`). Each
statement gets its own snapshot (``READ COMMITTED``). The first statements hand their candidates to the claim
through a transaction-local setting (``set_config(..., true)``) as one JSON text; the settled identities and the
claim ids come as JSON texts too (one bound parameter each). Placeholders are ``%(name)s``.

May import only the standard library and :mod:`.sql` (no driver).
"""

from __future__ import annotations

import functools

from .schema import NOW
from .sql import Statements

__all__ = ["SETTING", "round_parts", "settled_count"]

#: The transaction-local setting that carries the locked candidates from the locking statement to the claim.
SETTING = "telegram_fence.candidates"

#: A candidate as the JSON the claim reads (``rn``: its rank in its chat).
_AS_JSON = ("json_build_object('u', x.update_id, 'chat', x.chat_id, 'attempt', x.attempt, "
            "'locked', x.chat_locked, 'rn', x.rn)")


def _settle(sql: Statements) -> str:
    """Settle the live claims given as ``[[update_id, attempt, claim_id], ...]`` (``%(settle)s``). The text is
    read as ``jsonb``: parsed once, where each ``->>`` of a ``json`` element parses that element again."""
    return (
        f"UPDATE {sql.table} AS u SET state = 2, changed_at = {NOW} "
        "FROM jsonb_array_elements(%(settle)s::jsonb) AS j(v) "
        "WHERE u.update_id = (j.v->>0)::bigint AND u.attempt = (j.v->>1)::integer AND u.claim_id = j.v->>2 "
        f"AND u.state = 1 AND u.due_at > {NOW}"
    )


def settled_count(sql: Statements) -> str:
    """:func:`_settle` answering how many it settled (one row), for a settle sent alone."""
    return f"WITH s AS ({_settle(sql)} RETURNING 1) SELECT count(*) FROM s"


def _chat_runs(sql: Statements) -> str:
    """The first ``%(run)s`` open due rows of each chat of ``%(chats)s`` that has no live claim, locked (rows
    other claimers hold passed over), each with its rank in its chat: a rank the claim finds a gap before is
    not claimed (an older row of its chat was held by another claimer)."""
    t = sql.table
    return (
        "WITH heads AS MATERIALIZED (SELECT h.update_id, h.rn FROM unnest(%(chats)s::bigint[]) AS g(chat_id) "
        "CROSS JOIN LATERAL (SELECT o.update_id, row_number() OVER (ORDER BY o.update_id) AS rn "
        f"  FROM {t} AS o WHERE o.chat_id = g.chat_id AND o.state < 2 AND o.due_at <= {NOW} "
        "  ORDER BY o.update_id LIMIT %(run)s) AS h "
        f"WHERE NOT EXISTS (SELECT 1 FROM {t} AS c WHERE c.chat_id = g.chat_id AND c.state = 1 AND c.due_at > {NOW})), "
        f"locked AS MATERIALIZED (SELECT u.update_id, u.chat_id, u.attempt FROM {t} AS u "
        f"WHERE u.update_id = ANY(ARRAY(SELECT update_id FROM heads)) AND u.state < 2 AND u.due_at <= {NOW} "
        "ORDER BY u.update_id LIMIT %(scan)s FOR UPDATE OF u SKIP LOCKED) "
        "SELECT l.update_id, l.chat_id, l.attempt, "
        "pg_try_advisory_xact_lock(%(ns)s::integer, hashint8(l.chat_id)) AS chat_locked, h.rn "
        "FROM locked AS l JOIN heads AS h ON h.update_id = l.update_id"
    )


def _chatless(sql: Statements) -> str:
    """The given updates without a chat (``%(chatless)s``) that are open and due, locked."""
    return (
        f"SELECT update_id, chat_id, attempt, true AS chat_locked, 1 AS rn FROM {sql.table} "
        f"WHERE update_id = ANY(%(chatless)s::bigint[]) AND chat_id IS NULL AND state < 2 AND due_at <= {NOW} "
        "FOR UPDATE SKIP LOCKED"
    )


def _remember(rows: str) -> str:
    """Keep the candidates ``rows`` (update_id, chat_id, attempt, chat_locked, rn) for the claim."""
    return (
        f"SELECT set_config('{SETTING}', coalesce((SELECT json_agg({_AS_JSON} ORDER BY x.update_id) "
        f"FROM ({rows}) AS x)::text, '[]'), true)"
    )


def _scan(sql: Statements) -> str:
    """:attr:`Statements.candidates` over the backlog's first rows, and :attr:`Statements.all_heads` only when
    those gave fewer than ``%(scan)s`` (the first rows are mostly behind busy chats)."""
    return (
        f"WITH a AS MATERIALIZED (SELECT q.*, 1 AS rn FROM ({sql.candidates}) AS q), "
        f"b AS MATERIALIZED (SELECT q.*, 1 AS rn FROM ({sql.all_heads}) AS q "
        "  WHERE (SELECT count(*) FROM a) < %(scan)s) "
        "SELECT * FROM a UNION ALL SELECT * FROM b WHERE b.update_id NOT IN (SELECT update_id FROM a)"
    )


def _claim(sql: Statements) -> str:
    """Claim what the locking statement kept: per chat the unbroken run of ranks 1, 2, … (at most ``%(run)s``)
    of rows whose chat lock it got, chats in ``%(exclude)s`` passed over, up to ``%(limit)s`` in ``update_id``
    order, checked again on this statement's snapshot; a row whose attempts are spent (``%(max_attempts)s::bigint``)
    becomes an exhaustion instead (its error: ``%(reason)s`` with ``{attempt}`` replaced, unless it kept the error of
    its last attempt) and ends its chat's run. Returns the claims (kind 0, with the payload unless
    its id is in ``%(known)s``), the exhaustions (kind 1), and one summary row (kind 2: candidates, how many
    were held by another claimer)."""
    t = sql.table
    claim_id = "claim_id = (%(claim_ids)s::json)->>(p.n::integer - 1), "
    free = (
        f"(u.chat_id IS NULL OR (NOT EXISTS (SELECT 1 FROM {t} AS c WHERE c.chat_id = u.chat_id "
        f"AND c.state = 1 AND c.due_at > {NOW}) "
        f"AND NOT EXISTS (SELECT 1 FROM {t} AS o WHERE o.chat_id = u.chat_id AND o.state < 2 "
        f"AND o.update_id < u.update_id AND o.update_id <> ALL(ARRAY(SELECT u FROM picked)))))"
    )
    return (
        f"WITH c AS (SELECT * FROM json_to_recordset(current_setting('{SETTING}')::json) "
        "  AS c(u bigint, chat bigint, attempt integer, locked boolean, rn integer)), "
        "ranked AS (SELECT c.*, row_number() OVER (PARTITION BY c.chat, CASE WHEN c.chat IS NULL THEN c.u END "
        "  ORDER BY c.u) AS k FROM c WHERE c.locked AND (c.chat IS NULL OR c.chat <> ALL(%(exclude)s::bigint[]))), "
        "runs AS (SELECT r.*, r.attempt >= %(max_attempts)s::bigint AS spent, "
        "  count(*) FILTER (WHERE r.attempt >= %(max_attempts)s::bigint) OVER (PARTITION BY r.chat, "
        "  CASE WHEN r.chat IS NULL THEN r.u END ORDER BY r.u ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) "
        "  AS spent_before FROM ranked AS r WHERE r.k = r.rn AND r.k <= %(run)s), "
        "picked AS (SELECT q.u, q.n FROM (SELECT s.u, row_number() OVER (ORDER BY s.u) AS n FROM runs AS s "
        "  WHERE NOT s.spent AND coalesce(s.spent_before, 0) = 0) AS q WHERE q.n <= %(limit)s), "
        f"lapsed AS (UPDATE {t} AS u SET state = 3, acknowledged = false, changed_at = {NOW}, "
        "  error = CASE WHEN u.state = 0 AND u.error IS NOT NULL THEN u.error "
        "  ELSE replace(%(reason)s, '{attempt}', u.attempt::text) END "
        "  FROM runs AS s WHERE s.spent AND coalesce(s.spent_before, 0) = 0 AND u.update_id = s.u "
        "  RETURNING u.update_id), "
        f"took AS (UPDATE {t} AS u SET state = 1, attempt = u.attempt + 1, due_at = {NOW} + %(lease)s, "
        f"  {claim_id}changed_at = {NOW} FROM picked AS p "
        f"  WHERE u.update_id = p.u AND u.state < 2 AND u.due_at <= {NOW} AND {free} "
        "  RETURNING u.update_id, u.chat_id, u.attempt, u.claim_id, u.due_at, "
        "  CASE WHEN u.update_id = ANY(%(known)s::bigint[]) THEN NULL ELSE u.payload END AS payload), "
        "told AS (SELECT pg_notify(%(channel)s, '') FROM (SELECT 1 FROM lapsed LIMIT 1) AS x) "
        "SELECT 0, update_id, chat_id, attempt, claim_id, due_at, payload FROM took "
        "UNION ALL SELECT 1, update_id, NULL, NULL, NULL, NULL, NULL FROM lapsed "
        "UNION ALL SELECT 2, (SELECT count(*) FROM c), (SELECT count(*) FROM c WHERE NOT c.locked), "
        "  (SELECT count(*) FROM picked), NULL, NULL, NULL FROM (SELECT count(*) FROM told) AS x"
    )


@functools.lru_cache(maxsize=64)
def round_parts(sql: Statements, *, settle: bool, hinted: bool, lean: bool = False) -> list[str]:
    """The statements of one round: settle (when ``settle``), lock the candidates (the hinted chats' runs and
    the chatless updates when ``hinted``, else a scan of the backlog; with ``lean`` only the scan of the
    backlog's first rows, :attr:`Statements.candidates`, without the look at every chat's head it falls back
    to when those rows are mostly behind busy chats), claim, run in order in one transaction
    (or a savepoint of the thread's open one). Their results, in order: the settle's row count
    (when ``settle``), the setting, the claim's rows (see :func:`_claim`). The list is shared: do not change it.

    ``lean`` is for a claim of ONE update: the backlog's first rows nearly always hold it, and the fallback's
    statement costs the server about a third of the locking statement's time even when it is not run (its plan
    is set up and torn down on every call); a lean round that claims nothing is followed by a full one."""
    if hinted:
        rows = f"SELECT * FROM ({_chat_runs(sql)}) AS r UNION ALL SELECT * FROM ({_chatless(sql)}) AS s"
    elif lean:
        rows = f"SELECT q.*, 1 AS rn FROM ({sql.candidates}) AS q"
    else:
        rows = _scan(sql)
    parts = [_settle(sql)] if settle else []
    return [*parts, _remember(rows), _claim(sql)]
