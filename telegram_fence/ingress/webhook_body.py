"""What a webhook request's body says: read within a size bound (:func:`read_body`) and decoded into one update
(:func:`decode_update`), or refused with the HTTP status to answer (:class:`Rejected`) before anything is stored.
May import ``ingress.answers``, ``updates`` and the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..updates import UnreadableUpdate
from .answers import unreadable_update

__all__ = ["Rejected", "decode_update", "read_body"]

_READ_CHUNK = 65536
_MAX_LENGTH_DIGITS = 19


class Rejected(Exception):
    """A request answered with ``status`` before anything was stored."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Made once: json.loads(..., parse_constant=) would make a decoder per call.
_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def decode_update(body: bytes) -> dict[str, Any]:
    """The update in ``body``: a JSON object with a non-negative integer ``update_id``.

    An update nesting deeper than Python's JSON reader goes is returned as an
    :class:`~telegram_fence.updates.UnreadableUpdate` (its ``update_id`` alone), which the store keeps as
    an exhaustion: answering 400 would make Telegram send it again and again.
    Raises ``ValueError`` for anything else (not UTF-8, not JSON, ``NaN``, not an object, no id).
    """
    text = body.decode("utf-8")
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        value = unreadable_update(text)
        if value is None:
            raise ValueError("the update nests too deep to be read and has no readable update_id") from None
    if type(value) is not dict and not isinstance(value, UnreadableUpdate):
        raise ValueError("the body is not a JSON object")
    update_id = value.get("update_id")
    if type(update_id) is not int or update_id < 0:
        raise ValueError("the update has no non-negative integer update_id")
    return value


def read_body(environ: Mapping[str, Any], max_body: int) -> bytes:
    """The request body, up to ``max_body`` bytes of a WSGI request; 413 above it, 400 for a bad Content-Length or a
    body that stopped arriving."""
    stream = environ.get("wsgi.input")
    declared = str(environ.get("CONTENT_LENGTH") or "").strip()
    if declared:
        # ASCII digits only (str.isdigit() takes "²", which int() refuses), and few enough that int()
        # never meets its digit limit: 19 digits are far above any max_body.
        if not (declared.isascii() and declared.isdigit()) or len(declared) > _MAX_LENGTH_DIGITS:
            raise Rejected(400, "bad Content-Length: not a plain decimal number of bytes")
        length = int(declared)
        if length > max_body:
            raise Rejected(413, f"body above {max_body} bytes")
        body = _read(stream, length) if length else b""
        if len(body) < length:
            raise Rejected(400, "body shorter than its Content-Length")
        return body
    # No Content-Length (a chunked body, decoded by the server): read to the end, up to the limit.
    body = _read(stream, max_body + 1)
    if len(body) > max_body:
        raise Rejected(413, f"body above {max_body} bytes")
    return body


def _read(stream: Any, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``stream``, fewer only at its end; ``b""`` without a stream. A body that stops
    arriving (the server's bound on the request ran out, the connection reset) is :class:`Rejected` with 400."""
    try:
        return _read_all(stream, limit)
    except OSError as exc:  # TimeoutError, ConnectionError: the client's doing, answered, never a traceback
        raise Rejected(400, f"the body did not arrive whole: {type(exc).__name__}") from None


def _read_all(stream: Any, limit: int) -> bytes:
    if stream is None:
        return b""
    first = stream.read(min(limit, _READ_CHUNK))
    if not first or len(first) == limit:  # the common case: the whole body in one read
        return bytes(first)
    chunks: list[bytes] = [first]
    left = limit - len(first)
    while left > 0:
        chunk = stream.read(min(left, _READ_CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
