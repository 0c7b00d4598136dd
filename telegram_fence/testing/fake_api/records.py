"""What the fake Bot API saw, for tests to read: requests, accepted messages, uploads, its own internal errors."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Call", "Records", "Sent", "UploadedFile"]


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


class Records:
    """The requests, accepted messages and internal errors, in arrival order; every access holds ``cond`` (the fake's
    one condition), and every change wakes its waiters, so ``FakeBotAPI.wait_for`` sees it.
    """

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.calls: list[Call] = []
        self.sent: list[Sent] = []
        self.internal_errors: list[BaseException] = []

    def add(self, item: Call | Sent | BaseException) -> None:
        """Append ``item`` to its list."""
        with self.cond:
            if isinstance(item, Call):
                self.calls.append(item)
            elif isinstance(item, Sent):
                self.sent.append(item)
            else:
                self.internal_errors.append(item)
            self.cond.notify_all()
