"""What the fake Bot API saw, for tests to read: requests, accepted messages, uploads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Call", "Sent", "UploadedFile"]


@dataclass(frozen=True)
class UploadedFile:
    """A file part of a multipart request, as the fake server received it."""

    field: str
    filename: str | None
    content: bytes
    content_type: str | None = None


@dataclass(frozen=True)
class Call:
    """One HTTP request the fake server received (also refused or faulted ones): ``params`` merges the query string
    and the body (uploads as :class:`UploadedFile`); ``time`` is ``time.time()`` at its arrival."""

    method: str
    params: dict[str, Any]
    time: float


@dataclass(frozen=True)
class Sent:
    """A message the fake server accepted (sent or edited): what a user would see."""

    chat_id: int
    text: str | None
    message_id: int
    method: str
    params: dict[str, Any] = field(repr=False)
