"""The PostgreSQL schema and statements of ``PostgresUpdateStore``, as text built from a table name.

May import only the standard library and :mod:`telegram_fence.errors` (no driver: the CLI prints
the schema without psycopg).

Every statement that needs "now" reads it through :data:`NOW`: the ``now`` parameter when the
store was given a ``clock=``, else the database server's ``statement_timestamp()`` (constant within
one statement, so a statement compares every row against the same instant). All hosts therefore
judge leases by one clock, whatever their own clocks say.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from ...errors import ConfigurationError

__all__ = ["NOW", "Statements", "base_table_sql", "lock_keys", "migration_sql", "schema_sql", "split_table"]

#: The current time in epoch seconds: the ``now`` parameter, or the server's clock when it is NULL.
NOW = "coalesce(%(now)s::float8, extract(epoch from statement_timestamp())::float8)"

_NAME = re.compile(r"^(?:([a-z_][a-z0-9_]{0,62})\.)?([a-z_][a-z0-9_]{0,39})$")

#: The columns the fenced and durable levels need beyond the base table (the "fenced columns" migration).
FENCED_COLUMNS = ("claim_id", "error", "acknowledged")
MIGRATION_NAME = "fenced columns (claim_id, error, acknowledged)"


def split_table(table: str) -> tuple[str | None, str]:
    """``(schema or None, name)`` of a table name; :class:`ConfigurationError` for a name that is not a
    lower-case SQL identifier (optionally ``schema.name``; the name at most 40 characters, so derived
    names stay within PostgreSQL's 63)."""
    match = _NAME.match(table) if isinstance(table, str) else None
    if match is None:
        raise ConfigurationError(
            f"table={table!r} is not usable: pass a lower-case identifier such as 'fence_updates' or "
            "'myschema.fence_updates' (letters, digits, underscores; the name at most 40 characters)"
        )
    return match.group(1), match.group(2)


def lock_keys(table: str) -> tuple[int, int]:
    """The two advisory-lock namespaces of ``table``: per-chat claim locks, and poller leadership."""

    def key(text: str) -> int:
        value = zlib.crc32(text.encode())
        return value - 2**32 if value >= 2**31 else value

    return key(f"telegram_fence:chat:{table}"), key(f"telegram_fence:leader:{table}")


def base_table_sql(table: str) -> str:
    """The inbox table as the base level needs it (no fenced columns): the layout older tables have."""
    split_table(table)
    return f"""CREATE TABLE IF NOT EXISTS {table} (
    update_id    bigint           PRIMARY KEY,
    payload      text             NOT NULL,
    chat_id      bigint,
    state        smallint         NOT NULL DEFAULT 0,
    attempt      integer          NOT NULL DEFAULT 0,
    due_at       double precision NOT NULL DEFAULT 0,
    recorded_at  double precision NOT NULL,
    changed_at   double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS {table}_meta (
    key    text   PRIMARY KEY,
    value  bigint NOT NULL
);
"""


def migration_sql(table: str) -> str:
    """The migration that adds the fenced columns and every index (idempotent)."""
    _schema, name = split_table(table)
    return f"""-- migration: {MIGRATION_NAME}
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS claim_id text;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS error text;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS acknowledged boolean NOT NULL DEFAULT false;
-- open rows in update_id order: what a claim scans
CREATE INDEX IF NOT EXISTS {name}_open ON {table} (update_id) WHERE state < 2;
-- live claims by chat: the per-chat exclusivity check
CREATE INDEX IF NOT EXISTS {name}_claimed_chat ON {table} (chat_id, due_at) WHERE state = 1;
-- open rows by chat in update_id order: "is an older update of this chat still open?"
CREATE INDEX IF NOT EXISTS {name}_open_chat ON {table} (chat_id, update_id) WHERE state < 2;
-- unacknowledged exhaustions, paged in update_id order
CREATE INDEX IF NOT EXISTS {name}_exhausted ON {table} (update_id) WHERE state = 3 AND NOT acknowledged;
-- finished rows by age: what prune deletes
CREATE INDEX IF NOT EXISTS {name}_finished ON {table} (changed_at) WHERE state >= 2;
-- rows put back with a delay (retries): what the backlog count leaves out
CREATE INDEX IF NOT EXISTS {name}_waiting ON {table} (due_at) WHERE state = 0 AND due_at > 0;
"""


def support_sql(table: str) -> str:
    """Poller generations, the leadership epoch and the capture outbox (idempotent)."""
    _schema, name = split_table(table)
    return f"""CREATE TABLE IF NOT EXISTS {table}_generations (
    generation   bigint           PRIMARY KEY,
    pid          integer          NOT NULL,
    host         text             NOT NULL DEFAULT '',
    started_at   double precision NOT NULL,
    progress_at  double precision,
    ended_at     double precision,
    end_reason   text
);
-- one row: the poller leadership epoch, raised by every process that becomes the leader
CREATE TABLE IF NOT EXISTS {table}_leader (
    id           integer          PRIMARY KEY CHECK (id = 1),
    epoch        bigint           NOT NULL,
    pid          integer,
    host         text,
    since        double precision,
    backend_pid  integer          -- the leader's session, which holds the advisory lock
);
INSERT INTO {table}_leader (id, epoch) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
-- the capture outbox (telegram_fence.delivery.outbox), written in the record transaction
CREATE TABLE IF NOT EXISTS {table}_outbox (
    key          text             PRIMARY KEY,
    update_id    bigint           NOT NULL,
    chat_id      bigint,
    payload      text             NOT NULL,
    state        text             NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'delivering', 'delivered', 'failed')),
    attempts     integer          NOT NULL DEFAULT 0,
    due_at       double precision NOT NULL DEFAULT 0,
    lease_until  double precision,
    claim_id     text,
    last_error   text,
    last_status  integer,
    answer       text,
    created_at   double precision NOT NULL,
    changed_at   double precision NOT NULL
);
CREATE INDEX IF NOT EXISTS {name}_outbox_due ON {table}_outbox (due_at) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS {name}_outbox_delivering ON {table}_outbox (lease_until) WHERE state = 'delivering';
-- conversations (telegram_fence.conversation): telebot's states and handler registrations, fenced
CREATE TABLE IF NOT EXISTS {table}_states (
    bot_id                 bigint           NOT NULL,
    business_connection_id text             NOT NULL,
    message_thread_id      bigint           NOT NULL,
    chat_id                bigint           NOT NULL,
    user_id                bigint           NOT NULL,
    state                  text             NOT NULL,
    data                   text             NOT NULL,
    update_id              bigint,
    changed_at             double precision NOT NULL,
    PRIMARY KEY (chat_id, user_id, bot_id, business_connection_id, message_thread_id)
);
CREATE TABLE IF NOT EXISTS {table}_steps (
    kind          text             NOT NULL CHECK (kind IN ('next_step', 'reply')),
    group_id      text             NOT NULL,
    seq           integer          NOT NULL,
    reference     text             NOT NULL,
    args          bytea,
    update_id     bigint,
    registered_at double precision NOT NULL,
    PRIMARY KEY (kind, group_id, seq)
);
CREATE INDEX IF NOT EXISTS {name}_steps_age ON {table}_steps (registered_at);
""" + calls_sql(table)


def calls_sql(table: str) -> str:
    """The call journal (telegram_fence.calls) beside ``table``: one row per journaled Bot API call, deleted
    with its update by a statement trigger; and the 429 pauses every host reads (idempotent)."""
    _schema, name = split_table(table)
    return f"""CREATE TABLE IF NOT EXISTS {table}_calls (
    update_id    bigint           NOT NULL,
    seq          integer          NOT NULL,
    method       text             NOT NULL,
    chat_id      bigint,
    fingerprint  text             NOT NULL,
    state        text             NOT NULL
                 CHECK (state IN ('intent', 'sent', 'refused', 'uncertain', 'queued')),
    attempt      integer          NOT NULL,
    claim_id     text,
    status       integer,
    answer       text,
    request      text,
    created_at   double precision NOT NULL,
    changed_at   double precision NOT NULL,
    PRIMARY KEY (update_id, seq)
);
CREATE INDEX IF NOT EXISTS {name}_calls_open ON {table}_calls (state) WHERE state IN ('uncertain', 'queued');
CREATE OR REPLACE FUNCTION {table}_calls_prune() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM {table}_calls WHERE update_id IN (SELECT update_id FROM gone);
    RETURN NULL;
END
$fn$;
CREATE OR REPLACE TRIGGER {name}_calls_pruned AFTER DELETE ON {table}
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION {table}_calls_prune();
CREATE TABLE IF NOT EXISTS {table}_pauses (
    scope        text             PRIMARY KEY,
    until        double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS {table}_buckets (
    scope        text             PRIMARY KEY,
    tokens       double precision NOT NULL,
    at           double precision NOT NULL
);
"""


def table_names(table: str = "fence_updates") -> tuple[str, ...]:
    """Every table the schema of ``table`` creates (the inbox first): what to drop to remove the store."""
    return (table, f"{table}_meta", f"{table}_generations", f"{table}_leader", f"{table}_outbox",
            f"{table}_states", f"{table}_steps", f"{table}_calls", f"{table}_pauses",
            f"{table}_buckets")


def schema_sql(table: str = "fence_updates") -> str:
    """The whole DDL for ``table``: tables, indexes, and the migration from an older table without the
    fenced columns. Idempotent: running it again, or on an older table, brings it to the current layout.

    Raises :class:`ConfigurationError` for a table name that is not a plain lower-case identifier.
    """
    return f"-- telegram_fence PostgreSQL schema for {table}\n" + (
        base_table_sql(table) + migration_sql(table) + support_sql(table)
    )


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

    # --- base ---------------------------------------------------------------------------------------

    @property
    def insert_batch(self) -> str:
        t = self.table
        return (
            f"INSERT INTO {t} (update_id, payload, chat_id, state, recorded_at, changed_at) "
            f"SELECT b.update_id, b.payload, b.chat_id, b.state, {NOW}, {NOW} "
            "FROM unnest(%(ids)s::bigint[], %(payloads)s::text[], %(chats)s::bigint[], %(states)s::smallint[]) "
            "AS b(update_id, payload, chat_id, state) "
            "ON CONFLICT (update_id) DO NOTHING RETURNING update_id"
        )

    @property
    def insert_claimed(self) -> str:
        """:attr:`insert_batch` where some rows are stored claimed (state 1, attempt 1, ``claim_id``, leased)."""
        t = self.table
        return (
            f"INSERT INTO {t} (update_id, payload, chat_id, state, attempt, claim_id, due_at, recorded_at, changed_at) "
            "SELECT b.update_id, b.payload, b.chat_id, b.state, (b.state = 1)::integer, b.claim_id, "
            f"CASE WHEN b.state = 1 THEN {NOW} + %(lease)s ELSE 0 END, {NOW}, {NOW} "
            "FROM unnest(%(ids)s::bigint[], %(payloads)s::text[], %(chats)s::bigint[], %(states)s::smallint[], "
            "%(claim_ids)s::text[]) AS b(update_id, payload, chat_id, state, claim_id) "
            "ON CONFLICT (update_id) DO NOTHING RETURNING update_id, due_at"
        )

    @property
    def open_chats(self) -> str:
        """Which of the given chats have an open row (pending or claimed): their new updates wait behind it."""
        return (
            "SELECT g.chat_id FROM unnest(%(chats)s::bigint[]) AS g(chat_id) WHERE EXISTS "
            f"(SELECT 1 FROM {self.table} AS o WHERE o.chat_id = g.chat_id AND o.state < 2)"
        )

    @property
    def differing_payloads(self) -> str:
        return (
            f"SELECT u.update_id FROM {self.table} AS u "
            "JOIN unnest(%(ids)s::bigint[], %(payloads)s::text[]) AS b(update_id, payload) "
            "ON u.update_id = b.update_id WHERE u.payload <> b.payload"
        )

    @property
    def add_payload_conflicts(self) -> str:
        """Count updates recorded again with another payload (the first kept): ``stats()``'s ``payload_conflicts``."""
        t = self.table
        return (
            f"INSERT INTO {t}_meta (key, value) VALUES ('payload_conflicts', %(count)s) "
            f"ON CONFLICT (key) DO UPDATE SET value = {t}_meta.value + excluded.value"
        )

    @property
    def poisoned(self) -> str:
        """The reasons of rows just stored as exhaustions because their updates cannot be stored or read."""
        return (
            f"UPDATE {self.table} AS u SET error = b.error, acknowledged = false "
            "FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS b(update_id, error) "
            "WHERE u.update_id = b.update_id AND u.state = 3"
        )

    @property
    def undecodable(self) -> str:
        """Rows just claimed whose payloads cannot be decoded become exhaustions without their payloads."""
        return (
            f"UPDATE {self.table} SET state = 3, acknowledged = false, changed_at = {NOW}, error = %(reason)s, "
            "payload = '{\"update_id\":' || update_id || '}' "
            "WHERE update_id = ANY(%(ids)s::bigint[]) AND state = 1"
        )

    @property
    def raise_cursor(self) -> str:
        t = self.table
        return (
            f"INSERT INTO {t}_meta (key, value) VALUES ('cursor', %(offset)s) "
            f"ON CONFLICT (key) DO UPDATE SET value = greatest({t}_meta.value, excluded.value)"
        )

    @property
    def read_cursor(self) -> str:
        return f"SELECT value FROM {self.table}_meta WHERE key = 'cursor'"

    def _chat_free(self, u: str) -> str:
        """Row ``u`` is its chat's next: no live claim in the chat, and no older open row due now (one
        locked by another claimer, or an expired claim, comes first: a chat's updates keep their order)."""
        t = self.table
        return (
            f"({u}.chat_id IS NULL OR (NOT EXISTS (SELECT 1 FROM {t} AS c WHERE c.chat_id = {u}.chat_id "
            f"AND c.state = 1 AND c.due_at > {NOW}) "
            f"AND NOT EXISTS (SELECT 1 FROM {t} AS o WHERE o.chat_id = {u}.chat_id AND o.state < 2 "
            f"AND o.update_id < {u}.update_id AND o.due_at <= {NOW})))"
        )

    def _lock(self, chosen: str) -> str:
        """Lock, oldest first, up to ``scan`` of the rows ``chosen`` (a query of update ids, run once on the
        statement's snapshot) that are still open, due and their chat's next, and try each locked row's chat lock.

        The ``LIMIT`` counts locked rows: a row another claimer holds is skipped (``SKIP LOCKED``) and the scan
        goes on to the next, so concurrent claimers take disjoint rows instead of all skipping the same first
        ones. The chat lock is tried only on rows this statement locked (the locking query is materialized
        before it).
        """
        return (
            f"WITH locked AS MATERIALIZED (SELECT u.update_id, u.chat_id, u.attempt FROM {self.table} AS u "
            f"WHERE u.update_id = ANY(ARRAY({chosen})) AND u.state < 2 AND u.due_at <= {NOW} "
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
        return self._lock(self._window())

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
            "FROM unnest(%(ids)s::bigint[], %(claim_ids)s::text[]) AS b(update_id, claim_id) "
            f"WHERE u.update_id = b.update_id AND u.state < 2 AND u.due_at <= {NOW} AND {self._chat_free('u')} "
            f"RETURNING u.update_id, u.chat_id, u.attempt, b.claim_id, u.due_at, {payload}"
        )

    @property
    def renew_step(self) -> str:
        return (
            f"UPDATE {self.table} SET due_at = greatest(due_at, {NOW} + %(lease)s) "
            f"WHERE update_id = %(u)s AND attempt = %(a)s AND state = 1 AND due_at > {NOW}"
        )

    @property
    def settle_step(self) -> str:
        return (
            f"UPDATE {self.table} SET state = 2, changed_at = {NOW} "
            f"WHERE update_id = %(u)s AND attempt = %(a)s AND state = 1 AND due_at > {NOW}"
        )

    @property
    def prune(self) -> str:
        acknowledged = " OR (state = 3 AND acknowledged)" if self.fenced else ""
        t = self.table
        # Never a row Telegram may still deliver again: one the cursor has not passed (the webhook stored it),
        # recorded within the redelivery window (%(window)s seconds).
        return (
            f"DELETE FROM {t} WHERE state >= 2 AND changed_at < %(before)s "
            f"AND (state IN (2, 4){acknowledged}) "
            f"AND NOT (update_id >= coalesce((SELECT value FROM {t}_meta WHERE key = 'cursor'), 0) "
            f"AND recorded_at > {NOW} - %(window)s)"
        )

    # --- fenced -------------------------------------------------------------------------------------

    _EXACT = "update_id = %(u)s AND attempt = %(a)s AND claim_id = %(c)s"
    _LIVE = f"state = 1 AND due_at > {NOW}"

    @property
    def owns(self) -> str:
        return (
            f"SELECT 1 FROM {self.table} WHERE {self._EXACT} AND state = 1 "
            f"AND due_at > coalesce(%(at)s::float8, {NOW})"
        )

    @property
    def lock_owned(self) -> str:
        """Lock the row of exactly this live claim (waits for another transaction's lock, bounded)."""
        return f"SELECT 1 FROM {self.table} WHERE {self._EXACT} AND {self._LIVE} FOR NO KEY UPDATE"

    @property
    def renew_owned(self) -> str:
        return (
            f"UPDATE {self.table} SET due_at = greatest(due_at, {NOW} + %(lease)s) "
            f"WHERE {self._EXACT} AND {self._LIVE}"
        )

    @property
    def settle_owned(self) -> str:
        return f"UPDATE {self.table} SET state = 2, changed_at = {NOW} WHERE {self._EXACT} AND {self._LIVE}"

    @property
    def settle_locked(self) -> str:
        """Settle the claim whose row this transaction locked after checking it (the lease may end meanwhile)."""
        return f"UPDATE {self.table} SET state = 2, changed_at = {NOW} WHERE {self._EXACT} AND state = 1"

    @property
    def retry_owned(self) -> str:
        return (
            f"UPDATE {self.table} SET state = 0, due_at = %(at)s, error = %(error)s, changed_at = {NOW} "
            f"WHERE {self._EXACT} AND {self._LIVE}"
        )

    @property
    def settle_many(self) -> str:
        return (
            f"UPDATE {self.table} AS u SET state = 2, changed_at = {NOW} "
            "FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(claim_ids)s::text[]) AS b(u, a, c) "
            f"WHERE u.update_id = b.u AND u.attempt = b.a AND u.claim_id = b.c AND u.state = 1 AND u.due_at > {NOW}"
        )

    @property
    def renew_many(self) -> str:
        """Renew the given live claims whose rows are not locked; return every given claim that is live.

        A live row locked by another transaction is its owner's fenced transaction at work (a claimer
        never locks a live claim): it is reported live without waiting for it, so one long transaction
        cannot hold up the renewal of every other claim.
        """
        t = self.table
        given = "unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(claim_ids)s::text[]) AS b(u, a, c)"
        exact = f"u.update_id = b.u AND u.attempt = b.a AND u.claim_id = b.c AND u.state = 1 AND u.due_at > {NOW}"
        return (
            f"WITH live AS (SELECT u.update_id FROM {t} AS u JOIN {given} ON {exact}), "
            f"free AS (SELECT u.update_id FROM {t} AS u JOIN {given} ON {exact} "
            "  FOR NO KEY UPDATE OF u SKIP LOCKED), "
            f"renewed AS (UPDATE {t} AS u SET due_at = greatest(u.due_at, {NOW} + %(lease)s) "
            "  FROM free WHERE u.update_id = free.update_id RETURNING u.update_id) "
            "SELECT update_id FROM live UNION SELECT update_id FROM renewed"
        )

    @property
    def release(self) -> str:
        return f"UPDATE {self.table} SET due_at = {NOW}, changed_at = {NOW} WHERE {self._EXACT} AND {self._LIVE}"

    @property
    def unclaim(self) -> str:
        return (
            f"UPDATE {self.table} SET state = 0, attempt = attempt - 1, due_at = {NOW}, changed_at = {NOW} "
            f"WHERE {self._EXACT} AND {self._LIVE}"
        )

    # --- durable ------------------------------------------------------------------------------------

    @property
    def exhaust_owned(self) -> str:
        return (
            f"UPDATE {self.table} SET state = 3, acknowledged = false, error = %(error)s, changed_at = {NOW} "
            f"WHERE {self._EXACT} AND {self._LIVE}"
        )

    @property
    def exhaust_lapsed(self) -> str:
        """Rows whose attempts are spent: a pending row keeps its last error, a lapsed claim gets the reason."""
        return (
            f"UPDATE {self.table} AS u SET state = 3, acknowledged = false, changed_at = {NOW}, "
            "error = CASE WHEN u.state = 0 AND u.error IS NOT NULL THEN u.error ELSE b.reason END "
            "FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS b(update_id, reason) "
            "WHERE u.update_id = b.update_id"
        )

    @property
    def due_exhaustions(self) -> str:
        return (
            f"SELECT update_id, attempt, claim_id, payload, chat_id, error, changed_at FROM {self.table} "
            "WHERE state = 3 AND NOT acknowledged AND update_id > %(after)s ORDER BY update_id LIMIT %(limit)s"
        )

    @property
    def acknowledge(self) -> str:
        """Acknowledge exactly this exhaustion; one the store made without a claim (an update it could not read
        or store) has no claim_id and is listed, and acknowledged, with claim_id ``""``."""
        return (
            f"UPDATE {self.table} SET acknowledged = true, changed_at = {NOW} "
            "WHERE update_id = %(u)s AND attempt = %(a)s AND coalesce(claim_id, '') = %(c)s "
            "AND state = 3 AND NOT acknowledged"
        )

    # --- runtime support ----------------------------------------------------------------------------

    @property
    def backlog(self) -> str:
        t = self.table
        return (
            f"SELECT (SELECT count(*) FROM {t} WHERE state < 2) - "
            f"(SELECT count(*) FROM {t} WHERE state = 0 AND due_at > 0 AND due_at > {NOW})"
        )

    @property
    def state_counts(self) -> str:
        acknowledged = "acknowledged" if self.fenced else "false"
        return f"SELECT state, {acknowledged}, count(*) FROM {self.table} GROUP BY 1, 2"

    @property
    def oldest_open(self) -> str:
        return f"SELECT min(recorded_at), {NOW} FROM {self.table} WHERE state < 2"
