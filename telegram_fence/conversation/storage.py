"""``FenceStateStorage``: telebot's state storage (``StateStorageBase``) kept in the fence's store, fenced.

Implements every method telebot's ``bot.set_state``, ``get_state``, ``delete_state``, ``add_data``, ``reset_data``
and ``retrieve_data`` (and ``StateContext``, ``StateFilter``) call. Inside an attempt a change commits with the
attempt (see :mod:`.extension`); outside one it is written at once. May import telebot's storage base classes,
the conversation's modules and the standard library (layer 3, conversation).
"""

from __future__ import annotations

from typing import Any

from telebot.storage import StateDataContext, StateStorageBase

from ..errors import StateMissing, StateNotStorable
from .extension import Conversations
from .values import StateKey, decode_data, decode_state, encode_data, encode_state, state_key

__all__ = ["FenceStateStorage"]

_EMPTY = "{}"


class FenceStateStorage(StateStorageBase):  # type: ignore[misc]  # telebot has no type hints
    """telebot's state storage in the fence's store: states and their data keyed as telebot keys them.

    A state is a telebot ``State`` (kept by its ``name``), a string or an integer; its data a dict of JSON
    values (a value that is not one raises :class:`~telegram_fence.errors.StateNotStorable` and changes
    nothing). ``get_data`` returns a fresh dict: change it through ``set_data``, ``save`` or
    ``get_interactive_data`` (telebot's ``retrieve_data``). Ids outside 64 bits have no state (reads answer
    ``None``/``{}``, writes raise ``StateNotStorable``). ``set_data`` for a user with no state raises
    :class:`~telegram_fence.errors.StateMissing` (telebot's memory storage raises ``RuntimeError``; this is one).

    Safe to share between threads (see :class:`~.extension.Conversations`).
    """

    def __init__(self, conversations: Conversations) -> None:
        super().__init__()
        self._conversations = conversations

    def set_state(self, chat_id: Any, user_id: Any, state: Any, business_connection_id: Any = None,
                  message_thread_id: Any = None, bot_id: Any = None) -> bool:
        """Set the state (keeping the data, or with empty data for a new one); ``True``."""
        key = state_key(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        text = encode_state(state)
        with self._conversations.changing() as pending:
            row = pending.state(key)
            pending.put_state(key, (text, _EMPTY if row is None else row[1]))
        return True

    def get_state(self, chat_id: Any, user_id: Any, business_connection_id: Any = None,
                  message_thread_id: Any = None, bot_id: Any = None) -> Any:
        """The state's name (or the integer it was set to), ``None`` when there is none."""
        if self._conversations.knows_no_state(user_id if chat_id is None else chat_id):
            return None  # a quiet chat: a state= filter asks for every message
        key = _readable_key(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        if key is None:
            return None
        with self._conversations.reading() as pending:
            row = pending.state(key)
        return None if row is None else decode_state(row[0])

    def delete_state(self, chat_id: Any, user_id: Any, business_connection_id: Any = None,
                     message_thread_id: Any = None, bot_id: Any = None) -> bool:
        """Delete the state and its data; ``False`` when there was none."""
        key = state_key(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        with self._conversations.changing() as pending:
            if pending.state(key) is None:
                return False
            pending.put_state(key, None)
        return True

    def set_data(self, chat_id: Any, user_id: Any, key: Any, value: Any, business_connection_id: Any = None,
                 message_thread_id: Any = None, bot_id: Any = None) -> bool:
        """Set one item of the data; raises :class:`StateMissing` when the user has no state."""
        where = state_key(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        with self._conversations.changing() as pending:
            row = pending.state(where)
            if row is None:
                raise StateMissing(
                    f"set_data({key!r}): chat {where.chat_id} user {where.user_id} has no state; "
                    "call set_state first"
                )
            data = decode_data(row[1])
            data[key] = value
            pending.put_state(where, (row[0], encode_data(data)))
        return True

    def get_data(self, chat_id: Any, user_id: Any, business_connection_id: Any = None,
                 message_thread_id: Any = None, bot_id: Any = None) -> dict[str, Any]:
        """A fresh dict of the data (empty when there is no state)."""
        if self._conversations.knows_no_state(user_id if chat_id is None else chat_id):
            return {}
        key = _readable_key(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        if key is None:
            return {}
        with self._conversations.reading() as pending:
            row = pending.state(key)
        return {} if row is None else decode_data(row[1])

    def reset_data(self, chat_id: Any, user_id: Any, business_connection_id: Any = None,
                   message_thread_id: Any = None, bot_id: Any = None) -> bool:
        """Empty the data, keeping the state; ``False`` when there is no state."""
        key = state_key(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        with self._conversations.changing() as pending:
            row = pending.state(key)
            if row is None:
                return False
            pending.put_state(key, (row[0], _EMPTY))
        return True

    def get_interactive_data(self, chat_id: Any, user_id: Any, business_connection_id: Any = None,
                             message_thread_id: Any = None, bot_id: Any = None) -> Any:
        """telebot's context manager over the data: yields a copy, saved (:meth:`save`) when the block ends."""
        return StateDataContext(self, chat_id=chat_id, user_id=user_id, business_connection_id=business_connection_id,
                                message_thread_id=message_thread_id, bot_id=bot_id)

    def save(self, chat_id: Any, user_id: Any, data: Any, business_connection_id: Any = None,
             message_thread_id: Any = None, bot_id: Any = None) -> bool:
        """Replace the data, keeping the state; ``False`` (nothing written) when there is no state."""
        key = state_key(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        text = encode_data(data)
        with self._conversations.changing() as pending:
            row = pending.state(key)
            if row is None:
                return False
            pending.put_state(key, (row[0], text))
        return True

    def __str__(self) -> str:
        return "<FenceStateStorage: in the fence's store>"


def _readable_key(*parts: Any) -> StateKey | None:
    """The key to read, or ``None`` for ids no state can be stored under (a hostile update's huge chat id): such a
    user has no state, and telebot's state filters simply do not match."""
    try:
        return state_key(*parts)
    except StateNotStorable:
        return None
