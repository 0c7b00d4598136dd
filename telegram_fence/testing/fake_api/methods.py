"""The Bot API methods the fake answers (not ``getUpdates`` or the webhook), refusing as Telegram does."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...delivery.message_limits import TEXT_LIMIT, utf16_length, visible_text
from ...errors import ConfigurationError
from .answers import ApiError, chat_dict
from .chats import Chats
from .faults import FaultScript
from .records import Records, Sent

__all__ = ["BotMethods", "Handler"]

#: One method: request parameters -> the ``result`` (raises :class:`ApiError` to refuse).
Handler = Callable[[dict[str, Any]], Any]

_HTML_TAG = re.compile(r"<(/?)\s*([a-zA-Z-]*)[^>]*>")
_HTML_TAGS = frozenset({
    "b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler", "a", "code", "pre",
    "blockquote", "tg-emoji",
})


class BotMethods:
    """The handlers of the Bot API methods (:meth:`table`). Thread-safe: state is read and changed under ``cond``
    (the fake's one re-entrant condition).
    """

    def __init__(
        self, cond: threading.Condition, chats: Chats, faults: FaultScript, records: Records, local_dir: Path | None
    ) -> None:
        self.cond = cond
        self.chats = chats
        self.faults = faults
        self.records = records
        self.local_dir = local_dir
        self.files: dict[str, str] = {}  # file id -> absolute path (local mode)

    def table(self) -> dict[str, Handler]:
        """The handlers by Bot API method name."""
        return {
            "getMe": self.get_me,
            "sendMessage": self.send_message,
            "editMessageText": self.edit_message_text,
            "answerCallbackQuery": self.answer_callback_query,
            "sendChatAction": self.send_chat_action,
            "getFile": self.get_file,
            "setMyCommands": lambda params: True,
        }

    def get_me(self, params: dict[str, Any]) -> Any:
        user = self.chats.bot_user()
        user.update(can_join_groups=True, can_read_all_group_messages=False, supports_inline_queries=False)
        return user

    def send_message(self, params: dict[str, Any]) -> Any:
        with self.cond:
            chat_id = self.chats.chat_of(params)
            text = _text(params, markup_only_is_empty=True)
            self.faults.check_rate(chat_id)
            message_id = self.chats.take_message_id(chat_id)
            self.chats.bot_messages[(chat_id, message_id)] = text
            self.records.add_sent(Sent(chat_id, text, message_id, "sendMessage", params))
            return self._message(chat_id, message_id, text)

    def _message(self, chat_id: int, message_id: int, text: str, **extra: Any) -> dict[str, Any]:
        return {"message_id": message_id, "from": self.chats.bot_user(), "chat": chat_dict(chat_id),
                "date": int(time.time()), "text": text, **extra}

    def edit_message_text(self, params: dict[str, Any]) -> Any:
        with self.cond:
            text = _text(params, markup_only_is_empty=False)
            if params.get("inline_message_id"):
                return True
            chat_id = self.chats.chat_of(params)
            try:
                key = (chat_id, int(params["message_id"]))
            except (KeyError, TypeError, ValueError):
                raise ApiError(400, "Bad Request: message identifier is not specified") from None
            if key not in self.chats.bot_messages:
                raise ApiError(400, "Bad Request: message to edit not found")
            if self.chats.bot_messages[key] == text:
                raise ApiError(
                    400,
                    "Bad Request: message is not modified: specified new message content and reply markup "
                    "are exactly the same as a current content and reply markup of the message",
                )
            self.faults.check_rate(chat_id)
            self.chats.bot_messages[key] = text
            self.records.add_sent(Sent(chat_id, text, key[1], "editMessageText", params))
            return self._message(chat_id, key[1], text, edit_date=int(time.time()))

    def answer_callback_query(self, params: dict[str, Any]) -> Any:
        with self.cond:
            query_id = str(params.get("callback_query_id") or "")
            if query_id not in self.chats.callbacks:
                raise ApiError(400, "Bad Request: query is too old and response timeout expired or query ID is invalid")
            self.chats.callbacks.discard(query_id)
            return True

    def send_chat_action(self, params: dict[str, Any]) -> Any:
        self.chats.chat_of(params)
        if not params.get("action"):
            raise ApiError(400, "Bad Request: action is empty")
        return True

    def add_file(self, file_id: str | None, path: str | os.PathLike[str], content: bytes | None) -> str:
        """``FakeBotAPI.add_file``: make ``getFile(file_id)`` answer ``path``; returns the file id."""
        if self.local_dir is None:
            raise ConfigurationError("add_file needs local mode: FakeBotAPI(local_dir=...)")
        full = Path(path) if Path(path).is_absolute() else self.local_dir / path
        if content is not None:
            full.parent.mkdir(parents=True, exist_ok=True)
            full.write_bytes(content)
        with self.cond:
            file_id = file_id or f"FAKE-FILE-{len(self.files) + 1}"
            self.files[file_id] = str(full)
        return file_id

    def get_file(self, params: dict[str, Any]) -> Any:
        file_id = str(params.get("file_id") or "")
        with self.cond:
            path = self.files.get(file_id)
        if path is None:
            raise ApiError(400, "Bad Request: invalid file_id")
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        return {"file_id": file_id, "file_unique_id": f"U{file_id}", "file_size": size, "file_path": path}


def _text(params: dict[str, Any], *, markup_only_is_empty: bool) -> str:
    """The ``text`` of a send or an edit, refused as Telegram does when empty, unparsable or too long once parsed."""
    text = params.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ApiError(400, "Bad Request: message text is empty")
    mode = str(params.get("parse_mode") or "").strip().lower()
    if mode == "html":
        _check_html(text)
    elif mode in ("markdown", "markdownv2"):
        _check_markdown(text, "*_`" if mode == "markdown" else "*_`~|")
    elif mode:
        raise ApiError(400, f"Bad Request: unsupported parse_mode {params.get('parse_mode')!r}")
    visible = visible_text(text, mode)
    if markup_only_is_empty and not visible:
        raise ApiError(400, "Bad Request: message text is empty")
    if utf16_length(visible) > TEXT_LIMIT:
        raise ApiError(400, "Bad Request: message is too long")
    return text


def _entity_error(detail: str) -> ApiError:
    return ApiError(400, f"Bad Request: can't parse entities: {detail}")


def _check_markdown(text: str, marks: str) -> None:
    """Refuse an entity mark (``*``, ``_``, ...) without its closing twin; a backslash escapes the next character."""
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] in marks:
            end = text.find(text[i], i + 1)
            if end < 0:
                offset = len(text[:i].encode())
                raise _entity_error(f"Can't find end of the entity starting at byte offset {offset}")
            i = end + 1
        else:
            i += 1


def _check_html(text: str) -> None:
    """Refuse a tag Telegram does not know, and tags that are not closed in order."""
    stack: list[str] = []
    for match in _HTML_TAG.finditer(text):
        closing, name = match.group(1), match.group(2).lower()
        offset = len(text[: match.start()].encode())
        if not closing:
            if name not in _HTML_TAGS:
                raise _entity_error(f'Unsupported start tag "{name}" at byte offset {offset}')
            stack.append(name)
        elif not stack or stack.pop() != name:
            raise _entity_error(f'Unmatched end tag at byte offset {offset}: "</{name}>"')
    if stack:
        raise _entity_error(f'Can\'t find end tag corresponding to start tag "{stack[-1]}"')
