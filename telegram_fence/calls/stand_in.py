"""What a handler gets back from a call whose real answer it cannot have: an uncertain call (it may or may not have
reached Telegram) or a queued one (sent after the commit). A stand-in of the answer's type that still carries the
chat the call was addressed to, so telebot's idiom ``msg = bot.send_message(chat, ...)`` followed by
``bot.register_next_step_handler(msg, ...)`` keeps the conversation going.

The stand-in message has ``message_id`` 0 and ``date`` 0 (Telegram never uses either), the call's chat, and its
``text`` or ``caption``. May import the standard library and :mod:`.verdicts` only. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .verdicts import chat_of

__all__ = ["NO_RESULT", "stand_in"]

#: The answer of a call whose result is unknown and has no stand-in: telebot's method returns ``None``.
NO_RESULT = '{"ok": true, "result": null}'

#: The Bot API methods whose answer is one Message (the ``send*`` methods but ``sendChatAction`` and
#: ``sendMediaGroup``, and ``forwardMessage``), in lower case.
_MESSAGE = frozenset(name.lower() for name in (
    "sendMessage", "forwardMessage", "sendPhoto", "sendAudio", "sendDocument", "sendVideo", "sendAnimation",
    "sendVoice", "sendVideoNote", "sendPaidMedia", "sendLocation", "sendVenue", "sendContact", "sendPoll",
    "sendDice", "sendSticker", "sendInvoice", "sendGame",
))


def _chat(chat_id: int) -> dict[str, Any]:
    """The chat object of ``chat_id``: its type as the id's sign tells (users are positive, groups negative,
    supergroups and channels ``-100…``)."""
    if chat_id > 0:
        return {"id": chat_id, "type": "private"}
    return {"id": chat_id, "type": "supergroup" if str(chat_id).startswith("-100") else "group"}


def _message(chat_id: int, params: Mapping[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"message_id": 0, "date": 0, "chat": _chat(chat_id)}
    for key in ("text", "caption"):
        value = params.get(key)
        if isinstance(value, str):
            message[key] = value
    return message


def _media_count(params: Mapping[str, Any]) -> int:
    """How many items a ``sendMediaGroup``'s ``media`` holds (a JSON text or a list; 1 when it cannot be read)."""
    media = params.get("media")
    if isinstance(media, str):
        try:
            media = json.loads(media)
        except ValueError:
            return 1
    return len(media) if isinstance(media, list) and media else 1


def stand_in(method: str, params: Mapping[str, Any] | None) -> str:
    """The Bot API answer (as JSON text) handed to telebot for ``method`` called with ``params`` when the real
    answer is unknown: a stand-in Message for a call that answers one and names a numeric chat, a list of them for
    ``sendMediaGroup`` (one per item), ``{"message_id": 0}`` for ``copyMessage``; for any other call a ``null``
    result (telebot's method then returns ``None``)."""
    params = params or {}
    chat_id = chat_of(params)
    name = method.lower()
    if chat_id is None:
        return NO_RESULT
    if name in _MESSAGE:
        result: Any = _message(chat_id, params)
    elif name == "sendmediagroup":
        result = [_message(chat_id, {}) for _ in range(_media_count(params))]
    elif name == "copymessage":
        result = {"message_id": 0}
    else:
        return NO_RESULT
    return json.dumps({"ok": True, "result": result})
