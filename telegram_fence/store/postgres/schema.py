"""The PostgreSQL schema of ``PostgresUpdateStore`` as text built from a table name: the tables, their migration,
the names derived from the inbox table, and the clock every statement reads.

May import only the standard library and :mod:`telegram_fence.errors` (no driver: the CLI prints the schema
without psycopg). Every statement that needs "now" reads it through :data:`NOW`: the ``now`` parameter when the
store was given a ``clock=``, else the database server's ``statement_timestamp()`` (constant within one
statement), so all hosts judge leases by one clock, whatever their own clocks say.
"""

from __future__ import annotations

import re
import zlib

from ...errors import ConfigurationError

__all__ = ["FENCED_COLUMNS", "NOW", "lock_keys", "schema_sql", "split_table", "table_names"]

#: The current time in epoch seconds: the ``now`` parameter, or the server's clock when it is NULL.
NOW = "coalesce(%(now)s::float8, extract(epoch from statement_timestamp())::float8)"

_NAME = re.compile(r"^(?:([a-z_][a-z0-9_]{0,62})\.)?([a-z_][a-z0-9_]{0,39})$")

#: The columns the fenced and durable levels need beyond the base table (the "fenced columns" migration).
FENCED_COLUMNS = ("claim_id", "error", "acknowledged")


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


#: The whole DDL (``{table}``: the inbox table, ``{name}``: its name without the schema, for the indexes). The base
#: tables come first; the migration that follows brings an older inbox without the fenced columns up to date.
_SCHEMA = """CREATE TABLE IF NOT EXISTS {table} (
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
-- migration: fenced columns (claim_id, error, acknowledged)
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
CREATE TABLE IF NOT EXISTS {table}_generations (
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
-- the call journal (telegram_fence.calls), deleted with its update by a statement trigger; the 429 pauses
CREATE TABLE IF NOT EXISTS {table}_calls (
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
-- durable steps (telegram_fence.steps): the intent, then the result, deleted with its update
CREATE TABLE IF NOT EXISTS {table}_step_results (
    update_id    bigint           NOT NULL,
    name         text             NOT NULL,
    state        text             NOT NULL CHECK (state IN ('intent', 'done', 'failed', 'uncertain')),
    attempt      integer          NOT NULL,
    claim_id     text,
    runs         integer          NOT NULL DEFAULT 1,
    result       text,
    created_at   double precision NOT NULL,
    changed_at   double precision NOT NULL,
    PRIMARY KEY (update_id, name)
);
CREATE INDEX IF NOT EXISTS {name}_step_results_open ON {table}_step_results (state)
    WHERE state IN ('intent', 'uncertain');
CREATE OR REPLACE FUNCTION {table}_step_results_prune() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM {table}_step_results WHERE update_id IN (SELECT update_id FROM gone);
    RETURN NULL;
END
$fn$;
CREATE OR REPLACE TRIGGER {name}_step_results_pruned AFTER DELETE ON {table}
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION {table}_step_results_prune();
"""


def table_names(table: str = "fence_updates") -> tuple[str, ...]:
    """Every table the schema of ``table`` creates (the inbox first): what to drop to remove the store."""
    return (table, f"{table}_meta", f"{table}_generations", f"{table}_leader", f"{table}_outbox",
            f"{table}_states", f"{table}_steps", f"{table}_calls", f"{table}_pauses",
            f"{table}_buckets", f"{table}_step_results")


def schema_sql(table: str = "fence_updates") -> str:
    """The whole DDL for ``table``: tables, indexes, and the migration from an older table without the
    fenced columns. Idempotent: running it again, or on an older table, brings it to the current layout.

    Raises :class:`ConfigurationError` for a table name that is not a plain lower-case identifier.
    """
    _schema, name = split_table(table)
    return f"-- telegram_fence PostgreSQL schema for {table}\n" + _SCHEMA.format(table=table, name=name)
