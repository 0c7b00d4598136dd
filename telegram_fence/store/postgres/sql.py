"""The statements of ``PostgresUpdateStore``, as text built from a table name (the schema is in :mod:`.schema`).

May import only the standard library, :mod:`telegram_fence.errors` and :mod:`.schema` (no driver). Every
statement that needs "now" reads it through :data:`~.schema.NOW`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import (
    FENCED_COLUMNS,
    MIGRATION_NAME,
    NOW,
    base_table_sql,
    calls_sql,
    lock_keys,
    migration_sql,
    schema_sql,
    split_table,
    support_sql,
    table_names,
)

__all__ = [
    "FENCED_COLUMNS", "MIGRATION_NAME", "NOW", "Statements", "base_table_sql", "calls_sql", "lock_keys",
    "migration_sql", "schema_sql", "split_table", "support_sql", "table_names",
]

# A candidate's chat is locked for this transaction as it is read (never waiting): the claim's
# UPDATE runs on a snapshot taken after that lock, so it sees any claim of that chat another
# transaction committed before letting the lock go. ``false``: another claimer holds the chat now.
_TRY_CHAT_LOCK = (
    "CASE WHEN u.chat_id IS NULL THEN true "
    "ELSE pg_try_advisory_xact_lock(%(ns)s::integer, hashint8(u.chat_id)) END AS chat_locked"
)


@dataclass(frozen=True)
class Statements:
    """Every statement of the store for one table (``fenced``: whether the table has the fenced columns)."""

    table: str
    fenced: bool

    def __post_init__(self) -> None:
        split_table(self.table)

    @property
    def insert_batch(self) -> str:
        t = self.table
        return (
            f"INSERT INTO {t} (update_id, payload, chat_id, state, recorded_at, changed_at) "
            f"SELECT b.update_id, b.payload, b.chat_id, b.state, {NOW}, {NOW} "
            "FROM unnest(%(ids)s::bigint[], %(payloads)b::text[], %(chats)s::bigint[], %(states)s::smallint[]) "
            "AS b(update_id, payload, chat_id, state) "
            "ON CONFLICT (update_id) DO NOTHING RETURNING update_id"
        )

    @property
    def differing_payloads(self) -> str:
        """The given ids stored with another payload. Each stored payload is read by primary key in a subquery: a
        join of the table with the given rows got a generic plan made on an empty table, a sequential scan of the
        whole table, kept while the table grew (``tests/test_postgres_plans.py``)."""
        return (
            "SELECT b.update_id FROM unnest(%(ids)s::bigint[], %(payloads)b::text[]) AS b(update_id, payload) "
            f"WHERE b.payload <> (SELECT u.payload FROM {self.table} AS u WHERE u.update_id = b.update_id)"
        )

    @property
    def undecodable(self) -> str:
        """Rows just claimed whose payloads cannot be decoded become exhaustions without their payloads."""
        return (
            f"UPDATE {self.table} SET state = 3, acknowledged = false, changed_at = {NOW}, error = %(reason)s, "
            "payload = '{\"update_id\":' || update_id || '}' "
            "WHERE update_id = ANY(%(ids)s::bigint[]) AND state = 1"
        )

    def _chat_free(self, u: str) -> str:
        """Row ``u`` is its chat's next: no live claim in the chat, and no older open row (one due now, locked by
        another claimer or an expired claim, comes first; one waiting for its retry holds the chat until it ran or
        was exhausted: a chat's updates keep their order, retries included)."""
        t = self.table
        return (
            f"({u}.chat_id IS NULL OR (NOT EXISTS (SELECT 1 FROM {t} AS c WHERE c.chat_id = {u}.chat_id "
            f"AND c.state = 1 AND c.due_at > {NOW}) "
            f"AND NOT EXISTS (SELECT 1 FROM {t} AS o WHERE o.chat_id = {u}.chat_id AND o.state < 2 "
            f"AND o.update_id < {u}.update_id)))"
        )

    def _lock(self, chosen: str, *, upto: bool = False) -> str:
        """Lock, oldest first, up to ``scan`` of the rows ``chosen`` (a query of update ids, run once on the
        statement's snapshot) that are still open, due and their chat's next, and try each locked row's chat lock.

        The ``LIMIT`` counts locked rows: a row another claimer holds is skipped (``SKIP LOCKED``) and the scan
        goes on to the next, so concurrent claimers take disjoint rows instead of all skipping the same first
        ones. The chat lock is tried only on rows this statement locked (the locking query is materialized
        before it). With ``upto`` the rows are those up to the last of ``chosen`` instead (the same rows when
        ``chosen`` is every open due row up to its last): read in ``update_id`` order from the index, so the scan
        stops once it locked ``scan`` rows instead of checking every row of ``chosen`` first.
        """
        among = (f"u.update_id <= (SELECT max(w.update_id) FROM ({chosen}) AS w)" if upto
                 else f"u.update_id = ANY(ARRAY({chosen}))")
        return (
            f"WITH locked AS MATERIALIZED (SELECT u.update_id, u.chat_id, u.attempt FROM {self.table} AS u "
            f"WHERE {among} AND u.state < 2 AND u.due_at <= {NOW} "
            f"AND {self._chat_free('u')} ORDER BY u.update_id LIMIT %(scan)s FOR UPDATE OF u SKIP LOCKED) "
            f"SELECT u.update_id, u.chat_id, u.attempt, {_TRY_CHAT_LOCK} FROM locked AS u ORDER BY u.update_id"
        )

    def _window(self) -> str:
        """The first ``window`` open due rows in ``update_id`` order (no lock, no chat check)."""
        return (
            f"SELECT update_id FROM {self.table} WHERE state < 2 AND due_at <= {NOW} "
            "ORDER BY update_id LIMIT %(window)s"
        )

    @property
    def candidates(self) -> str:
        """Among the first ``window`` open due rows in ``update_id`` order, up to ``scan`` that are their
        chat's next (the chat has no live claim and no older open due row) and no other claimer holds,
        locked. Cheap when the backlog spreads over many chats."""
        return self._lock(self._window(), upto=True)

    @property
    def contended(self) -> str:
        """The first pending row of :attr:`candidates`' window that is its chat's next, read without a lock
        (``[update_id, chat_id]``; no row: nothing is due): asked when every candidate was held by other
        claimers, to wait for that row's chat lock (its claimer's commit) rather than answer "nothing is due"."""
        return (
            f"SELECT u.update_id, u.chat_id FROM {self.table} AS u WHERE u.update_id = ANY(ARRAY({self._window()})) "
            f"AND u.state = 0 AND u.due_at <= {NOW} AND {self._chat_free('u')} ORDER BY u.update_id LIMIT 1"
        )

    @property
    def all_heads(self) -> str:
        """:attr:`candidates` over the whole backlog: each chat's next open due row (and every open due row
        without a chat). One pass over the open rows, cheap per row, for a backlog of few, busy chats."""
        t = self.table
        return self._lock(
            f"SELECT h.update_id FROM (SELECT DISTINCT ON (chat_id) update_id, chat_id FROM {t} "
            f"WHERE state < 2 AND due_at <= {NOW} AND chat_id IS NOT NULL ORDER BY chat_id, update_id) AS h "
            f"WHERE {self._chat_free('h')} "
            f"UNION ALL SELECT update_id FROM {t} WHERE state < 2 AND due_at <= {NOW} AND chat_id IS NULL "
            "ORDER BY 1 LIMIT %(window)s"
        )

    @property
    def chat_heads(self) -> str:
        """The next open due row of each given chat that has no live claim (one index probe per chat)."""
        t = self.table
        return self._lock(
            "SELECT h.update_id FROM unnest(%(chats)s::bigint[]) AS g(chat_id) "
            f"CROSS JOIN LATERAL (SELECT o.update_id FROM {t} AS o WHERE o.chat_id = g.chat_id AND o.state < 2 "
            f"  AND o.due_at <= {NOW} ORDER BY o.update_id LIMIT 1) AS h "
            f"WHERE NOT EXISTS (SELECT 1 FROM {t} AS c WHERE c.chat_id = g.chat_id AND c.state = 1 "
            f"  AND c.due_at > {NOW})"
        )

    @property
    def chatless(self) -> str:
        """The given updates without a chat that are open and due."""
        return (
            f"SELECT update_id, chat_id, attempt, true FROM {self.table} WHERE update_id = ANY(%(ids)s::bigint[]) "
            f"AND chat_id IS NULL AND state < 2 AND due_at <= {NOW} FOR UPDATE SKIP LOCKED"
        )

    @property
    def take(self) -> str:
        """Claim the chosen rows; the chat check runs again on a snapshot taken after the chat locks."""
        t = self.table
        claim_id = ", claim_id = b.claim_id" if self.fenced else ""
        payload = "CASE WHEN %(with_payload)s THEN u.payload END"
        return (
            f"UPDATE {t} AS u SET state = 1, attempt = u.attempt + 1, due_at = {NOW} + %(lease)s, "
            f"changed_at = {NOW}{claim_id} "
            "FROM unnest(%(ids)s::bigint[], %(claim_ids)b::text[]) AS b(update_id, claim_id) "
            f"WHERE u.update_id = b.update_id AND u.state < 2 AND u.due_at <= {NOW} AND {self._chat_free('u')} "
            f"RETURNING u.update_id, u.chat_id, u.attempt, b.claim_id, u.due_at, {payload}"
        )

    @property
    def exhaust_lapsed(self) -> str:
        """Rows whose attempts are spent: a pending row keeps its last error, a lapsed claim gets the reason."""
        return (
            f"UPDATE {self.table} AS u SET state = 3, acknowledged = false, changed_at = {NOW}, "
            "error = CASE WHEN u.state = 0 AND u.error IS NOT NULL THEN u.error ELSE b.reason END "
            "FROM unnest(%(ids)s::bigint[], %(reasons)b::text[]) AS b(update_id, reason) "
            "WHERE u.update_id = b.update_id"
        )

    @property
    def backlog(self) -> str:
        t = self.table
        return (
            f"SELECT (SELECT count(*) FROM {t} WHERE state < 2) - "
            f"(SELECT count(*) FROM {t} WHERE state = 0 AND due_at > 0 AND due_at > {NOW})"
        )
