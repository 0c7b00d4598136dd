"""The way to the one writer: every store write of a running fence posted to the writer thread and waited for (done on
the calling thread while no writer serves).

The writer thread runs each write in its next round's transaction. Called on the writer thread itself, or while no
writer serves (before ``start``, after the join, a writer that died), a write runs on the calling thread instead.
Any thread may call it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from .mailbox import Answer, Mailbox, RecordRequest, WriteRequest

__all__ = ["Abandoned", "Writer"]

T = TypeVar("T")

#: How often a waiting sender looks whether the writer is still there (seconds).
_LOOK = 0.5


class Abandoned(Exception):
    """The sender stopped waiting for its write (``while_waiting`` said so); the write may still run later."""


class Writer:
    """Hands writes to the writer thread and waits for their answers; ``record`` is the store's, for a batch recorded
    on the calling thread."""

    def __init__(self, mailbox: Mailbox, record: Callable[..., int]) -> None:
        self.mailbox = mailbox
        self._record = record
        self._thread: threading.Thread | None = None

    def serve(self, thread: threading.Thread) -> None:
        """``thread`` (the pool's ``fence-dispatcher``) takes the writes from now on, while it is alive."""
        self._thread = thread

    def serving(self) -> bool:
        """Whether a writer thread runs and takes writes."""
        thread = self._thread
        return thread is not None and thread.is_alive() and not self.mailbox.closed()

    def _direct(self) -> bool:
        return threading.current_thread() is self._thread or not self.serving()

    def record(self, updates: Sequence[Mapping[str, Any]], next_offset: int, **kwargs: Any) -> int:
        """``store.record(updates, next_offset, **kwargs)`` done by the writer; returns once it committed.
        Raises what ``store.record`` (or the transaction holding it) raised."""
        if self._direct():
            return int(self._record(updates, next_offset, **kwargs))
        request = RecordRequest(updates, next_offset, kwargs)
        if not self._wait(request, None):
            return int(self._record(updates, next_offset, **kwargs))
        return request.outcome()

    def call(self, fn: Callable[[], T], *, while_waiting: Callable[[], bool] | None = None,
             durable: bool = True) -> T:
        """``fn()`` (a store write) done by the writer; returns its result or raises its exception once the round
        holding it committed. ``durable=False``: ``fn`` commits at the store's work level (a retry, a renewal, a
        release). ``while_waiting()`` is asked every 50 ms; when it returns ``False`` the wait ends with
        :class:`Abandoned`."""
        if self._direct():
            return fn()
        request = WriteRequest(fn, durable)
        if not self._wait(request, while_waiting):
            return fn()
        return cast(T, request.outcome())

    def _wait(self, request: Answer[Any], while_waiting: Callable[[], bool] | None) -> bool:
        """Post ``request`` and wait for it; ``False`` when the writer went away before taking it (the caller then
        does the write itself)."""
        self.mailbox.post(request)
        look = _LOOK if while_waiting is None else 0.05
        waited = 0.0
        while not request.wait(look):
            waited += look
            if while_waiting is not None and not while_waiting():
                raise Abandoned("stopped waiting for the writer")
            if waited >= _LOOK:
                waited = 0.0
                if not self.serving() and self.mailbox.withdraw(request):
                    return False
        return True
