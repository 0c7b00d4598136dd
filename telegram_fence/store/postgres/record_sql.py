"""The one-round-trip record of ``PostgresUpdateStore``: the leadership check, the insert (some rows claimed as
they are stored), the payload conflicts, the cursor and the generation's progress as ONE statement.

The statement takes the batch as texts the client builds cheaply: the ids, chats and states as array literals of
integers, the payloads as one ``text[]`` literal (each quoted with two ``str.replace``, instead of psycopg's array
dumper and its regular expression per element; not as one JSON text, which the server would validate, refusing
texts it does not take as JSON, such as an escaped lone surrogate, that a ``text`` column stores), the claim ids
as one array literal (hex digits: nothing to quote). Which new rows are stored
claimed is the rule of :func:`~telegram_fence.store.values.choose_inline`, evaluated by the server on the
statement's snapshot: in ``update_id`` order, a chat with no open row yields its first ``%(run)s`` new pending
updates, a chatless update is its own line, at most ``%(limit)s`` in all.

With ``guarded`` the leader row is locked ``FOR SHARE`` first and nothing is written unless its epoch is
``%(epoch)s``: the statement then answers the epoch it found (kind 2) and the caller raises ``LeadershipLost``.

May import only the standard library and :mod:`.schema` (no driver).
"""

from __future__ import annotations

from .schema import NOW

__all__ = ["record_statement"]


#: The rows of a batch taken from an answer that the statement will not store from it (see :func:`record_statement`).
_REFUSED = "SELECT count(*) AS n FROM b WHERE b.body_id IS DISTINCT FROM b.update_id OR b.old IS NOT NULL"


def _old(t: str) -> str:
    """The payload stored before under the id of batch row ``i`` (``NULL``: none), looked up by primary key only
    when some row is stored in the batch's id range: a fresh batch (ids above every stored one) costs one index
    descent instead of one per row. Both lookups are subqueries on the primary key (a join here got a generic plan
    made on the empty table, a sequential scan of the whole table per batch, kept while the table grew); the range's
    first stored id is read ``ORDER BY ... LIMIT 1``, which only the index answers cheaply (an ``EXISTS`` could be
    planned as a scan expected to meet a row early and read the whole table when there is none)."""
    return (
        f"CASE WHEN (SELECT s.update_id FROM {t} AS s WHERE s.update_id >= "
        "(SELECT min(v) FROM unnest(%(ids)s::bigint[]) AS v) ORDER BY s.update_id LIMIT 1) "
        "<= (SELECT max(v) FROM unnest(%(ids)s::bigint[]) AS v) "
        f"THEN (SELECT o.payload FROM {t} AS o WHERE o.update_id = i.update_id) END AS old"
    )


def _from_texts(t: str) -> str:
    """The batch ``b``: its rows with their payloads as sent (``%(payloads)s``), each with the payload stored
    before under its id (``old``)."""
    return (
        f"b AS MATERIALIZED (SELECT i.update_id, i.payload, i.chat_id, i.state, {_old(t)} "
        "  FROM unnest(%(ids)s::bigint[], %(payloads)s::text[], %(chats)s::bigint[], %(states)s::smallint[]) "
        "  AS i(update_id, payload, chat_id, state)), "
    )


def _from_body(t: str) -> str:
    """The batch ``b`` with its payloads taken from ``%(body)s``, the answer's ``result`` array (the item at each
    row's position), and the ``update_id`` that item holds (``body_id``)."""
    return (
        "b AS MATERIALIZED (SELECT i.update_id, e.value::text AS payload, (e.value->>'update_id')::bigint AS body_id, "
        f"  i.chat_id, i.state, {_old(t)} "
        "  FROM unnest(%(ids)s::bigint[], %(positions)s::bigint[], %(chats)s::bigint[], %(states)s::smallint[]) "
        "  AS i(update_id, position, chat_id, state) "
        "  LEFT JOIN json_array_elements(%(body)s::json) WITH ORDINALITY AS e(value, n) "
        "  ON e.n = i.position), "
    )


def record_statement(table: str, *, guarded: bool, generations: bool, from_body: bool = False) -> str:
    """The statement (``%(name)s`` placeholders). Its rows: ``(0, update_id, claim_id, due_at)`` per new update
    (``claim_id`` ``NULL`` when it was stored pending or skipped), ``(1, update_id, NULL, NULL)`` per update stored
    before with another payload (the first kept), and with ``guarded`` one ``(2, epoch, NULL, NULL)``: the epoch
    the leader row holds (``NULL``: no leader row); when it is not ``%(epoch)s`` nothing was written.

    With ``from_body`` the payloads are the items of ``%(body)s`` (the ``result`` array of Telegram's ``getUpdates``
    answer), row ``i`` the item at ``%(positions)s[i]`` (1-based), each stored as the answer's own text; and one more
    row, ``(3, refused, NULL, NULL)``: when ``refused`` > 0 (an item whose ``update_id`` is not its row's, or an
    update stored before, whose payload is compared with an encoded one) nothing was written and the caller records
    the encoded payloads instead."""
    t = table
    conditions = []
    lead = ""
    if guarded:
        lead = f"lead AS MATERIALIZED (SELECT epoch FROM {t}_leader WHERE id = 1 FOR SHARE), "
        conditions.append("(SELECT epoch FROM lead) = %(epoch)s::bigint")
    refused = ""
    if from_body:
        refused = f"refused AS MATERIALIZED ({_REFUSED}), "
        conditions.append("(SELECT n FROM refused) = 0")
    ok = f"ok AS MATERIALIZED (SELECT 1 WHERE {' AND '.join(conditions)}), " if conditions else "ok AS (SELECT 1), "
    progress = (f", progress AS (UPDATE {t}_generations SET progress_at = %(stamp)s::float8 "
                "WHERE generation = %(generation)s::bigint AND EXISTS (SELECT 1 FROM ok) RETURNING 1)"
                if generations else "")
    told = "UNION ALL SELECT 2, (SELECT epoch FROM lead), NULL, NULL " if guarded else ""
    if from_body:
        told += "UNION ALL SELECT 3, (SELECT n FROM refused), NULL, NULL"
    return (
        f"WITH {lead}{_from_body(t) if from_body else _from_texts(t)}{refused}{ok}"
        # (each chat of the batch probed once, however many of its updates the batch holds)
        "busy AS MATERIALIZED (SELECT g.chat_id FROM (SELECT DISTINCT f.chat_id FROM b AS f "
        "  WHERE f.old IS NULL AND f.state = 0 AND f.chat_id IS NOT NULL) AS g WHERE EXISTS "
        f"  (SELECT 1 FROM {t} AS o WHERE o.chat_id = g.chat_id AND o.state < 2)), "
        "free AS (SELECT f.update_id, f.chat_id, row_number() OVER (PARTITION BY f.chat_id ORDER BY f.update_id) AS k "
        "  FROM b AS f WHERE f.old IS NULL AND f.state = 0 AND (f.chat_id IS NULL OR NOT EXISTS "
        "  (SELECT 1 FROM busy WHERE busy.chat_id = f.chat_id))), "
        "chosen AS MATERIALIZED (SELECT coalesce(array_agg(q.update_id ORDER BY q.update_id), '{}') AS ids "
        "  FROM (SELECT f.update_id FROM free AS f WHERE f.chat_id IS NULL OR f.k <= %(run)s "
        "  ORDER BY f.update_id LIMIT %(limit)s) AS q), "
        "given AS MATERIALIZED (SELECT %(claim_ids)s::text[] AS ids), "
        "marked AS (SELECT b.*, array_position((SELECT ids FROM chosen), b.update_id) AS n FROM b "
        "  WHERE b.old IS NULL AND EXISTS (SELECT 1 FROM ok)), "
        f"ins AS (INSERT INTO {t} (update_id, payload, chat_id, state, attempt, claim_id, due_at, recorded_at, "
        "  changed_at) SELECT m.update_id, m.payload, m.chat_id, CASE WHEN m.n IS NULL THEN m.state ELSE 1 END, "
        "  (m.n IS NOT NULL)::integer, (SELECT ids FROM given)[m.n], "
        f"  CASE WHEN m.n IS NULL THEN 0 ELSE {NOW} + %(lease)s::float8 END, {NOW}, {NOW} FROM marked AS m "
        "  ON CONFLICT (update_id) DO NOTHING RETURNING update_id, claim_id, due_at), "
        "differing AS (SELECT b.update_id FROM b WHERE b.old <> b.payload AND EXISTS (SELECT 1 FROM ok)), "
        f"counted AS (INSERT INTO {t}_meta (key, value) SELECT 'payload_conflicts', count(*) + %(repeated)s "
        "  FROM differing HAVING count(*) + %(repeated)s > 0 AND EXISTS (SELECT 1 FROM ok) "
        f"  ON CONFLICT (key) DO UPDATE SET value = {t}_meta.value + excluded.value), "
        f"cursor AS (INSERT INTO {t}_meta (key, value) SELECT 'cursor', %(offset)s::bigint FROM ok "
        f"  ON CONFLICT (key) DO UPDATE SET value = greatest({t}_meta.value, excluded.value)){progress} "
        "SELECT 0, update_id, claim_id, due_at FROM ins UNION ALL SELECT 1, update_id, NULL, NULL FROM differing "
        f"{told}"
    )
