"""Plain functions over raw update dicts: where an update comes from, and how its text is kept storable."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MESSAGE_FIELDS", "REDELIVERY_WINDOW", "UnreadableUpdate", "chat_id_of", "escape_lone_surrogates"]

#: Seconds Telegram may still deliver an update again through a webhook (24 hours): a stored update the cursor has
#: not passed is kept this long after it was recorded, whatever ``retention`` or ``prune`` ask.
REDELIVERY_WINDOW = 86_400.0

# A UTF-16 surrogate code point on its own: JSON's "\ud800" escape decodes to one, and UTF-8 cannot hold it.
_SURROGATE = re.compile("[\ud800-\udfff]")

#: Update fields whose value is a message (what a capture can be made of), in the order they are looked at.
MESSAGE_FIELDS = (
    "message", "edited_message", "channel_post", "edited_channel_post", "business_message", "edited_business_message",
)

# Update fields whose value is (or carries) a message-like object with a ``chat``.
_CHAT_CARRIERS = (*MESSAGE_FIELDS, "my_chat_member", "chat_member", "chat_join_request", "message_reaction",
                  "message_reaction_count", "chat_boost", "removed_chat_boost")


class UnreadableUpdate(dict):  # type: ignore[type-arg]
    """An update that could not be read (nested too deep for JSON): only its ``update_id``, ``reason`` saying why.
    The store keeps it as an unacknowledged exhaustion; it is never claimed, handled or captured."""

    def __init__(self, update_id: int, reason: str) -> None:
        super().__init__(update_id=update_id)
        self.reason = reason


def chat_id_of(update: Mapping[str, Any]) -> int | None:
    """The chat an update belongs to (its ordering line), or ``None``: none (inline queries, polls, …), or an id
    beyond 64 bits. Never raises, whatever the dict holds."""
    # Runs for every update recorded: plain dicts are checked by type first (cheap), other mappings by the ABC.
    for key in _CHAT_CARRIERS:
        value = update.get(key)
        if value is not None and (type(value) is dict or isinstance(value, Mapping)):
            chat_id = _id_of_chat(value)
            if chat_id is not None:
                return chat_id
    callback = update.get("callback_query")
    message = callback.get("message") if isinstance(callback, Mapping) else None
    return _id_of_chat(message) if isinstance(message, Mapping) else None


def _id_of_chat(carrier: Mapping[str, Any]) -> int | None:
    chat = carrier.get("chat")
    if chat is not None and (type(chat) is dict or isinstance(chat, Mapping)):
        chat_id = chat.get("id")
        if type(chat_id) is int and -(2**63) <= chat_id < 2**63:  # not bool, nor an int subclass
            return chat_id
    return None


def escape_lone_surrogates(text: str) -> str:
    """``text`` with every surrogate code point written as its ``\\uXXXX`` escape, so it encodes as UTF-8 (JSON
    text stays valid and decodes to the same value). Never raises."""
    if text.isascii():
        return text
    return _SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
