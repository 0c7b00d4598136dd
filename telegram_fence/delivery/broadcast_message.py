"""What a broadcast sends and to whom: the message text's checks (length as Telegram counts it, valid Unicode),
the audience's chat ids and the send options, each refused with a :class:`ConfigurationError` naming the fault."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigurationError

# -------------------------------------------------------------------------------------------- message length
# Telegram counts UTF-16 code units after entities parsing. visible_text removes at least the markup Telegram
# removes, so a text counted too long here is too long for Telegram too (not always the converse).

TEXT_LIMIT = 4096

_TAG = re.compile(r"<[^>]*>")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_FENCE_LANGUAGE = re.compile(r"```[^\s`]*\n")
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)
_MARKDOWN_MARKS = re.compile(r"[*_`\[\]]")
_MARKDOWN_V2_MARKS = re.compile(r"[*_~|`>\[\]]")


def utf16_length(text: str) -> int:
    """The length of ``text`` in UTF-16 code units, as Telegram counts it."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def check_encodable(text: str, what: str = "message text") -> None:
    """Raise :class:`ConfigurationError` naming the position (never the text) of a lone surrogate in ``text``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"the {what} holds a lone surrogate (U+{ord(text[exc.start]):04X}) at character "
                                 f"{exc.start}: it is not valid Unicode and cannot be sent to Telegram; fix the text "
                                 "(e.g. decode its source as UTF-8)") from None


def visible_text(text: str, parse_mode: str | None) -> str:
    """At most the text Telegram shows for ``text`` sent with ``parse_mode`` (see the module docstring)."""
    mode = (parse_mode or "").lower()
    if mode == "html":
        text = html.unescape(_TAG.sub("", text))
    elif mode in ("markdown", "markdownv2"):
        text = _FENCE_LANGUAGE.sub("", text)
        text = _LINK.sub(r"\1", text)
        marks = _MARKDOWN_V2_MARKS if mode == "markdownv2" else _MARKDOWN_MARKS
        # Escaped characters stay (without their backslash); every other markup character goes.
        pieces = _ESCAPED.split(text)
        text = "".join(piece if index % 2 else marks.sub("", piece) for index, piece in enumerate(pieces))
    return text.strip()


def check_length(text: str, parse_mode: str | None = None) -> int:
    """The counted length of ``text``; :class:`ConfigurationError` when it is over the limit or holds a lone
    surrogate."""
    check_encodable(text)
    length = utf16_length(visible_text(text, parse_mode))
    if length > TEXT_LIMIT:
        counted = "visible characters" if parse_mode else "characters"
        raise ConfigurationError(f"the message text is {length} {counted} long (UTF-16 code units, as Telegram counts"
                                 f"{', after ' + parse_mode + ' markup' if parse_mode else ''}); Telegram allows at "
                                 f"most {TEXT_LIMIT}: shorten it or split it into several messages")
    return length


# ------------------------------------------------------------------------------------------------------- input

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_USERNAME = re.compile(r"@[A-Za-z][A-Za-z0-9_]{3,31}")
_DECIMAL = re.compile(r"-?[0-9]{1,19}")
_MAX_CHAT_ID = 2**53 - 1  # Telegram chat ids fit in 52 bits: a larger number is a typo
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


def validate_name(name: object) -> str:
    """Return ``name`` if it is 1-100 letters, digits, ``_ . -`` (no ``..``); else raise :class:`ConfigurationError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ConfigurationError(f"broadcast name {name!r} is not allowed: use 1-100 letters, digits, '_', '.' or '-', "
                                 "starting with a letter or digit (no path separators, no '..')")
    return name


def _chat_id(entry: object, position: int) -> int | str:
    if isinstance(entry, bool):
        raise ConfigurationError(f"audience entry #{position} ({entry!r}) is a bool, not a chat id")
    text = entry.strip() if isinstance(entry, str) else None
    if isinstance(entry, int):
        value = entry
    elif text is not None and _USERNAME.fullmatch(text):
        return text
    elif text is not None and _DECIMAL.fullmatch(text):
        value = int(text)
    else:
        raise ConfigurationError(f"audience entry #{position} ({entry!r}) is not a chat id: pass an integer or an "
                                 "'@channelusername' (5-32 letters, digits or '_', starting with a letter)")
    if value == 0 or abs(value) > _MAX_CHAT_ID:
        raise ConfigurationError(f"audience entry #{position} ({entry!r}) is not a valid chat id")
    return value


def normalize_audience(entries: Iterable[object]) -> list[int | str]:
    """The chat ids of ``entries`` (ints, decimal strings, ``@usernames`` compared case-insensitively), each once.
    Raises :class:`ConfigurationError` naming the first entry (position and value) that is not a chat id, or when
    nothing is left."""
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


def normalize_send_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as plain JSON values for ``send_message`` (markup objects become dicts; ``None`` is dropped). Raises
    :class:`ConfigurationError` naming an unsupported option (per-chat ones included) or a wrong type."""
    result: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key in _SCALAR_OPTIONS:
            want = _SCALAR_OPTIONS[key]
            if not isinstance(value, want) or (bool not in want and isinstance(value, bool)):
                raise ConfigurationError(f"send option {key}={value!r} must be {' or '.join(k.__name__ for k in want)}")
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
        else:
            supported = ", ".join(sorted((*_SCALAR_OPTIONS, *_JSON_OPTIONS)))
            raise ConfigurationError(f"send option {key!r} is not supported for a broadcast; supported: {supported}")
        result[key] = value
    return result


def _send_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    kwargs = dict(options)
    if "reply_markup" in kwargs:  # telebot passes a str through as is
        kwargs["reply_markup"] = json.dumps(kwargs["reply_markup"], separators=(",", ":"))
    if "link_preview_options" in kwargs:  # telebot reads its attributes
        kwargs["link_preview_options"] = _link_preview(kwargs["link_preview_options"])
    return kwargs


def _link_preview(value: Mapping[str, Any]) -> Any:
    from telebot import types

    return types.LinkPreviewOptions(**value)
