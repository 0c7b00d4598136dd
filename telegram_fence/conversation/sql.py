"""The conversation tables on either backend: their statements (written once for SQLite, adapted for psycopg),
reading them, the changes of one attempt not yet committed and writing them, and the listings for the command line.

A :class:`Pending` answers a read from its own changes, then from what it read before, then from its :class:`Loader`.

The tables are ``fence_states`` and ``fence_steps``; on PostgreSQL ``{table}_states`` and ``{table}_steps`` beside
the inbox of the store that lent the connection (:func:`~telegram_fence.calls.journal.pg_text`). :func:`rows`
raises the driver's failures as the store's errors. May import APSW, ``store.tables``, the stores' failure
translation, ``calls.journal`` (the dialect), ``records``, :mod:`.values` and the standard library (layer 3,
conversation).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..calls.journal import run
from ..records import Record
from ..store.tables import is_sqlite
from .values import StateKey, decode_data, decode_state, int64_of

__all__ = ["NEXT_STEP", "PRUNE_STEPS", "REPLY", "Entry", "GroupKey", "Loader", "Pending", "Row", "list_states",
           "list_steps", "rows"]

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

        from ..store.sqlite.connection import translate

        try:
            return run(conn, statement, params)
        except (apsw.Error, UnicodeError) as exc:
            raise translate(exc, conn.filename) from exc
    from ..store.postgres.connection import translated  # a psycopg connection: psycopg is loaded already

    with translated("conversations"):
        return run(conn, _POSTGRES.get(statement, statement), params)


#: A state as stored: ``(state JSON, data JSON)``.
Row = tuple[str, str]
#: A group of handlers: ``("next_step", str(chat_id))`` or ``("reply", str(message_id))``.
GroupKey = tuple[str, str]

NEXT_STEP = "next_step"
REPLY = "reply"


class Entry(Record):
    """One registered handler: its reference (``module:name``, or ``memory:…``), its pickled arguments, and the
    telebot ``Handler`` when this process has it."""

    __slots__ = ("args", "handler", "reference")
    reference: str
    args: bytes | None
    handler: Any

    def __init__(self, reference: str, args: bytes | None, handler: Any = None) -> None:
        for field, value in zip(self._fields, (reference, args, handler), strict=True):
            object.__setattr__(self, field, value)


class Loader:
    """Reads of the conversation tables, each on the connection ``open()`` gives (the store's ``read()``, or the
    caller's open transaction)."""

    def __init__(self, open: Callable[[], AbstractContextManager[Any]]) -> None:
        self._open = open

    def _rows(self, statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._open() as conn:
            return rows(conn, statement, params)

    def read_ahead(self, pending: Pending, key: StateKey | None, chat: str, replied: str) -> None:
        """Read the state of ``key`` and the handlers of ``chat`` and ``replied`` in one statement into ``pending``."""
        state: Row | None = None
        found: tuple[list[tuple[int, Entry]], list[tuple[int, Entry]]] = ([], [])
        params = key.params() if key is not None else (0, "", 0, 0, 0)
        for part, seq, text, data, args in self._rows(PREFETCH, (*params, chat, replied)):
            if part == 0:
                state = (str(text), str(data)) if key is not None else None
            else:
                found[part - 1].append((int(seq), Entry(str(text), None if args is None else bytes(args))))
        steps, replies = ([entry for _seq, entry in sorted(part, key=lambda item: item[0])] for part in found)
        groups: dict[GroupKey, list[Entry]] = {}
        if chat:
            groups[(NEXT_STEP, chat)] = steps
        if replied:
            groups[(REPLY, replied)] = replies
        pending.known(key, state, groups)

    def busy(self, chats: Iterable[int], replies: Iterable[int]) -> tuple[set[int], set[int]]:
        """In one statement: which of ``chats`` have a state or next-step handlers, which ``replies`` reply handlers."""
        found = self._rows(BUSY, (json.dumps(sorted(chats)), json.dumps(sorted(replies))))
        return {int(value) for part, value in found if part == 0}, {int(value) for part, value in found if part == 1}

    def state(self, key: StateKey) -> Row | None:
        found = self._rows(SELECT_STATE, key.params())
        return (str(found[0][0]), str(found[0][1])) if found else None

    def entries(self, group: GroupKey) -> list[Entry]:
        found = self._rows(SELECT_STEPS, group)
        return [Entry(str(reference), None if args is None else bytes(args)) for reference, args in found]


class Pending:
    """The uncommitted changes of one attempt; ``empty_chat``: a chat known to have nothing stored (read as empty).
    Belongs to the attempt's thread."""

    __slots__ = ("_after", "_dirty_groups", "_dirty_states", "_empty", "_groups", "_loader", "_states", "update_id")

    def __init__(self, loader: Loader, update_id: int | None = None, empty_chat: int | None = None) -> None:
        self._loader = loader
        self.update_id = update_id
        self._empty = (empty_chat, (NEXT_STEP, str(empty_chat)) if empty_chat is not None else ("", ""))
        self._states: dict[StateKey, Row | None] = {}
        self._groups: dict[GroupKey, list[Entry]] = {}
        self._dirty_states: set[StateKey] = set()
        self._dirty_groups: set[GroupKey] = set()
        self._after: list[Callable[[], None]] = []

    @property
    def dirty(self) -> bool:
        """Whether anything changed that is not committed yet."""
        return bool(self._dirty_states or self._dirty_groups or self._after)

    # --- states -----------------------------------------------------------------------------------

    def state(self, key: StateKey) -> Row | None:
        """The state of ``key`` as this attempt sees it (``None``: no state)."""
        if key not in self._states:
            self._states[key] = None if key.chat_id == self._empty[0] else self._loader.state(key)
        return self._states[key]

    def known(self, key: StateKey | None, row: Row | None, groups: dict[GroupKey, list[Entry]]) -> None:
        """What was read ahead, kept as if read now."""
        if key is not None:
            self._states.setdefault(key, row)
        for group, entries in groups.items():
            self._groups.setdefault(group, entries)

    def put_state(self, key: StateKey, row: Row | None) -> None:
        """Set (``row``) or delete (``None``) the state of ``key``, to be written at the next flush."""
        self._states[key] = row
        self._dirty_states.add(key)

    # --- handlers ---------------------------------------------------------------------------------

    def entries(self, group: GroupKey) -> list[Entry]:
        """The handlers registered for ``group`` as this attempt sees them, oldest first (a copy)."""
        if group not in self._groups:
            self._groups[group] = [] if group == self._empty[1] else self._loader.entries(group)
        return list(self._groups[group])

    def put_entries(self, group: GroupKey, entries: list[Entry]) -> None:
        """Replace the handlers of ``group``, to be written at the next flush."""
        self._groups[group] = list(entries)
        self._dirty_groups.add(group)

    def touched(self) -> tuple[set[int], set[int]]:
        """The chats and the replied-to message ids the changes not committed yet concern."""
        chats = {key.chat_id for key in self._dirty_states}
        replies: set[int] = set()
        for kind, group in self._dirty_groups:
            number = int64_of(group)
            if number is not None:  # else no chat or message id: no attempt knows that group empty
                (replies if kind == REPLY else chats).add(number)
        return chats, replies

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run ``action()`` once the changes are committed (never when they are not)."""
        self._after.append(action)

    # --- writing ----------------------------------------------------------------------------------

    def flush(self, conn: Any) -> None:
        """Write every change through ``conn`` inside the caller's open transaction."""
        if not (self._dirty_states or self._dirty_groups):
            return
        now = time.time()
        for key in sorted(self._dirty_states, key=StateKey.params):
            row = self._states[key]
            if row is None:
                rows(conn, DELETE_STATE, key.params())
            else:
                rows(conn, UPSERT_STATE, (*key.params(), row[0], row[1], self.update_id, now))
        for group in sorted(self._dirty_groups):
            rows(conn, DELETE_STEPS, group)
            for seq, entry in enumerate(self._groups[group], 1):
                rows(conn, INSERT_STEP, (*group, seq, entry.reference, entry.args, self.update_id, now))

    def committed(self) -> None:
        """The changes written by the last :meth:`flush` are committed."""
        self._dirty_states.clear()
        self._dirty_groups.clear()
        after, self._after = self._after, []
        for action in after:
            action()


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
