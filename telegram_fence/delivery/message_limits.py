"""Telegram's length limit on a message text (4096), checked before anything is sent.

Telegram counts UTF-16 code units after entities parsing. :func:`visible_text` removes at least the markup
Telegram removes, so a text counted too long here is too long for Telegram too (not always the converse)."""

from __future__ import annotations

import html
import re

from ..errors import ConfigurationError

__all__ = ["TEXT_LIMIT", "check_encodable", "check_length", "utf16_length", "visible_text"]

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
