"""Chats of the fake Bot API: which exist, are blocked or deactivated, their message ids, the bot's messages and
open callback queries; :class:`ChatControls` is what tests use to change who the bot can reach.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any

from ...delivery.message_limits import utf16_length
from ...errors import ConfigurationError
from .answers import ApiError, chat_dict, user_dict

__all__ = ["ChatControls", "Chats"]


class Chats:
    """The chats and messages the fake knows. Thread-safe: every method takes ``cond`` (re-entrant)."""

    def __init__(self, cond: threading.Condition, bot_id: int) -> None:
        self.cond = cond
        self.bot_id = bot_id
        self.forgotten: set[int] = set()
        self.blocked: set[int] = set()
        self.deactivated: set[int] = set()
        self.revoked = False
        self.next_message_id: dict[int, int] = {}
        self.bot_messages: dict[tuple[int, int], str] = {}
        self.callbacks: set[str] = set()
        self._callback_seq = itertools.count(1)

    def bot_user(self) -> dict[str, Any]:
        """The ``User`` object of the bot itself."""
        return {"id": self.bot_id, "is_bot": True, "first_name": "Fake Bot", "username": "fake_fence_bot"}

    def take_message_id(self, chat_id: int) -> int:
        """The next message id of ``chat_id``."""
        with self.cond:
            message_id = self.next_message_id.get(chat_id, 1)
            self.next_message_id[chat_id] = message_id + 1
            return message_id

    def chat_of(self, params: Mapping[str, Any]) -> int:
        """The ``chat_id`` of a request; raises what Telegram answers for an unknown, blocked or deleted chat."""
        raw = params.get("chat_id")
        if raw is None or raw == "":
            raise ApiError(400, "Bad Request: chat_id is empty")
        try:
            chat_id = int(raw)
        except (TypeError, ValueError):
            raise ApiError(400, "Bad Request: chat not found") from None
        with self.cond:
            if chat_id in self.forgotten:
                raise ApiError(400, "Bad Request: chat not found")
            if chat_id in self.deactivated:
                raise ApiError(403, "Forbidden: user is deactivated")
            if chat_id in self.blocked:
                if chat_id < 0:
                    raise ApiError(403, "Forbidden: bot was kicked from the group chat")
                raise ApiError(403, "Forbidden: bot was blocked by the user")
        return chat_id

    def user_message(
        self,
        chat_id: int,
        text: str,
        user_id: int | None,
        message_id: int | None,
        date: int | None,
        extra: Mapping[str, Any],
    ) -> dict[str, Any]:
        """A ``Message`` from a user in ``chat_id`` (see ``FakeBotAPI.push_message``); the chat exists after."""
        if not isinstance(chat_id, int):
            raise ConfigurationError(f"chat_id must be an int, got {chat_id!r}")
        uid = user_id if user_id is not None else (chat_id if chat_id > 0 else 1)
        with self.cond:
            if message_id is None:
                message_id = self.take_message_id(chat_id)
            else:
                self.next_message_id[chat_id] = max(self.next_message_id.get(chat_id, 1), message_id + 1)
        message: dict[str, Any] = {
            "message_id": message_id,
            "from": user_dict(uid),
            "chat": chat_dict(chat_id),
            "date": int(time.time()) if date is None else int(date),
            "text": text,
        }
        if text.startswith("/"):
            command = text.split(None, 1)[0]
            message["entities"] = [{"type": "bot_command", "offset": 0, "length": utf16_length(command)}]
        message.update(extra)
        return message

    def callback_update(self, chat_id: int, data: str, user_id: int | None, message_id: int | None) -> dict[str, Any]:
        """A ``callback_query`` update on a bot message (see ``FakeBotAPI.push_callback_query``)."""
        with self.cond:
            uid = user_id if user_id is not None else (chat_id if chat_id > 0 else 1)
            if message_id is None:
                mine = [mid for (chat, mid) in self.bot_messages if chat == chat_id]
                message_id = max(mine) if mine else self.take_message_id(chat_id)
            query_id = f"{self.bot_id}{next(self._callback_seq):08d}"
            self.callbacks.add(query_id)
            text = self.bot_messages.get((chat_id, message_id)) or "button"
        return {
            "callback_query": {
                "id": query_id,
                "from": user_dict(uid),
                "chat_instance": str(chat_id),
                "data": data,
                "message": {
                    "message_id": message_id,
                    "from": self.bot_user(),
                    "chat": chat_dict(chat_id),
                    "date": int(time.time()),
                    "text": text,
                },
            }
        }


class ChatControls:
    """The recipient-scripting methods of ``FakeBotAPI`` (a base class of it); state in ``self._chats``."""

    _chats: Chats

    def forget_chat(self, chat_id: int) -> None:
        """Make ``chat_id`` unknown: sends to it get ``400 Bad Request: chat not found``."""
        with self._chats.cond:
            self._chats.forgotten.add(chat_id)

    def block(self, chat_id: int) -> None:
        """The user blocked the bot: sends get ``403 Forbidden: bot was blocked by the user``."""
        with self._chats.cond:
            self._chats.blocked.add(chat_id)

    def unblock(self, chat_id: int) -> None:
        """Undo :meth:`block`."""
        with self._chats.cond:
            self._chats.blocked.discard(chat_id)

    def deactivate(self, chat_id: int) -> None:
        """The user deleted the account: sends get ``403 Forbidden: user is deactivated``."""
        with self._chats.cond:
            self._chats.deactivated.add(chat_id)

    def revoke_token(self) -> None:
        """Revoke the token: every request gets ``401 Unauthorized`` from now on."""
        with self._chats.cond:
            self._chats.revoked = True
