"""Which conversation changes belong to which attempt: the attempt extension that commits them with the attempt.

:class:`Conversations` is the :class:`~telegram_fence.runtime.attempt.AttemptExtension` of durable state. While an
attempt of this fence runs on a thread, every change the state storage or a handler backend makes goes into that
attempt's :class:`~.pending.Pending`: written inside each ``ctx.transaction()`` (so it commits with the handler's
own writes), and at the end of a clean attempt through ``ctx.transaction(complete=True)``, so it commits with the
settle; an attempt that raised, or lost its claim, leaves nothing. Outside an attempt (a script, a test, a handler
after its update was settled) a change is written at once in a transaction of its own. May import
``runtime.attempt``, the conversation's modules and the standard library (layer 3, conversation).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol, runtime_checkable

from ..runtime.attempt import AttemptContext, current_attempt
from .pending import ConnectionLoader, Entry, GroupKey, Pending, Row
from .values import StateKey, reads_of

__all__ = ["ConversationStore", "Conversations", "ReadableStore"]


@runtime_checkable
class ConversationStore(Protocol):
    """What conversations need of a store: write transactions on its own connections (both backends have them)."""

    def write(self, *, durable: bool = False) -> AbstractContextManager[Any]: ...


@runtime_checkable
class ReadableStore(ConversationStore, Protocol):
    """A store that also reads without a write transaction (``SqliteUpdateStore.read``): no write lock per read."""

    def read(self) -> AbstractContextManager[Any]: ...


class _StoreLoader:
    """Reads for an attempt, each through the store's ``read()`` where it has one (no write lock), else in a short
    ``write()`` transaction; either joins a transaction open on this thread."""

    def __init__(self, store: ConversationStore) -> None:
        self._open: Callable[[], AbstractContextManager[Any]] = (
            store.read if isinstance(store, ReadableStore) else store.write)

    def state(self, key: StateKey) -> Row | None:
        with self._open() as conn:
            return ConnectionLoader(conn).state(key)

    def read_ahead(self, pending: Pending, key: StateKey | None, chat: str, replied: str) -> None:
        """Read the state of ``key`` and the handlers of ``chat`` and ``replied`` in one statement into ``pending``."""
        with self._open() as conn:
            state, steps, replies = ConnectionLoader(conn).prefetch(key, (("next_step", chat), ("reply", replied)))
        groups: dict[GroupKey, list[Entry]] = {}
        if chat:
            groups[("next_step", chat)] = steps
        if replied:
            groups[("reply", replied)] = replies
        pending.known(key, state, groups)

    def entries(self, group: GroupKey) -> list[Entry]:
        with self._open() as conn:
            return ConnectionLoader(conn).entries(group)


class _Frame(threading.local):
    ctx: AttemptContext | None = None
    pending: Pending | None = None


class Conversations:
    """The conversations of one fence's store, fenced by its attempts.

    Safe to share between threads: each attempt's changes belong to its own thread; outside attempts each
    call is its own transaction.
    """

    def __init__(self, store: ConversationStore, bot_id: int | None = None) -> None:
        self._store = store
        self._bot_id = bot_id
        self._frame = _Frame()
        self._loader = _StoreLoader(store)
        self._read_ahead = True

    def dispatch_elsewhere(self) -> None:
        """The fence runs its own handler (``Fence.handler`` / ``attempt_handler``), not telebot's dispatch: nothing
        is read ahead at the start of an attempt (telebot would not look), and a handler that asks for a state
        or a step still reads it, on first use. Call before the fence starts."""
        self._read_ahead = False

    @property
    def store(self) -> ConversationStore:
        return self._store

    # --- the attempt extension -------------------------------------------------------------------

    def begin(self, ctx: AttemptContext) -> None:
        """An attempt starts on this thread: its changes are collected from now on. For a message or a callback
        query, what telebot will read (the sender's state, the chat's next-step handlers, the reply handlers of the
        message it answers) is read ahead in one statement, unless :meth:`dispatch_elsewhere` was called."""
        pending = Pending(self._loader, ctx.update_id)
        self._frame.ctx = ctx
        self._frame.pending = pending
        if not self._read_ahead:
            return
        reads = reads_of(ctx.raw, self._bot_id)
        if reads is not None:
            self._loader.read_ahead(pending, *reads)

    def before_commit(self, ctx: AttemptContext, conn: Any, complete: bool) -> None:
        """Write the attempt's changes inside its fenced transaction."""
        pending = self._pending_of(ctx)
        if pending is not None:
            pending.flush(conn)

    def after_commit(self, ctx: AttemptContext, complete: bool) -> None:
        """The fenced transaction committed: what it wrote is no longer pending."""
        pending = self._pending_of(ctx)
        if pending is not None:
            pending.committed()

    def end(self, ctx: AttemptContext, ok: bool) -> None:
        """A clean attempt with changes left commits them with its settle; a failed one drops them."""
        try:
            pending = self._pending_of(ctx)
            if ok and pending is not None and pending.dirty and not ctx.completed:
                with ctx.transaction(complete=True):
                    pass
        finally:
            if self._frame.ctx is ctx:
                self._frame.ctx = None
                self._frame.pending = None

    def _pending_of(self, ctx: AttemptContext) -> Pending | None:
        frame = self._frame
        return frame.pending if frame.ctx is ctx else None

    # --- what the storage and the backends use ---------------------------------------------------

    def attempt_pending(self) -> Pending | None:
        """The changes of the attempt running on this thread, or ``None`` outside one (or once it was settled)."""
        frame = self._frame
        ctx = frame.ctx
        if ctx is None or ctx is not current_attempt() or ctx.completed:
            return None
        return frame.pending

    @contextmanager
    def changing(self) -> Iterator[Pending]:
        """The changes an operation adds to: the running attempt's (committed with it), or outside an attempt a
        fresh set read and written in one transaction of its own, committed when the block ends."""
        pending = self.attempt_pending()
        if pending is not None:
            yield pending
            return
        with self._store.write() as conn:
            pending = Pending(ConnectionLoader(conn))
            yield pending
            pending.flush(conn)
        pending.committed()

    @contextmanager
    def reading(self) -> Iterator[Pending]:
        """What an operation reads: the running attempt's view, or outside one the database as it is now."""
        pending = self.attempt_pending()
        yield pending if pending is not None else Pending(self._loader)
