"""The conversation tables' statements on either backend: written for SQLite (APSW), adapted once for psycopg.

On SQLite the tables are ``fence_states`` and ``fence_steps`` (schema version 5, ``store.schema``); on PostgreSQL
they sit beside the inbox as ``{table}_states`` and ``{table}_steps`` (``store.postgres.sql``). A psycopg
connection lent by a :class:`~telegram_fence.store.postgres.PostgresUpdateStore` has its outbox (``{table}_outbox``)
noted beside it (:func:`telegram_fence.store.tables.outbox_table`), which is how :func:`statements_for` finds the
tables. :func:`rows` runs a statement on either kind of connection and returns every row (a cursor is never left
open), raising the driver's failures as the store's errors (``store.sqlite.failures.translate``,
``store.postgres.connection.translated``), importing neither APSW nor the SQLite store before an APSW connection
exists. May import APSW, the standard library, ``store.tables`` and those two
(layer 3, conversation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..store.tables import is_sqlite, outbox_table

__all__ = ["SQLITE", "STATEMENT_NAMES", "Statements", "rows", "statements_for"]


class Statements:
    """Every statement of the conversation tables, for one backend and one pair of table names.

    The class attributes are the SQLite texts (:data:`SQLITE`); ``Statements(**texts)`` overrides those named (for
    PostgreSQL: :func:`statements_for`). Not changed after it is made. (A plain class: a dataclass of these fields
    cost ≈ 1 ms of every ``import telegram_fence`` that loads conversations.)
    """

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
    """Run ``statement`` on ``conn`` (either kind) and return all its rows (none for a write).

    The driver's failures are raised as the store's :class:`~telegram_fence.errors.StoreError` subclasses (a
    lost server or a lock as ``StoreUnavailable``, a missing table on PostgreSQL as ``SchemaError``), as every
    statement of the store is: this is the conversation tables' boundary."""
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
