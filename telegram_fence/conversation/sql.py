"""The conversation tables' statements on either backend (written for SQLite, adapted once for psycopg), and the
read-only listings of them for the command line.

The tables are ``fence_states`` and ``fence_steps``; on PostgreSQL ``{table}_states`` and ``{table}_steps`` beside
the inbox of the store that lent the connection. :func:`rows` raises the driver's failures as the store's errors.
May import APSW, ``store.tables``, the stores' failure translation, :mod:`.values` and the standard library (layer
3, conversation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..store.tables import is_sqlite, outbox_table
from .values import decode_data, decode_state

__all__ = ["SQLITE", "STATEMENT_NAMES", "Statements", "list_states", "list_steps", "rows", "statements_for"]


class Statements:
    """Every statement of the conversation tables: the class attributes are the SQLite texts, ``Statements(**texts)``
    overrides those named (PostgreSQL's). A plain class: a dataclass cost ≈ 1 ms of import."""

    select_state = (
        "SELECT state, data FROM fence_states WHERE bot_id = ? AND business_connection_id = ? "
        "AND message_thread_id = ? AND chat_id = ? AND user_id = ?"
    )
    upsert_state = (
        "INSERT INTO fence_states (bot_id, business_connection_id, message_thread_id, chat_id, user_id, state, "
        "data, update_id, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (chat_id, user_id, bot_id, business_connection_id, message_thread_id) DO UPDATE SET "
        "state = excluded.state, data = excluded.data, update_id = excluded.update_id, changed_at = excluded.changed_at"
    )
    delete_state = (
        "DELETE FROM fence_states WHERE bot_id = ? AND business_connection_id = ? AND message_thread_id = ? "
        "AND chat_id = ? AND user_id = ?"
    )
    select_steps = (
        "SELECT reference, args FROM fence_steps WHERE kind = ? AND group_id = ? ORDER BY seq"
    )
    delete_steps = "DELETE FROM fence_steps WHERE kind = ? AND group_id = ?"
    # what a message's handling reads, in one statement: the sender's state, the chat's next-step handlers and
    # the handlers waiting for a reply to the message it replies to ('' when none)
    prefetch = (
        "SELECT 0, 0, state, data, NULL FROM fence_states WHERE bot_id = ? AND business_connection_id = ? "
        "AND message_thread_id = ? AND chat_id = ? AND user_id = ? "
        "UNION ALL SELECT 1, seq, reference, NULL, args FROM fence_steps WHERE kind = 'next_step' AND group_id = ? "
        "UNION ALL SELECT 2, seq, reference, NULL, args FROM fence_steps WHERE kind = 'reply' AND group_id = ?"
    )  # no ORDER BY (it costs two sorts): the reader orders the handlers by seq
    # which of the chats (a JSON list of ids) have a state or next-step handlers stored, and which of the messages
    # (a JSON list of ids) have reply handlers waiting: one statement per dispatcher round (quiet.py)
    busy = (
        "SELECT 0, j.value FROM json_each(?) AS j WHERE EXISTS (SELECT 1 FROM fence_states AS s "
        "WHERE s.chat_id = j.value) OR EXISTS (SELECT 1 FROM fence_steps AS t WHERE t.kind = 'next_step' "
        "AND t.group_id = CAST(j.value AS TEXT)) "
        "UNION ALL SELECT 1, j.value FROM json_each(?) AS j WHERE EXISTS (SELECT 1 FROM fence_steps AS t "
        "WHERE t.kind = 'reply' AND t.group_id = CAST(j.value AS TEXT))"
    )
    insert_step = (
        "INSERT INTO fence_steps (kind, group_id, seq, reference, args, update_id, registered_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)"
    )
    list_states = (
        "SELECT bot_id, business_connection_id, message_thread_id, chat_id, user_id, state, data, update_id, "
        "changed_at FROM fence_states ORDER BY chat_id, user_id, bot_id, business_connection_id, message_thread_id"
    )
    list_states_of_chat = (
        "SELECT bot_id, business_connection_id, message_thread_id, chat_id, user_id, state, data, update_id, "
        "changed_at FROM fence_states WHERE chat_id = ? "
        "ORDER BY chat_id, user_id, bot_id, business_connection_id, message_thread_id"
    )
    list_steps = (
        "SELECT kind, group_id, seq, reference, update_id, registered_at FROM fence_steps "
        "ORDER BY kind, group_id, seq"
    )
    list_steps_of_chat = (
        "SELECT kind, group_id, seq, reference, update_id, registered_at FROM fence_steps "
        "WHERE kind = 'next_step' AND group_id = ? ORDER BY kind, group_id, seq"
    )
    count_old_steps = "SELECT count(*) FROM fence_steps WHERE registered_at < ?"
    prune_steps = "DELETE FROM fence_steps WHERE registered_at < ?"

    def __init__(self, **texts: str) -> None:
        unknown = sorted(set(texts) - set(STATEMENT_NAMES))
        if unknown:
            raise TypeError(f"Statements() has no statement {unknown[0]!r}")
        self.__dict__.update(texts)


#: The names of the statements (the text attributes of :class:`Statements`), in the order written.
STATEMENT_NAMES = tuple(name for name, value in vars(Statements).items() if isinstance(value, str)
                        and not name.startswith("_"))


SQLITE = Statements()
_postgres: dict[str, Statements] = {}


#: Statements whose PostgreSQL text differs by more than the table names and the placeholders.
_POSTGRES_TEXT = {
    "busy": (
        "SELECT 0, j.value FROM json_array_elements_text(?::json) AS j(value) WHERE EXISTS (SELECT 1 "
        "FROM fence_states AS s WHERE s.chat_id = j.value::bigint) OR EXISTS (SELECT 1 FROM fence_steps AS t "
        "WHERE t.kind = 'next_step' AND t.group_id = j.value) "
        "UNION ALL SELECT 1, j.value FROM json_array_elements_text(?::json) AS j(value) WHERE EXISTS (SELECT 1 "
        "FROM fence_steps AS t WHERE t.kind = 'reply' AND t.group_id = j.value)"
    ),
}


def _for_postgres(table: str) -> Statements:
    """The statements with the PostgreSQL tables of inbox ``table`` and psycopg's placeholders."""
    done = _postgres.get(table)
    if done is None:
        texts = {}
        for name in STATEMENT_NAMES:
            text = _POSTGRES_TEXT.get(name) or getattr(SQLITE, name)
            text = text.replace("fence_states", f"{table}_states").replace("fence_steps", f"{table}_steps")
            texts[name] = text.replace("?", "%s")
        done = _postgres[table] = Statements(**texts)
    return done


def statements_for(conn: Any) -> Statements:
    """The statements for ``conn``: an APSW connection (SQLite) or a psycopg connection of a PostgreSQL store."""
    if is_sqlite(conn):
        return SQLITE
    outbox = str(outbox_table(conn, "fence_updates_outbox"))
    return _for_postgres(outbox.removesuffix("_outbox"))


def rows(conn: Any, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run ``statement`` on ``conn`` (either kind) and return all its rows; the driver's failures raise as the
    store's :class:`~telegram_fence.errors.StoreError` subclasses."""
    if is_sqlite(conn):  # (imported here, once an APSW connection exists: a PostgreSQL-only process never loads them)
        import apsw

        from ..store.sqlite.failures import translate

        try:
            return [tuple(row) for row in conn.execute(statement, tuple(params))]
        except (apsw.Error, UnicodeError) as exc:
            raise translate(exc, conn.filename) from exc
    from ..store.postgres.connection import translated  # a psycopg connection: psycopg is loaded already

    with translated("conversations"):
        cursor = conn.execute(statement, tuple(params))
        if cursor.description is None:
            return []
        return [tuple(row) for row in cursor.fetchall()]


def list_states(conn: Any, chat_id: int | None = None) -> list[dict[str, Any]]:
    """Every stored state (of ``chat_id`` only when given), ordered by chat and user, as plain dicts."""
    sql = statements_for(conn)
    found = rows(conn, sql.list_states) if chat_id is None else rows(conn, sql.list_states_of_chat, (chat_id,))
    result = []
    for bot_id, business, thread, chat, user, state, data, update_id, changed_at in found:
        result.append({
            "chat_id": int(chat), "user_id": int(user), "bot_id": int(bot_id) or None,
            "business_connection_id": str(business) or None, "message_thread_id": int(thread) or None,
            "state": decode_state(str(state)), "data": decode_data(str(data)),
            "update_id": None if update_id is None else int(update_id), "changed_at": float(changed_at),
        })
    return result


def list_steps(conn: Any, chat_id: int | None = None) -> list[dict[str, Any]]:
    """Every stored handler registration (the next-step handlers of ``chat_id`` only when given), as plain dicts:
    ``kind`` (``next_step``/``reply``), ``group`` (chat id or message id), ``seq``, ``callback`` (its reference;
    ``memory:…`` for one kept in a process's memory), ``update_id``, ``registered_at``."""
    sql = statements_for(conn)
    found = rows(conn, sql.list_steps) if chat_id is None else rows(conn, sql.list_steps_of_chat, (str(chat_id),))
    return [
        {"kind": str(kind), "group": str(group), "seq": int(seq), "callback": str(reference),
         "update_id": None if update_id is None else int(update_id), "registered_at": float(registered_at)}
        for kind, group, seq, reference, update_id, registered_at in found
    ]

