"""The conversation tables' statements on either backend (written once for SQLite, adapted for psycopg), and the
read-only listings of them for the command line.

The tables are ``fence_states`` and ``fence_steps``; on PostgreSQL ``{table}_states`` and ``{table}_steps`` beside
the inbox of the store that lent the connection (:func:`~telegram_fence.calls.journal.pg_text`). :func:`rows`
raises the driver's failures as the store's errors. May import APSW, ``store.tables``, the stores' failure
translation, ``calls.journal`` (the dialect), :mod:`.values` and the standard library (layer 3, conversation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..calls.journal import pg_text
from ..store.tables import is_sqlite, outbox_table
from .values import decode_data, decode_state

__all__ = ["BUSY", "DELETE_STATE", "DELETE_STEPS", "INSERT_STEP", "PREFETCH", "PRUNE_STEPS", "SELECT_STATE",
           "SELECT_STEPS", "UPSERT_STATE", "list_states", "list_steps", "rows"]

_KEY = "bot_id = ? AND business_connection_id = ? AND message_thread_id = ? AND chat_id = ? AND user_id = ?"
SELECT_STATE = f"SELECT state, data FROM fence_states WHERE {_KEY}"
UPSERT_STATE = (
    "INSERT INTO fence_states (bot_id, business_connection_id, message_thread_id, chat_id, user_id, state, "
    "data, update_id, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (chat_id, user_id, bot_id, business_connection_id, message_thread_id) DO UPDATE SET "
    "state = excluded.state, data = excluded.data, update_id = excluded.update_id, changed_at = excluded.changed_at"
)
DELETE_STATE = f"DELETE FROM fence_states WHERE {_KEY}"
SELECT_STEPS = "SELECT reference, args FROM fence_steps WHERE kind = ? AND group_id = ? ORDER BY seq"
DELETE_STEPS = "DELETE FROM fence_steps WHERE kind = ? AND group_id = ?"
INSERT_STEP = ("INSERT INTO fence_steps (kind, group_id, seq, reference, args, update_id, registered_at) "
               "VALUES (?, ?, ?, ?, ?, ?, ?)")
PRUNE_STEPS = "DELETE FROM fence_steps WHERE registered_at < ? RETURNING seq"
# What a message's handling reads, in one statement: the sender's state, the chat's next-step handlers and the
# handlers waiting for a reply to the message it replies to ('' when none). No ORDER BY: the reader sorts by seq.
PREFETCH = (
    f"SELECT 0, 0, state, data, NULL FROM fence_states WHERE {_KEY} "
    "UNION ALL SELECT 1, seq, reference, NULL, args FROM fence_steps WHERE kind = 'next_step' AND group_id = ? "
    "UNION ALL SELECT 2, seq, reference, NULL, args FROM fence_steps WHERE kind = 'reply' AND group_id = ?"
)
# Which of the chats (a JSON list of ids) have a state or next-step handlers stored, and which of the messages (a
# JSON list of ids) have reply handlers waiting: one statement per dispatcher round (extension.py).
BUSY = (
    "SELECT 0, j.value FROM json_each(?) AS j WHERE EXISTS (SELECT 1 FROM fence_states AS s "
    "WHERE s.chat_id = j.value) OR EXISTS (SELECT 1 FROM fence_steps AS t WHERE t.kind = 'next_step' "
    "AND t.group_id = CAST(j.value AS TEXT)) "
    "UNION ALL SELECT 1, j.value FROM json_each(?) AS j WHERE EXISTS (SELECT 1 FROM fence_steps AS t "
    "WHERE t.kind = 'reply' AND t.group_id = CAST(j.value AS TEXT))"
)
#: Statements whose PostgreSQL text differs by more than the table names and the placeholders.
_POSTGRES = {BUSY: (
    "SELECT 0, j.value FROM json_array_elements_text(CAST(? AS json)) AS j(value) WHERE EXISTS (SELECT 1 "
    "FROM fence_states AS s WHERE s.chat_id = CAST(j.value AS bigint)) OR EXISTS (SELECT 1 FROM fence_steps AS t "
    "WHERE t.kind = 'next_step' AND t.group_id = j.value) "
    "UNION ALL SELECT 1, j.value FROM json_array_elements_text(CAST(? AS json)) AS j(value) WHERE EXISTS (SELECT 1 "
    "FROM fence_steps AS t WHERE t.kind = 'reply' AND t.group_id = j.value)"
)}


def rows(conn: Any, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run ``statement`` (SQLite's text) on ``conn`` (either kind) and return all its rows; the driver's failures
    raise as the store's :class:`~telegram_fence.errors.StoreError` subclasses."""
    if is_sqlite(conn):  # (imported here, once an APSW connection exists: a PostgreSQL-only process never loads them)
        import apsw

        from ..store.sqlite.failures import translate

        try:
            return [tuple(row) for row in conn.execute(statement, tuple(params))]
        except (apsw.Error, UnicodeError) as exc:
            raise translate(exc, conn.filename) from exc
    from ..store.postgres.connection import translated  # a psycopg connection: psycopg is loaded already

    table = str(outbox_table(conn, "fence_updates_outbox")).removesuffix("_outbox")
    with translated("conversations"):
        cursor = conn.execute(pg_text(_POSTGRES.get(statement, statement), table), tuple(params))
        if cursor.description is None:
            return []
        return [tuple(row) for row in cursor.fetchall()]


def list_states(conn: Any, chat_id: int | None = None) -> list[dict[str, Any]]:
    """Every stored state (of ``chat_id`` only when given), ordered by chat and user, as plain dicts."""
    found = rows(conn, "SELECT bot_id, business_connection_id, message_thread_id, chat_id, user_id, state, data, "
                 "update_id, changed_at FROM fence_states" + (" WHERE chat_id = ?" if chat_id is not None else "")
                 + " ORDER BY chat_id, user_id, bot_id, business_connection_id, message_thread_id",
                 () if chat_id is None else (chat_id,))
    return [{"chat_id": int(chat), "user_id": int(user), "bot_id": int(bot_id) or None,
             "business_connection_id": str(business) or None, "message_thread_id": int(thread) or None,
             "state": decode_state(str(state)), "data": decode_data(str(data)),
             "update_id": None if update_id is None else int(update_id), "changed_at": float(changed_at)}
            for bot_id, business, thread, chat, user, state, data, update_id, changed_at in found]


def list_steps(conn: Any, chat_id: int | None = None) -> list[dict[str, Any]]:
    """Every stored handler registration (the next-step handlers of ``chat_id`` only when given), as plain dicts:
    ``kind``, ``group`` (chat or message id), ``seq``, ``callback`` (its reference), ``update_id``,
    ``registered_at``."""
    found = rows(conn, "SELECT kind, group_id, seq, reference, update_id, registered_at FROM fence_steps"
                 + (" WHERE kind = 'next_step' AND group_id = ?" if chat_id is not None else "")
                 + " ORDER BY kind, group_id, seq", () if chat_id is None else (str(chat_id),))
    return [{"kind": str(kind), "group": str(group), "seq": int(seq), "callback": str(reference),
             "update_id": None if update_id is None else int(update_id), "registered_at": float(registered_at)}
            for kind, group, seq, reference, update_id, registered_at in found]
