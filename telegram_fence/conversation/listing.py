"""Read-only listings of the conversation tables, for the command line.

:func:`list_states` and :func:`list_steps` read through any connection (an APSW read-only connection, a psycopg
connection) and write nothing. May import the conversation's modules and the standard library (layer 3,
conversation).
"""

from __future__ import annotations

from typing import Any

from .sql import rows, statements_for
from .values import decode_data, decode_state

__all__ = ["list_states", "list_steps"]


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

