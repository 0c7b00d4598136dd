"""The journal's view of the attempt running on this thread (its next call position, queued and uncertain calls)
and the handler-facing ``queue_calls`` / ``uncertain_calls``.

May import ``errors``, ``store`` (types) and the standard library. A :class:`Frame` is only touched on its
attempt's thread (found through a thread-local).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import ConfigurationError
from ..store import Identity

__all__ = ["Frame", "QueuedCall", "UncertainCall", "active", "begin", "leave", "peek", "queue_calls", "stale_step",
           "uncertain_calls", "unjournaled"]


class _Local(threading.local):
    """Each thread's journal frame (made on first use) and ``begun``: ``(the running attempt's context, the frame
    and begun it replaced)``, ``None`` outside an attempt."""

    frame: Frame | None = None
    begun: tuple[Any, Frame | None, Any] | None = None
    stepping: Any = None  # the attempt whose durable step runs on this thread (its calls are not journaled)


_LOCAL = _Local()


@dataclass(frozen=True)
class UncertainCall:
    """A journaled call that may or may not have reached Telegram; never sent again automatically. ``error``: why
    (tokens masked)."""

    update_id: int
    seq: int
    method: str
    chat_id: int | None
    error: str


class QueuedCall(NamedTuple):
    """A call a handler queued inside ``ctx.transaction()``: written there, sent after the commit."""

    seq: int
    method: str
    chat_id: int | None
    digest: str
    request: str
    transaction: int = 0  # the ctx.transaction() it was made in (its number), 0: outside any


class Frame:
    """One attempt as the journal sees it."""

    __slots__ = ("ctx", "identity", "next_seq", "pending", "queueing", "uncertain", "written")

    def __init__(self, identity: Identity, ctx: Any = None) -> None:
        self.identity = identity
        self.ctx = ctx  # the attempt's context (read only: whether it settled its update)
        self.next_seq = 0
        self.queueing = 0
        self.pending: list[QueuedCall] = []  # queued, not yet written
        self.written: list[QueuedCall] = []  # written in a transaction not yet committed
        self.uncertain: list[UncertainCall] = []


def active() -> Frame | None:
    """The frame of the attempt running on this thread (made now if need be), or ``None`` outside one."""
    local = _LOCAL
    frame = local.frame
    if frame is None:
        begun = local.begun
        if begun is not None:
            ctx = begun[0]
            frame = local.frame = Frame(ctx.identity, ctx=ctx)
    return frame


def peek() -> Frame | None:
    """The frame of the attempt running on this thread if one was made, else ``None``."""
    return _LOCAL.frame


def begin(ctx: Any) -> None:
    """Attempt ``ctx`` begins on this thread (until :func:`leave`); its frame is made on first use."""
    local = _LOCAL
    local.begun = (ctx, local.frame, local.begun)
    local.frame = None


def leave() -> None:
    """The attempt begun last on this thread ended: the one it replaced is back."""
    local = _LOCAL
    begun = local.begun
    if begun is None:
        local.frame = None
    else:
        local.frame, local.begun = begun[1], begun[2]


@contextmanager
def unjournaled(ctx: Any = None) -> Iterator[None]:
    """Inside, this thread's Bot API calls are not journaled (a durable step's own: the step is recorded); they
    wait for the rate limits, and raise ``OwnershipLost`` unsent once ``ctx`` lost its update (:func:`stale_step`)."""
    local = _LOCAL
    saved = local.frame, local.begun, local.stepping
    local.frame = local.begun = None
    local.stepping = ctx
    try:
        yield
    finally:
        local.frame, local.begun, local.stepping = saved


def stale_step() -> Any:
    """The attempt whose durable step runs on this thread, if it has lost its update, else ``None``."""
    ctx = _LOCAL.stepping
    return ctx if ctx is not None and getattr(ctx, "lost", False) else None


@contextmanager
def queue_calls() -> Iterator[None]:
    """Inside the block, the handler's Bot API calls are queued instead of sent.

    Use it inside ``ctx.transaction()``: the queued calls are written in that transaction and sent, through
    the journal, after it commits (exactly once, or ``uncertain``; never lost between the commit and the
    send: a process that dies there leaves them queued, and the next fence to start sends them). A queued
    call returns ``None`` to the handler (telebot's methods then return ``None``). Calls queued outside a
    transaction commit with the update's settle when the handler returns. Raises
    :class:`~telegram_fence.errors.ConfigurationError` outside a handler of a fence that journals calls.
    """
    frame = active()
    if frame is None:
        raise ConfigurationError("queue_calls() works only inside a handler of a Fence with journal_calls=True")
    frame.queueing += 1
    try:
        yield
    finally:
        frame.queueing -= 1


def uncertain_calls() -> list[UncertainCall]:
    """The calls of the running attempt that came out uncertain so far (replayed ones included), in order.

    Empty outside a handler or when the journal is off. An uncertain call returns ``None`` to the handler
    (or raises :class:`~telegram_fence.errors.CallUncertain` with ``uncertain_calls="raise"``).
    """
    frame = active()
    return list(frame.uncertain) if frame is not None else []


