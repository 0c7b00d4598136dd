"""Chats of the fake Bot API and the methods that reach them (``sendMessage``, ``editMessageText``,
``answerCallbackQuery``, ``sendChatAction``, ``getMe``), refusing as Telegram does.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ...delivery.broadcast_message import TEXT_LIMIT, utf16_length, visible_text
from .answers import ApiError, Handler, Sent
from .faults import FaultScript
from .updates import UpdateQueue

__all__ = ["ChatControls", "Chats"]


def chat_dict(chat_id: int) -> dict[str, Any]:
    """The ``Chat`` object of ``chat_id``: private for positive ids, a (super)group for negative ones."""
    if chat_id > 0:
        return {"id": chat_id, "type": "private", "first_name": f"User {chat_id}"}
    kind = "supergroup" if chat_id <= -1_000_000_000_000 else "group"
    return {"id": chat_id, "type": kind, "title": f"Group {chat_id}"}


def user_dict(user_id: int) -> dict[str, Any]:
    """The ``User`` object of a human user ``user_id``."""
    return {"id": user_id, "is_bot": False, "first_name": f"User {user_id}", "language_code": "en"}


class Chats:
    """The chats and messages the fake knows, and the handlers of the methods that reach them (:meth:`table`).
    Thread-safe: every method takes ``cond`` (re-entrant).
    """

    def __init__(self, cond: threading.Condition, bot_id: int, faults: FaultScript, sent: list[Sent]) -> None:
        self.cond = cond
        self.bot_id = bot_id
        self.faults = faults
        self.sent = sent  # the accepted messages, in order
        self.refusals: dict[int, tuple[int, str]] = {}  # chat id -> (status, description) of every send to it
        self.revoked = False
        self.next_message_id: dict[int, int] = {}
        self.bot_messages: dict[tuple[int, int], str] = {}
        self.callbacks: set[str] = set()
        self._callback_seq = itertools.count(1)
        #: The ``User`` object of the bot itself.
        self.bot_user = {"id": bot_id, "is_bot": True, "first_name": "Fake Bot", "username": "fake_fence_bot"}

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
            if chat_id in self.refusals:
                raise ApiError(*self.refusals[chat_id])
        return chat_id

    def user_message(self, chat_id: int, text: str, user_id: int | None, message_id: int | None, date: int | None,
                     extra: Mapping[str, Any]) -> dict[str, Any]:
        """A ``Message`` from a user in ``chat_id`` (see ``FakeBotAPI.push_message``); the chat exists after."""
        uid = user_id if user_id is not None else (chat_id if chat_id > 0 else 1)
        with self.cond:
            if message_id is None:
                message_id = self.take_message_id(chat_id)
            self.next_message_id[chat_id] = max(self.next_message_id.get(chat_id, 1), message_id + 1)
        message: dict[str, Any] = {"message_id": message_id, "from": user_dict(uid), "chat": chat_dict(chat_id),
                                   "date": int(time.time()) if date is None else int(date), "text": text}
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
        message = self._message(chat_id, message_id, text)
        return {"callback_query": {"id": query_id, "from": user_dict(uid), "chat_instance": str(chat_id), "data": data,
                                   "message": message}}

    def table(self) -> dict[str, Handler]:
        """The handlers by Bot API method name."""
        return {"getMe": lambda params: self.bot_user, "sendMessage": self.send_message,
                "editMessageText": self.edit_message_text, "answerCallbackQuery": self.answer_callback_query,
                "sendChatAction": self.send_chat_action, "setMyCommands": lambda params: True}

    def send_message(self, params: dict[str, Any]) -> Any:
        with self.cond:
            chat_id = self.chat_of(params)
            text = _text(params, markup_only_is_empty=True)
            self.faults.check_rate(chat_id)
            message_id = self.take_message_id(chat_id)
            self.bot_messages[(chat_id, message_id)] = text
            self.sent.append(Sent(chat_id, text, message_id, "sendMessage", params))
            return self._message(chat_id, message_id, text)

    def _message(self, chat_id: int, message_id: int, text: str, **extra: Any) -> dict[str, Any]:
        return {"message_id": message_id, "from": self.bot_user, "chat": chat_dict(chat_id),
                "date": int(time.time()), "text": text, **extra}

    def edit_message_text(self, params: dict[str, Any]) -> Any:
        with self.cond:
            text = _text(params, markup_only_is_empty=False)
            chat_id = self.chat_of(params)
            try:
                key = (chat_id, int(params["message_id"]))
            except (KeyError, TypeError, ValueError):
                raise ApiError(400, "Bad Request: message identifier is not specified") from None
            if key not in self.bot_messages:
                raise ApiError(400, "Bad Request: message to edit not found")
            if self.bot_messages[key] == text:
                raise ApiError(400, "Bad Request: message is not modified: specified new message content and reply "
                                    "markup are exactly the same as a current content and reply markup of the message")
            self.faults.check_rate(chat_id)
            self.bot_messages[key] = text
            self.sent.append(Sent(chat_id, text, key[1], "editMessageText", params))
            return self._message(chat_id, key[1], text, edit_date=int(time.time()))

    def answer_callback_query(self, params: dict[str, Any]) -> Any:
        with self.cond:
            query_id = str(params.get("callback_query_id") or "")
            if query_id not in self.callbacks:
                raise ApiError(400, "Bad Request: query is too old and response timeout expired or query ID is invalid")
            self.callbacks.discard(query_id)
            return True

    def send_chat_action(self, params: dict[str, Any]) -> Any:
        self.chat_of(params)
        if not params.get("action"):
            raise ApiError(400, "Bad Request: action is empty")
        return True



def _text(params: dict[str, Any], *, markup_only_is_empty: bool) -> str:
    """The ``text`` of a send or an edit, refused as Telegram does when empty or too long once parsed."""
    text = params.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ApiError(400, "Bad Request: message text is empty")
    visible = visible_text(text, str(params.get("parse_mode") or "").strip())
    if markup_only_is_empty and not visible:
        raise ApiError(400, "Bad Request: message text is empty")
    if utf16_length(visible) > TEXT_LIMIT:
        raise ApiError(400, "Bad Request: message is too long")
    return text


class ChatControls:
    """The methods of ``FakeBotAPI`` that act as the chats' users: push their updates (to ``_updates``), block the
    bot, leave, or revoke its token (in ``_chats``)."""

    _chats: Chats
    _updates: UpdateQueue

    def push_update(self, update: Mapping[str, Any]) -> int:
        """Queue a copy of a raw update; returns its ``update_id`` (assigned if missing; a given one must be above
        every earlier one: ``ValueError``)."""
        return self._updates.queue(dict(update))

    def push_message(self, chat_id: int, text: str, *, user_id: int | None = None, message_id: int | None = None,
                     date: int | None = None, **extra: Any) -> int:
        """Queue a ``message`` update from a user in ``chat_id``; returns its ``update_id``.

        ``user_id`` defaults to the chat id for private chats (positive ids), else to 1. A text that starts with
        ``/`` carries a ``bot_command`` entity. ``extra`` keys are added to (or replace keys of) the message.
        """
        with self._updates.cond:
            message = self._chats.user_message(chat_id, text, user_id, message_id, date, extra)
            return self._updates.queue({"message": message})

    def push_messages(self, n: int, *, chats: Sequence[int] = (1,), text: str = "message {i}") -> list[int]:
        """Queue ``n`` messages, round-robin over ``chats`` (``text`` may use ``{i}``); returns their update ids."""
        with self._updates.cond:
            return [self.push_message(chats[i % len(chats)], text.format(i=i)) for i in range(n)]

    def push_callback_query(self, chat_id: int, data: str, *, user_id: int | None = None,
                            message_id: int | None = None) -> int:
        """Queue a ``callback_query`` update (a button press on a bot message in ``chat_id``); returns its id.

        ``message_id`` defaults to the bot's last message in that chat. ``answerCallbackQuery`` answers it once.
        """
        with self._updates.cond:
            return self._updates.queue(self._chats.callback_update(chat_id, data, user_id, message_id))

    def _refuse(self, chat_id: int, refusal: tuple[int, str] | None) -> None:
        with self._chats.cond:
            if refusal is None:
                self._chats.refusals.pop(chat_id, None)
            else:
                self._chats.refusals[chat_id] = refusal

    def forget_chat(self, chat_id: int) -> None:
        """Make ``chat_id`` unknown: sends to it get ``400 Bad Request: chat not found``."""
        self._refuse(chat_id, (400, "Bad Request: chat not found"))

    def block(self, chat_id: int) -> None:
        """The user blocked the bot (or kicked it, for a group): sends get ``403 Forbidden: bot was blocked ...``."""
        kicked = "Forbidden: bot was kicked from the group chat"
        self._refuse(chat_id, (403, kicked if chat_id < 0 else "Forbidden: bot was blocked by the user"))

    def unblock(self, chat_id: int) -> None:
        """Undo :meth:`block` (or :meth:`forget_chat`, :meth:`deactivate`): sends to ``chat_id`` succeed again."""
        self._refuse(chat_id, None)

    def deactivate(self, chat_id: int) -> None:
        """The user deleted the account: sends get ``403 Forbidden: user is deactivated``."""
        self._refuse(chat_id, (403, "Forbidden: user is deactivated"))

    def revoke_token(self) -> None:
        """Revoke the token: every request gets ``401 Unauthorized`` from now on."""
        with self._chats.cond:
            self._chats.revoked = True
