"""The claim round's statements of ``PostgresUpdateStore``: settle, lock the candidates, claim, in one transaction.

A claim needs two snapshots: the candidates are locked (``FOR UPDATE SKIP LOCKED``) and their chats' advisory
locks tried on the first, and the chosen rows are claimed on a second, taken after those locks, which sees any
claim of those chats another transaction committed before letting its lock go. Each statement gets its own
snapshot (``READ COMMITTED``). The locking statement hands its candidates to the claim through a transaction-local
setting as one JSON text (the statements go out together in pipeline mode); the settled identities and the claim
ids come as JSON texts too. Placeholders are ``%(name)s``.

May import only the standard library and :mod:`.schema` (no driver).
"""

from __future__ import annotations

import functools

from .schema import NOW

__all__ = ["contended", "round_parts", "settled_count"]

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


def _chat_runs(t: str) -> str:
    """The first ``%(run)s`` open due rows of each chat of ``%(chats)s`` that has no live claim, locked (rows other
    claimers hold passed over), each with its rank in its chat (a rank after a gap is not claimed)."""
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


def _chatless(t: str) -> str:
    """The given updates without a chat (``%(chatless)s``) that are open and due, locked."""
    return (
        f"SELECT update_id, chat_id, attempt, true AS chat_locked, 1 AS rn FROM {t} "
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
        f"WITH a AS MATERIALIZED (SELECT q.*, 1 AS rn FROM ({_lock(t, _window(t), upto=True)}) AS q), "
        f"b AS MATERIALIZED (SELECT q.*, 1 AS rn FROM ({_lock(t, heads)}) AS q "
        "  WHERE (SELECT count(*) FROM a) < %(scan)s) "
        "SELECT * FROM a UNION ALL SELECT * FROM b WHERE b.update_id NOT IN (SELECT update_id FROM a)"
    )


def _claim(t: str) -> str:
    """Claim what the locking statement kept: per chat the unbroken run of ranks 1, 2, … (at most ``%(run)s``) of
    rows whose chat lock it got, up to ``%(limit)s`` in ``update_id`` order, checked again on this statement's
    snapshot; a row whose attempts are spent (``%(max_attempts)s``) becomes an exhaustion instead (its error:
    ``%(reason)s`` with ``{attempt}`` filled in, unless it kept its last attempt's) and ends its chat's run. Rows:
    the claims (kind 0, with the payload unless its id is in ``%(known)s``), the exhaustions (kind 1), one summary
    (kind 2: candidates, how many another claimer held, how many were picked)."""
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
        "  ORDER BY c.u) AS k FROM c WHERE c.locked), "
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
        "  CASE WHEN u.update_id = ANY(%(known)s::bigint[]) THEN NULL ELSE u.payload END AS payload) "
        "SELECT 0, update_id, chat_id, attempt, claim_id, due_at, payload FROM took "
        "UNION ALL SELECT 1, update_id, NULL, NULL, NULL, NULL, NULL FROM lapsed "
        "UNION ALL SELECT 2, (SELECT count(*) FROM c), (SELECT count(*) FROM c WHERE NOT c.locked), "
        "  (SELECT count(*) FROM picked), NULL, NULL, NULL"
    )


@functools.lru_cache(maxsize=64)
def round_parts(t: str, *, settle: bool, hinted: bool) -> tuple[str, ...]:
    """The statements of one round on table ``t``, run in order in one transaction: settle (when ``settle``), lock
    the candidates into the setting (the hinted chats' runs and chatless updates when ``hinted``, else a scan of
    the backlog), claim (its rows: see :func:`_claim`)."""
    rows = (f"SELECT * FROM ({_chat_runs(t)}) AS r UNION ALL SELECT * FROM ({_chatless(t)}) AS s" if hinted
            else _scan(t))
    remember = (f"SELECT set_config('{SETTING}', coalesce((SELECT json_agg(json_build_object('u', x.update_id, "
                "'chat', x.chat_id, 'attempt', x.attempt, 'locked', x.chat_locked, 'rn', x.rn) ORDER BY x.update_id) "
                f"FROM ({rows}) AS x)::text, '[]'), true)")
    return (*([_settle(t)] if settle else []), remember, _claim(t))
