"""What a broadcast is made of, checked before anything is written: its name, audience and send options."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigurationError

__all__ = ["SUPPORTED_OPTIONS", "normalize_audience", "normalize_send_options", "send_kwargs", "validate_name"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_USERNAME = re.compile(r"@[A-Za-z][A-Za-z0-9_]{3,31}")
_DECIMAL = re.compile(r"-?[0-9]{1,19}")
# Telegram chat ids fit in 52 bits (documented for the Bot API); a larger number is a typo.
_MAX_CHAT_ID = 2**53 - 1


def validate_name(name: object) -> str:
    """Return ``name`` if it can name a broadcast directory; raise :class:`ConfigurationError` otherwise.

    A name is 1-100 characters of letters, digits, ``_``, ``.`` and ``-``, starting with a letter or
    digit: no path separators, no ``..``, nothing a shell or a file system treats specially.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ConfigurationError(
            f"broadcast name {name!r} is not allowed: use 1-100 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit (no path separators, no '..')"
        )
    return name


def _chat_id(entry: object, position: int) -> int | str:
    if isinstance(entry, bool):
        raise ConfigurationError(f"audience entry #{position} ({entry!r}) is a bool, not a chat id")
    if isinstance(entry, int):
        value = entry
    elif isinstance(entry, str) and _USERNAME.fullmatch(entry.strip()):
        return entry.strip()
    elif isinstance(entry, str) and _DECIMAL.fullmatch(entry.strip()):
        value = int(entry.strip())
    else:
        raise ConfigurationError(
            f"audience entry #{position} ({entry!r}) is not a chat id: pass an integer or an "
            "'@channelusername' (5-32 letters, digits or '_', starting with a letter)"
        )
    if value == 0 or abs(value) > _MAX_CHAT_ID:
        raise ConfigurationError(f"audience entry #{position} ({entry!r}) is not a valid chat id")
    return value


def normalize_audience(entries: Iterable[object]) -> list[int | str]:
    """Return the chat ids of ``entries`` in their first-seen order, each once.

    An entry is an ``int`` chat id, a decimal string of one (converted to ``int``), or an
    ``@username`` (compared case-insensitively, first spelling kept). Raises :class:`ConfigurationError`
    naming the first entry (1-based position and value) that is none of these, or when nothing is left.
    """
    if isinstance(entries, (str, bytes)):
        raise ConfigurationError("audience must be a list of chat ids, not a single string")
    seen: set[int | str] = set()
    result: list[int | str] = []
    for position, entry in enumerate(entries, start=1):
        chat = _chat_id(entry, position)
        key = chat.lower() if isinstance(chat, str) else chat
        if key not in seen:
            seen.add(key)
            result.append(chat)
    if not result:
        raise ConfigurationError("audience is empty: a broadcast needs at least one chat id")
    return result


_SCALAR_OPTIONS: dict[str, tuple[type, ...]] = {
    "parse_mode": (str,),
    "disable_notification": (bool,),
    "protect_content": (bool,),
    "disable_web_page_preview": (bool,),
    "message_effect_id": (str,),
    "allow_paid_broadcast": (bool,),
    "timeout": (int, float),
}
_JSON_OPTIONS = ("reply_markup", "link_preview_options")
SUPPORTED_OPTIONS = tuple(sorted((*_SCALAR_OPTIONS, *_JSON_OPTIONS)))


def normalize_send_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``options`` as plain JSON values that can be stored and handed to ``send_message`` later.

    Scalar options keep their value; ``reply_markup`` and ``link_preview_options`` accept a ``dict`` or a
    telebot object with ``to_json()`` and are stored as parsed JSON. Raises :class:`ConfigurationError`
    naming an unsupported option or a value of the wrong type. Per-chat options (``reply_to_message_id``,
    ``message_thread_id``, …) make no sense for a list of chats and are refused.
    """
    result: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key in _SCALAR_OPTIONS:
            types_ = _SCALAR_OPTIONS[key]
            if not isinstance(value, types_) or (bool not in types_ and isinstance(value, bool)):
                raise ConfigurationError(
                    f"send option {key}={value!r} must be {' or '.join(t.__name__ for t in types_)}"
                )
            result[key] = value
        elif key in _JSON_OPTIONS:
            if hasattr(value, "to_json"):
                value = json.loads(value.to_json())
            if not isinstance(value, dict):
                raise ConfigurationError(f"send option {key} must be a dict or a telebot object, not {value!r}")
            try:
                json.dumps(value)
                if key == "link_preview_options":
                    _link_preview(value)
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"send option {key} cannot be used: {exc}") from exc
            result[key] = value
        else:
            raise ConfigurationError(
                f"send option {key!r} is not supported for a broadcast; supported: {', '.join(SUPPORTED_OPTIONS)}"
            )
    return result


def send_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """Return stored ``options`` as keyword arguments for ``TeleBot.send_message``."""
    kwargs = dict(options)
    if "reply_markup" in kwargs:  # telebot passes a str through as is
        kwargs["reply_markup"] = json.dumps(kwargs["reply_markup"], separators=(",", ":"))
    if "link_preview_options" in kwargs:  # telebot reads its attributes
        kwargs["link_preview_options"] = _link_preview(kwargs["link_preview_options"])
    return kwargs


def _link_preview(value: Mapping[str, Any]) -> Any:
    from telebot import types

    return types.LinkPreviewOptions(**value)


