"""The Bot API methods the fake answers (not ``getUpdates``, the webhook or downloads), refusing as Telegram does."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .answers import ApiError, as_bool, as_int, as_json, chat_dict, user_dict
from .chats import Chats
from .entities import utf16_len, visible_text
from .faults import FaultScript
from .files import FileStore
from .records import Records, Sent, UploadedFile

__all__ = ["BotMethods", "Handler"]

#: One method: request parameters -> the ``result`` (raises :class:`ApiError` to refuse).
Handler = Callable[[dict[str, Any]], Any]

_MAX_TEXT = 4096
_MAX_CAPTION = 1024


class BotMethods:
    """The handlers of the Bot API methods, by Bot API method name (:meth:`table`). Thread-safe: state is read
    and changed under ``cond`` (the fake's one condition, re-entrant).
    """

    def __init__(
        self,
        cond: threading.Condition,
        chats: Chats,
        files: FileStore,
        faults: FaultScript,
        records: Records,
    ) -> None:
        self.cond = cond
        self.chats = chats
        self.files = files
        self.faults = faults
        self.records = records
        self.commands: list[Any] = []
        self.polls: dict[tuple[int, int], dict[str, Any]] = {}
        self.pinned: dict[int, int] = {}

    def table(self) -> dict[str, Handler]:
        """The handlers by Bot API method name (``getUpdates`` and the webhook methods live elsewhere)."""
        return {
            "getMe": self.get_me,
            "sendMessage": self.send_message,
            "sendPhoto": self.send_photo,
            "sendDocument": self.send_document,
            "editMessageText": self.edit_message_text,
            "answerCallbackQuery": self.answer_callback_query,
            "sendChatAction": self.send_chat_action,
            "getFile": self.files.get_file,
            "setMyCommands": self.set_my_commands,
            "getMyCommands": self.get_my_commands,
            "deleteMessage": self.delete_message,
            "deleteMessages": self.delete_messages,
            "sendPoll": self.send_poll,
            "stopPoll": self.stop_poll,
            "forwardMessage": self.forward_message,
            "copyMessage": self.copy_message,
            "pinChatMessage": self.pin_chat_message,
            "unpinChatMessage": self.unpin_chat_message,
            "editMessageReplyMarkup": self.edit_message_reply_markup,
            "setMessageReaction": self.set_message_reaction,
            "logOut": lambda params: True,
            "close": lambda params: True,
        }

    def get_me(self, params: dict[str, Any]) -> Any:
        user = self.chats.bot_user()
        user.update(can_join_groups=True, can_read_all_group_messages=False, supports_inline_queries=False)
        return user

    def _record_message(
        self, method: str, chat_id: int, text: str | None, params: dict[str, Any], extra: Mapping[str, Any]
    ) -> dict[str, Any]:
        message_id = self.chats.take_message_id(chat_id)
        self.chats.bot_messages[(chat_id, message_id)] = text
        self.records.add_sent(Sent(chat_id, text, message_id, method, params))
        message: dict[str, Any] = {
            "message_id": message_id,
            "from": self.chats.bot_user(),
            "chat": chat_dict(chat_id),
            "date": int(time.time()),
        }
        if text is not None:
            message["text" if method == "sendMessage" else "caption"] = text
        message.update(extra)
        return message

    def send_message(self, params: dict[str, Any]) -> Any:
        with self.cond:
            chat_id = self.chats.chat_of(params)
            text = _text(params, markup_only_is_empty=True)
            self.faults.check_rate("sendmessage", chat_id)
            return self._record_message("sendMessage", chat_id, text, params, {})

    def _media(self, params: dict[str, Any], field_name: str, method: str) -> tuple[int, str | None, Any]:
        chat_id = self.chats.chat_of(params)
        media = params.get(field_name)
        if media is None or media == "":
            raise ApiError(400, f"Bad Request: there is no {field_name} in the request")
        caption = params.get("caption")
        if caption is not None:
            visible = visible_text(str(caption), params.get("parse_mode"))
            if utf16_len(visible) > _MAX_CAPTION:
                raise ApiError(400, "Bad Request: message caption is too long")
        self.faults.check_rate(method.lower(), chat_id)
        if isinstance(media, UploadedFile):
            return chat_id, caption, self.files.keep_upload(media, field_name)
        return chat_id, caption, (str(media), self.files.name_of(str(media)), 0)

    def send_photo(self, params: dict[str, Any]) -> Any:
        with self.cond:
            chat_id, caption, (file_id, _, size) = self._media(params, "photo", "sendPhoto")
            photo = [
                {"file_id": file_id, "file_unique_id": f"u{file_id}", "width": 90, "height": 90, "file_size": size}
            ]
            return self._record_message("sendPhoto", chat_id, caption, params, {"photo": photo})

    def send_document(self, params: dict[str, Any]) -> Any:
        with self.cond:
            chat_id, caption, (file_id, name, size) = self._media(params, "document", "sendDocument")
            document = {"file_id": file_id, "file_unique_id": f"u{file_id}", "file_name": name, "file_size": size}
            return self._record_message("sendDocument", chat_id, caption, params, {"document": document})

    def edit_message_text(self, params: dict[str, Any]) -> Any:
        with self.cond:
            text = _text(params, markup_only_is_empty=False)
            if params.get("inline_message_id"):
                return True
            chat_id = self.chats.chat_of(params)
            message_id = as_int(params, "message_id")
            if message_id is None:
                raise ApiError(400, "Bad Request: message identifier is not specified")
            key = (chat_id, message_id)
            if key not in self.chats.bot_messages:
                raise ApiError(400, "Bad Request: message to edit not found")
            if self.chats.bot_messages[key] == text:
                raise ApiError(
                    400,
                    "Bad Request: message is not modified: specified new message content and reply markup "
                    "are exactly the same as a current content and reply markup of the message",
                )
            self.faults.check_rate("editmessagetext", chat_id)
            self.chats.bot_messages[key] = text
            self.records.add_sent(Sent(chat_id, text, message_id, "editMessageText", params))
            return {
                "message_id": message_id,
                "from": self.chats.bot_user(),
                "chat": chat_dict(chat_id),
                "date": int(time.time()),
                "edit_date": int(time.time()),
                "text": text,
            }

    def answer_callback_query(self, params: dict[str, Any]) -> Any:
        with self.cond:
            query_id = str(params.get("callback_query_id") or "")
            if query_id not in self.chats.callbacks:
                raise ApiError(400, "Bad Request: query is too old and response timeout expired or query ID is invalid")
            self.chats.callbacks.discard(query_id)
            return True

    def send_chat_action(self, params: dict[str, Any]) -> Any:
        with self.cond:
            self.chats.chat_of(params)
            if not params.get("action"):
                raise ApiError(400, "Bad Request: action is empty")
            return True

    def set_my_commands(self, params: dict[str, Any]) -> Any:
        commands = as_json(params, "commands", list)
        with self.cond:
            self.commands = commands
        return True

    def get_my_commands(self, params: dict[str, Any]) -> Any:
        with self.cond:
            return list(self.commands)

    def _exists(self, chat_id: int, message_id: int | None) -> bool:
        key = (chat_id, message_id)
        return message_id is not None and (key in self.chats.bot_messages or key in self.chats.user_messages)

    def _forget(self, chat_id: int, message_id: int) -> None:
        self.chats.bot_messages.pop((chat_id, message_id), None)
        self.chats.user_messages.pop((chat_id, message_id), None)
        self.polls.pop((chat_id, message_id), None)

    def delete_message(self, params: dict[str, Any]) -> Any:
        """Any message of the chat, the bot's own or a user's (the fake plays a bot that may delete them)."""
        with self.cond:
            chat_id = self.chats.chat_of(params)
            message_id = as_int(params, "message_id")
            if message_id is None or not self._exists(chat_id, message_id):
                raise ApiError(400, "Bad Request: message to delete not found")
            self._forget(chat_id, message_id)
            return True

    def delete_messages(self, params: dict[str, Any]) -> Any:
        """Telegram skips ids that are not there; an empty or over-long list (above 100) is refused."""
        ids = as_json(params, "message_ids", list)
        if not ids or len(ids) > 100:
            raise ApiError(400, "Bad Request: message_ids must contain 1-100 elements")
        with self.cond:
            chat_id = self.chats.chat_of(params)
            for raw in ids:
                if isinstance(raw, int):
                    self._forget(chat_id, raw)
            return True

    def send_poll(self, params: dict[str, Any]) -> Any:
        question = params.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ApiError(400, "Bad Request: poll question must be non-empty")
        if len(question) > 300:
            raise ApiError(400, "Bad Request: poll question length must not exceed 300")
        raw_options = as_json(params, "options", list)
        texts = [o.get("text") if isinstance(o, dict) else o for o in raw_options]
        if len(texts) < 2:
            raise ApiError(400, "Bad Request: poll must have at least 2 option")
        if len(texts) > 12:
            raise ApiError(400, "Bad Request: poll can't have more than 12 options")
        if any(not isinstance(t, str) or not t.strip() for t in texts):
            raise ApiError(400, "Bad Request: poll options must be non-empty")
        with self.cond:
            chat_id = self.chats.chat_of(params)
            self.faults.check_rate("sendpoll", chat_id)
            poll = {
                "id": f"{chat_id}{self.chats.next_message_id.get(chat_id, 1)}",
                "question": question,
                "options": [{"text": t, "voter_count": 0, "persistent_id": str(i)} for i, t in enumerate(texts)],
                "total_voter_count": 0,
                "is_closed": as_bool(params.get("is_closed")),
                "is_anonymous": params.get("is_anonymous") in (None, "") or as_bool(params.get("is_anonymous")),
                "type": str(params.get("type") or "regular"),
                "allows_multiple_answers": as_bool(params.get("allows_multiple_answers")),
            }
            message = self._record_message("sendPoll", chat_id, question, params, {"poll": poll})
            message.pop("caption", None)
            self.polls[(chat_id, message["message_id"])] = poll
            return message

    def stop_poll(self, params: dict[str, Any]) -> Any:
        with self.cond:
            chat_id = self.chats.chat_of(params)
            poll = self.polls.get((chat_id, as_int(params, "message_id") or 0))
            if poll is None:
                raise ApiError(400, "Bad Request: message with poll to stop not found")
            if poll["is_closed"]:
                raise ApiError(400, "Bad Request: poll has already been closed")
            poll["is_closed"] = True
            return dict(poll)

    def _source(self, params: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The sender and text of the message ``from_chat_id``/``message_id`` names (forward and copy)."""
        source_chat = self.chats.chat_of({"chat_id": params.get("from_chat_id")})
        message_id = as_int(params, "message_id")
        if message_id is None or not self._exists(source_chat, message_id):
            raise ApiError(400, "Bad Request: message to forward not found")
        key = (source_chat, message_id)
        sender = user_dict(self.chats.user_messages[key]) if key in self.chats.user_messages else self.chats.bot_user()
        return sender, self.chats.bot_messages.get(key)

    def forward_message(self, params: dict[str, Any]) -> Any:
        with self.cond:
            sender, text = self._source(params)
            chat_id = self.chats.chat_of(params)
            self.faults.check_rate("forwardmessage", chat_id)
            extra = {"forward_origin": {"type": "user", "sender_user": sender, "date": int(time.time())}}
            message = self._record_message("forwardMessage", chat_id, text, params, extra)
            if text is not None:
                message["text"] = message.pop("caption")
            return message

    def copy_message(self, params: dict[str, Any]) -> Any:
        with self.cond:
            _, text = self._source(params)
            chat_id = self.chats.chat_of(params)
            self.faults.check_rate("copymessage", chat_id)
            caption = params.get("caption")
            message = self._record_message("copyMessage", chat_id, text if caption is None else str(caption),
                                           params, {})
            return {"message_id": message["message_id"]}

    def pin_chat_message(self, params: dict[str, Any]) -> Any:
        with self.cond:
            chat_id = self.chats.chat_of(params)
            message_id = as_int(params, "message_id")
            if not self._exists(chat_id, message_id):
                raise ApiError(400, "Bad Request: message to pin not found")
            self.pinned[chat_id] = message_id  # type: ignore[assignment]
            return True

    def unpin_chat_message(self, params: dict[str, Any]) -> Any:
        with self.cond:
            chat_id = self.chats.chat_of(params)
            message_id = as_int(params, "message_id")
            if message_id is None:
                self.pinned.pop(chat_id, None)
            elif self.pinned.get(chat_id) == message_id:
                del self.pinned[chat_id]
            else:
                raise ApiError(400, "Bad Request: message to unpin not found")
            return True

    def edit_message_reply_markup(self, params: dict[str, Any]) -> Any:
        with self.cond:
            if params.get("inline_message_id"):
                return True
            chat_id = self.chats.chat_of(params)
            message_id = as_int(params, "message_id")
            if message_id is None or (chat_id, message_id) not in self.chats.bot_messages:
                raise ApiError(400, "Bad Request: message to edit not found")
            message: dict[str, Any] = {"message_id": message_id, "from": self.chats.bot_user(),
                                       "chat": chat_dict(chat_id), "date": int(time.time()),
                                       "edit_date": int(time.time())}
            text = self.chats.bot_messages[(chat_id, message_id)]
            if text is not None:
                message["text"] = text
            markup = params.get("reply_markup")
            if markup:
                try:
                    message["reply_markup"] = json.loads(markup) if isinstance(markup, str) else markup
                except ValueError:
                    raise ApiError(400, "Bad Request: can't parse reply keyboard markup JSON object") from None
            return message

    def set_message_reaction(self, params: dict[str, Any]) -> Any:
        with self.cond:
            chat_id = self.chats.chat_of(params)
            if not self._exists(chat_id, as_int(params, "message_id")):
                raise ApiError(400, "Bad Request: message to react not found")
            return True


def _text(params: dict[str, Any], *, markup_only_is_empty: bool) -> str:
    """The ``text`` of a send or an edit, refused as Telegram does when empty or too long once parsed."""
    text = params.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ApiError(400, "Bad Request: message text is empty")
    visible = visible_text(text, params.get("parse_mode"))
    if markup_only_is_empty and not visible.strip():
        raise ApiError(400, "Bad Request: message text is empty")
    if utf16_len(visible) > _MAX_TEXT:
        raise ApiError(400, "Bad Request: message is too long")
    return text
