"""The way to the writer: every store write of the pool goes to the dispatcher thread as a message.

One job: :class:`Writer`, what the other threads call to have a write done by the one thread that owns
the store's writes (the current dispatcher): a batch to record (``record``, the poller's and the webhook
intake's) or any other write (``call``: retries, exhaustions, renewals, releases). Each is posted to the
dispatcher's mailbox and waited for; the dispatcher runs it in its next round. Called on the writer
thread itself, or while no dispatcher runs (before ``start``, after the writer closed, a dispatcher that
died), the write runs on the calling thread instead, so nothing ever waits for a writer that is not
there. May import ``runtime.handoff``, ``runtime.mailbox``, ``runtime.seat`` and the standard library.

Thread safety: any thread may call it; it keeps no state of its own beyond its parts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from .handoff import Answer, PulledRecord, RecordRequest, WriteRequest
from .mailbox import Mailbox
from .seat import Seat

__all__ = ["Abandoned", "Writer"]

T = TypeVar("T")

#: How often a waiting sender looks whether the writer is still there (seconds).
_LOOK = 0.5


class Abandoned(Exception):
    """The sender stopped waiting for its write (``while_waiting`` said so); the write may still run later."""


class Writer:
    """Hands writes to the dispatcher thread and waits for their answers (see the module docstring)."""

    def __init__(self, seat: Seat, mailbox: Mailbox, record: Callable[..., int]) -> None:
        self._seat = seat
        self._mailbox = mailbox
        self._record = record  # the store's record, for the direct case

    def serving(self) -> bool:
        """Whether a dispatcher thread runs and takes writes."""
        holder = self._seat.holder()
        return holder is not None and holder.is_alive() and not self._mailbox.closed()

    def on_writer(self) -> bool:
        """Whether the calling thread is the writer (the current dispatcher)."""
        return threading.current_thread() is self._seat.holder()

    def record(self, updates: Sequence[Mapping[str, Any]], next_offset: int, **kwargs: Any) -> int:
        """``store.record(updates, next_offset, **kwargs)`` done by the writer; blocks until it committed and
        returns its result. Raises what ``store.record`` (or the transaction holding it) raised."""
        if self.on_writer() or not self.serving():
            return int(self._record(updates, next_offset, **kwargs))
        request = RecordRequest(updates, next_offset, kwargs)
        if not self._wait(request, None):
            return int(self._record(updates, next_offset, **kwargs))
        return request.outcome()

    def post(self, request: PulledRecord) -> bool:
        """Post ``request`` for the writer's next round without waiting for it (its ``done`` answers it);
        ``False`` (nothing posted) on the writer's own thread or while no writer serves."""
        if self.on_writer() or not self.serving():
            return False
        self._mailbox.post(request)
        return True

    def orphaned(self, request: PulledRecord) -> bool:
        """Whether the writer went away without taking ``request`` (withdrawn then: it is never taken)."""
        return not self.serving() and self._mailbox.withdraw(request)

    def call(self, fn: Callable[[], T], *, while_waiting: Callable[[], bool] | None = None,
             durable: bool = True) -> T:
        """``fn()`` (a store write) done by the writer; blocks until it ran and returns its result or raises its
        exception. The writer runs it inside its next round's transaction (a savepoint of its own, where the store
        nests its calls) and answers once that committed. ``durable=False`` says ``fn`` commits at the store's
        work level (a retry, a renewal, a release: see :class:`~.handoff.WriteRequest`). ``while_waiting()`` is
        called every 50 ms while waiting; when it returns ``False`` the wait ends with :class:`Abandoned`."""
        if self.on_writer() or not self.serving():
            return fn()
        request = WriteRequest(fn, durable)
        if not self._wait(request, while_waiting):
            return fn()
        return cast(T, request.outcome())

    def _wait(self, request: Answer[Any], while_waiting: Callable[[], bool] | None) -> bool:
        """Post ``request`` and wait for it; ``False`` when the writer went away before taking it (the caller
        then does the write itself)."""
        self._mailbox.post(request)
        look = _LOOK if while_waiting is None else 0.05
        waited = 0.0
        while not request.wait(look):
            waited += look
            if while_waiting is not None and not while_waiting():
                raise Abandoned("stopped waiting for the writer")
            if waited >= _LOOK:
                waited = 0.0
                if not self.serving() and self._mailbox.withdraw(request):
                    return False
        return True
