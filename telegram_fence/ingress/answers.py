"""Reading a ``getUpdates`` answer, also one that nests deeper than Python's JSON reader goes.

Python's reader raises ``RecursionError`` about a thousand levels deep (a hostile or broken proxy): one such update
would make every answer unreadable and stall every update behind it. :func:`read_answer` then reads the answer item
by item without recursion, an update too deep to read becoming an :class:`~telegram_fence.updates.UnreadableUpdate`
(its ``update_id`` alone, stored as an exhaustion). Pure functions; imports ``updates`` and the standard library.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..updates import UnreadableUpdate

__all__ = ["UNREADABLE_REASON", "read_answer", "unreadable_update"]

UNREADABLE_REASON = "the update nests too deep to be read as JSON; its payload was not stored"

# A JSON string (escapes included) or one bracket: what matters for finding where a value ends.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SCALAR_END = re.compile(r"[,\]} \t\n\r]")

Member = tuple[Any, int, int]  # (key, or None in an array; start of the value; end of the value)


def read_answer(body: bytes | str) -> Any:
    """``body`` as Python's JSON reader reads it, or, too deep for it, item by item: an update too deep to read is
    an :class:`~telegram_fence.updates.UnreadableUpdate` (``None`` without a readable ``update_id``). Raises
    ``ValueError`` for a body that is not JSON or too deep outside ``result``'s items."""
    try:
        return json.loads(body)
    except RecursionError:
        pass
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    try:
        return _read_by_items(text)
    except (IndexError, RecursionError):
        raise ValueError("the answer nests too deep to be read and is not a readable getUpdates answer") from None


def _read_by_items(text: str) -> dict[str, Any]:
    start = _skip(text, 0)
    if text[start] != "{":
        raise ValueError("the answer nests too deep to be read and is not a JSON object")
    members, end = _members(text, start)
    if _skip(text, end) != len(text):
        raise ValueError("extra data after the answer")
    answer: dict[str, Any] = {}
    for key, first, last in members:  # a key given twice: the last one counts, as for Python's reader
        if key == "result" and text[first] == "[":
            items, _end = _members(text, first)
            answer[key] = [_read_item(text[a:b]) for _key, a, b in items]
        else:
            answer[key] = json.loads(text[first:last])
    return answer


def _read_item(item: str) -> Any:
    try:
        return json.loads(item)
    except RecursionError:
        return unreadable_update(item)


def unreadable_update(item: str) -> UnreadableUpdate | None:
    """The :class:`~telegram_fence.updates.UnreadableUpdate` for ``item``, one update's JSON too deep to read: its
    top-level ``update_id`` read alone (``None`` without a non-negative integer one). ``ValueError`` for text
    malformed around its top level."""
    update_id = None
    start = _skip(item, 0)
    try:
        if item[start:start + 1] == "{":
            for key, first, last in _members(item, start)[0]:
                if key == "update_id":  # a key given twice: the last one counts, as for Python's reader
                    try:
                        update_id = json.loads(item[first:last])
                    except RecursionError:
                        update_id = None
    except IndexError:
        raise ValueError("the update is cut short") from None
    if type(update_id) is not int or update_id < 0:
        return None
    return UnreadableUpdate(update_id, UNREADABLE_REASON)


def _skip(text: str, index: int) -> int:
    match = _WHITESPACE.match(text, index)
    return match.end() if match else index


def _members(text: str, start: int) -> tuple[list[Member], int]:
    """The members of the object or array opening at ``start`` (nested values skipped, not read), and the index
    just after it. ``ValueError`` (``IndexError`` at the end of the text) when it is malformed."""
    closer = "}" if text[start] == "{" else "]"
    index = _skip(text, start + 1)
    members: list[Member] = []
    if text[index] == closer:
        return members, index + 1
    while True:
        key: Any = None
        if closer == "}":
            match = _STRING.match(text, index)
            if match is None:
                raise ValueError(f"expected a key at character {index}")
            key = json.loads(match.group())
            index = _skip(text, match.end())
            if text[index] != ":":
                raise ValueError(f"expected ':' at character {index}")
            index = _skip(text, index + 1)
        end = _value_end(text, index)
        members.append((key, index, end))
        index = _skip(text, end)
        if text[index] == ",":
            index = _skip(text, index + 1)
        elif text[index] == closer:
            return members, index + 1
        else:
            raise ValueError(f"expected ',' or {closer!r} at character {index}")


def _value_end(text: str, start: int) -> int:
    first = text[start]
    if first == '"':
        match = _STRING.match(text, start)
        if match is None:
            raise ValueError(f"unterminated string at character {start}")
        return match.end()
    if first not in "[{":
        match = _SCALAR_END.search(text, start)
        end = match.start() if match else len(text)
        if end == start:
            raise ValueError(f"expected a value at character {start}")
        return end
    depth = 0
    for match in _TOKEN.finditer(text, start):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
        elif token in ("]", "}"):
            depth -= 1
            if depth == 0:
                return match.end()
    raise ValueError(f"unterminated value at character {start}")
