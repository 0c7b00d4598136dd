"""Markup checks of the fake Bot API: enough of Telegram's three parsers to refuse what Telegram refuses."""

from __future__ import annotations

from .answers import ApiError

__all__ = ["utf16_len", "visible_text"]


def _byte_offset(text: str, index: int) -> int:
    return len(text[:index].encode("utf-8"))


def _entity_error(detail: str) -> ApiError:
    return ApiError(400, f"Bad Request: can't parse entities: {detail}")


def _plain_markdown(text: str) -> str:
    """Legacy ``Markdown``: return the visible text or raise the 400 Telegram sends for bad markup."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "_*`[":
            out.append(text[i + 1])
            i += 2
            continue
        if c in "*_":
            end = text.find(c, i + 1)
            if end < 0:
                raise _entity_error(f"Can't find end of the entity starting at byte offset {_byte_offset(text, i)}")
            out.append(text[i + 1 : end])
            i = end + 1
            continue
        if c == "`":
            fence = "```" if text.startswith("```", i) else "`"
            end = text.find(fence, i + len(fence))
            if end < 0:
                raise _entity_error(f"Can't find end of the entity starting at byte offset {_byte_offset(text, i)}")
            out.append(text[i + len(fence) : end])
            i = end + len(fence)
            continue
        if c == "[":
            close = text.find("]", i + 1)
            if close < 0 or not text.startswith("(", close + 1) or text.find(")", close + 2) < 0:
                raise _entity_error(f"Can't find end of the entity starting at byte offset {_byte_offset(text, i)}")
            out.append(text[i + 1 : close])
            i = text.find(")", close + 2) + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


_V2_RESERVED = set("_*[]()~`>#+-=|{}.!")
_V2_NAMES = {
    "*": "Bold",
    "_": "Italic",
    "__": "Underline",
    "~": "Strikethrough",
    "||": "Spoiler",
    "[": "TextUrl",
}


def _plain_markdown_v2(text: str) -> str:
    """``MarkdownV2``: return the visible text or raise the 400 Telegram sends for bad markup."""
    out: list[str] = []
    stack: list[tuple[str, int]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 < n and 0 < ord(text[i + 1]) < 127:
                out.append(text[i + 1])
                i += 2
                continue
            raise _entity_error("Character '\\' is reserved and must be escaped with the preceding '\\'")
        if c == "`":
            fence = "```" if text.startswith("```", i) else "`"
            j = i + len(fence)
            while j < n and not text.startswith(fence, j):
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise _entity_error(
                    f"Can't find end of {'Pre' if fence == '```' else 'Code'} entity at byte offset "
                    f"{_byte_offset(text, i)}"
                )
            out.append(text[i + len(fence) : j].replace("\\`", "`").replace("\\\\", "\\"))
            i = j + len(fence)
            continue
        if c == "]":
            if not stack or stack[-1][0] != "[":
                raise _entity_error("Character ']' is reserved and must be escaped with the preceding '\\'")
            stack.pop()
            if not text.startswith("(", i + 1):
                raise _entity_error(f"Can't find end of TextUrl entity at byte offset {_byte_offset(text, i)}")
            end = text.find(")", i + 2)
            if end < 0:
                raise _entity_error(f"Can't find end of a URL at byte offset {_byte_offset(text, i + 1)}")
            i = end + 1
            continue
        if c == ">" and (i == 0 or text[i - 1] == "\n"):
            i += 1
            continue
        marker: str | None = None
        if c == "_":
            marker = "__" if text.startswith("__", i) else "_"
        elif c in "*~[":
            marker = c
        elif c == "|" and text.startswith("||", i):
            marker = "||"
        if marker is not None:
            if marker != "[" and stack and stack[-1][0] == marker:
                stack.pop()
            elif marker != "[" and any(m == marker for m, _ in stack):
                top, at = stack[-1]
                raise _entity_error(f"Can't find end of {_V2_NAMES[top]} entity at byte offset {at}")
            else:
                stack.append((marker, _byte_offset(text, i)))
            i += len(marker)
            continue
        if c in _V2_RESERVED:
            raise _entity_error(f"Character '{c}' is reserved and must be escaped with the preceding '\\'")
        out.append(c)
        i += 1
    if stack:
        top, at = stack[-1]
        raise _entity_error(f"Can't find end of {_V2_NAMES[top]} entity at byte offset {at}")
    return "".join(out)


_HTML_TAGS = frozenset({
    "b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler", "a", "code", "pre",
    "blockquote", "tg-emoji"
})
_HTML_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}


def _plain_html(text: str) -> str:
    """``HTML``: return the visible text or raise the 400 Telegram sends for bad markup."""
    out: list[str] = []
    stack: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "<":
            end = text.find(">", i + 1)
            if end < 0:
                raise _entity_error(f"Unclosed start tag at byte offset {_byte_offset(text, i)}")
            inner = text[i + 1 : end].strip()
            if inner.startswith("/"):
                name = inner[1:].strip().lower()
                if not stack:
                    raise _entity_error(f"Unexpected end tag at byte offset {_byte_offset(text, i)}")
                if name != stack[-1]:
                    raise _entity_error(
                        f'Unmatched end tag at byte offset {_byte_offset(text, i)}, expected "</{stack[-1]}>", '
                        f'found "</{name}>"'
                    )
                stack.pop()
            else:
                name = inner.split(None, 1)[0].lower() if inner else ""
                if name not in _HTML_TAGS:
                    raise _entity_error(f'Unsupported start tag "{name}" at byte offset {_byte_offset(text, i)}')
                stack.append(name)
            i = end + 1
            continue
        if c == "&":
            end = text.find(";", i + 1, i + 12)
            name = text[i + 1 : end] if end > 0 else ""
            if name in _HTML_ENTITIES:
                out.append(_HTML_ENTITIES[name])
                i = end + 1
                continue
        out.append(c)
        i += 1
    if stack:
        raise _entity_error(f'Can\'t find end tag corresponding to start tag "{stack[-1]}"')
    return "".join(out)


def visible_text(text: str, parse_mode: str | None) -> str:
    """The text a user would see; raises the Telegram 400 for markup it cannot parse."""
    mode = (parse_mode or "").strip().lower()
    if not mode:
        return text
    if mode == "markdown":
        return _plain_markdown(text)
    if mode == "markdownv2":
        return _plain_markdown_v2(text)
    if mode == "html":
        return _plain_html(text)
    raise ApiError(400, f"Bad Request: unsupported parse_mode {parse_mode!r}")


def utf16_len(text: str) -> int:
    """The length of ``text`` in UTF-16 code units, the unit of Telegram's limits and entity offsets."""
    return len(text.encode("utf-16-le")) // 2
