"""Schema migrations of the SQLite file, keyed by ``PRAGMA user_version``.

Migration ``n`` takes the file from version ``n - 1`` to ``n``; :func:`migrate` applies every missing one and sets
``user_version`` in one ``BEGIN IMMEDIATE`` transaction, so two processes opening an old file serialise on the
write lock. A file newer than :data:`LATEST` is refused.
"""

from __future__ import annotations

import apsw

from ..errors import SchemaError

__all__ = ["LATEST", "MIGRATIONS", "migrate", "version_of"]

# States of an update row (fence_updates.state).
PENDING, CLAIMED, SETTLED, EXHAUSTED, SKIPPED = 0, 1, 2, 3, 4

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the inbox, its cursor, fenced claims and durable exhaustions.
    (
        """CREATE TABLE fence_updates(
            update_id    INTEGER PRIMARY KEY,
            payload      TEXT    NOT NULL,
            chat_id      INTEGER,
            state        INTEGER NOT NULL DEFAULT 0,
            attempt      INTEGER NOT NULL DEFAULT 0,
            claim_id     TEXT,
            due_at       REAL    NOT NULL DEFAULT 0,
            error        TEXT,
            recorded_at  REAL    NOT NULL,
            changed_at   REAL    NOT NULL,
            acknowledged INTEGER NOT NULL DEFAULT 0
        )""",
        # Open rows (pending or claimed) in update_id order: what a claim scans.
        "CREATE INDEX fence_updates_open ON fence_updates(update_id) WHERE state < 2",
        # Live claims by chat: the per-chat exclusivity check.
        "CREATE INDEX fence_updates_claimed_chat ON fence_updates(chat_id, due_at) WHERE state = 1",
        # Unacknowledged exhaustions, paged in update_id order.
        "CREATE INDEX fence_updates_exhausted ON fence_updates(update_id) WHERE state = 3 AND acknowledged = 0",
        # Finished rows by age: what prune deletes.
        "CREATE INDEX fence_updates_finished ON fence_updates(changed_at) WHERE state >= 2",
        "CREATE TABLE fence_meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID",
    ),
    # 2: poller generations, so a health check tells the running poller's progress from an old one's.
    (
        """CREATE TABLE fence_generations(
            generation  INTEGER PRIMARY KEY,
            pid         INTEGER NOT NULL,
            started_at  REAL    NOT NULL,
            progress_at REAL,
            ended_at    REAL,
            end_reason  TEXT
        )""",
    ),
    # 3: the capture outbox, written in the same transaction as the updates it captures.
    (
        """CREATE TABLE fence_outbox(
            key          TEXT    PRIMARY KEY,
            update_id    INTEGER NOT NULL,
            chat_id      INTEGER,
            payload      TEXT    NOT NULL,
            state        TEXT    NOT NULL DEFAULT 'pending'
                         CHECK (state IN ('pending', 'delivering', 'delivered', 'failed')),
            attempts     INTEGER NOT NULL DEFAULT 0,
            due_at       REAL    NOT NULL DEFAULT 0,
            lease_until  REAL,
            claim_id     TEXT,
            last_error   TEXT,
            last_status  INTEGER,
            answer       TEXT,
            created_at   REAL    NOT NULL,
            changed_at   REAL    NOT NULL
        )""",
        "CREATE INDEX fence_outbox_due ON fence_outbox(due_at) WHERE state = 'pending'",
        "CREATE INDEX fence_outbox_delivering ON fence_outbox(lease_until) WHERE state = 'delivering'",
    ),
    # 4: open rows by chat in update_id order: a chat's next update is found without scanning the
    # whole backlog (the dispatcher asks for the chats that were just freed or just received work).
    # Pending rows put back with a delay (retries): what the backlog count leaves out, without a scan.
    (
        "CREATE INDEX fence_updates_open_chat ON fence_updates(chat_id, update_id) WHERE state < 2",
        "CREATE INDEX fence_updates_waiting ON fence_updates(due_at) WHERE state = 0 AND due_at > 0",
    ),
    # 5: conversations (telegram_fence.conversation): telebot's states with their data, and next-step and
    # reply handler registrations, written in the transaction of the update that changed them.
    (
        """CREATE TABLE fence_states(
            bot_id                 INTEGER NOT NULL,
            business_connection_id TEXT    NOT NULL,
            message_thread_id      INTEGER NOT NULL,
            chat_id                INTEGER NOT NULL,
            user_id                INTEGER NOT NULL,
            state                  TEXT    NOT NULL,
            data                   TEXT    NOT NULL,
            update_id              INTEGER,
            changed_at             REAL    NOT NULL,
            PRIMARY KEY (chat_id, user_id, bot_id, business_connection_id, message_thread_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE fence_steps(
            kind          TEXT    NOT NULL CHECK (kind IN ('next_step', 'reply')),
            group_id      TEXT    NOT NULL,
            seq           INTEGER NOT NULL,
            reference     TEXT    NOT NULL,
            args          BLOB,
            update_id     INTEGER,
            registered_at REAL    NOT NULL,
            PRIMARY KEY (kind, group_id, seq)
        ) WITHOUT ROWID""",
        "CREATE INDEX fence_steps_age ON fence_steps(registered_at)",
    ),
    # 6: the call journal (telegram_fence.calls): every Bot API call a handler made, keyed by its update and
    # its position in the handler, deleted with its update; and the rate-limit pauses a 429 asked for.
    (
        """CREATE TABLE fence_calls(
            update_id   INTEGER NOT NULL,
            seq         INTEGER NOT NULL,
            method      TEXT    NOT NULL,
            chat_id     INTEGER,
            fingerprint TEXT    NOT NULL,
            state       TEXT    NOT NULL
                        CHECK (state IN ('intent', 'sent', 'refused', 'uncertain', 'queued')),
            attempt     INTEGER NOT NULL,
            claim_id    TEXT,
            status      INTEGER,
            answer      TEXT,
            request     TEXT,
            created_at  REAL    NOT NULL,
            changed_at  REAL    NOT NULL,
            PRIMARY KEY (update_id, seq)
        ) WITHOUT ROWID""",
        "CREATE INDEX fence_calls_open ON fence_calls(state) WHERE state IN ('uncertain', 'queued')",
        """CREATE TRIGGER fence_calls_pruned AFTER DELETE ON fence_updates
           BEGIN DELETE FROM fence_calls WHERE update_id = OLD.update_id; END""",
        "CREATE TABLE fence_pauses(scope TEXT PRIMARY KEY, until REAL NOT NULL) WITHOUT ROWID",
    ),
    # 7: the proactive rate limits' token buckets, shared by every process of the bot (telegram_fence.calls).
    (
        "CREATE TABLE fence_buckets(scope TEXT PRIMARY KEY, tokens REAL NOT NULL, at REAL NOT NULL) WITHOUT ROWID",
    ),
    # 8: durable steps (telegram_fence.steps): a handler's call to another service, keyed by its update and the
    # step's name: the intent, then the recorded result; deleted with its update.
    (
        """CREATE TABLE fence_step_results(
            update_id   INTEGER NOT NULL,
            name        TEXT    NOT NULL,
            state       TEXT    NOT NULL CHECK (state IN ('intent', 'done', 'failed', 'uncertain')),
            attempt     INTEGER NOT NULL,
            claim_id    TEXT,
            runs        INTEGER NOT NULL DEFAULT 1,
            result      TEXT,
            created_at  REAL    NOT NULL,
            changed_at  REAL    NOT NULL,
            PRIMARY KEY (update_id, name)
        ) WITHOUT ROWID""",
        "CREATE INDEX fence_step_results_open ON fence_step_results(state) WHERE state IN ('intent', 'uncertain')",
        """CREATE TRIGGER fence_step_results_pruned AFTER DELETE ON fence_updates
           BEGIN DELETE FROM fence_step_results WHERE update_id = OLD.update_id; END""",
    ),
)

#: The schema version this library writes.
LATEST = len(MIGRATIONS)


def version_of(conn: apsw.Connection) -> int:
    """The file's ``user_version`` (0 for a new file)."""
    return int(conn.pragma("user_version"))


def migrate(conn: apsw.Connection, target: int = LATEST) -> int:
    """Bring the file to ``target`` in one IMMEDIATE transaction; return the version it ends on. Raises
    :class:`SchemaError` for a file newer than this library, or a failed migration (nothing changed)."""
    if not 0 <= target <= LATEST:
        raise SchemaError(f"no schema version {target}: this library knows versions 0 to {LATEST}")
    current = version_of(conn)
    if current == target:
        return current
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = version_of(conn)  # re-read under the write lock: another process may have upgraded it
        if current > LATEST:
            raise SchemaError(
                f"database schema version {current} is newer than this library supports ({LATEST}); "
                "upgrade telegram_fence, or open a file written by this version"
            )
        for version in range(current + 1, target + 1):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement)
        if target > current:
            conn.pragma("user_version", target)
    except SchemaError:
        conn.execute("ROLLBACK")
        raise
    except apsw.Error as exc:
        conn.execute("ROLLBACK")
        raise SchemaError(f"migrating the database from version {current} to {target} failed: {exc}") from exc
    conn.execute("COMMIT")
    return max(current, target)
