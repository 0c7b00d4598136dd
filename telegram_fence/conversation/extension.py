"""Which conversation changes belong to which attempt: the attempt extension that commits them with the attempt.

An attempt's changes go into its :class:`~.pending.Pending`, written inside each ``ctx.transaction()`` and at the
end of a clean attempt with its settle; an attempt that raised or lost its claim leaves nothing. Outside an attempt
a change is written at once. An attempt whose round found nothing stored for its chat (:mod:`.quiet`) reads
nothing; otherwise what telebot will read is read ahead in one statement at its start. May import
``runtime.attempt``, the conversation's modules and the standard library (layer 3, conversation).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol, runtime_checkable

from ..runtime.attempt import AttemptContext, current_attempt
from .pending import NEXT_STEP, Loader, Pending
from .quiet import QuietRounds
from .values import reads_of, replied_to

__all__ = ["ConversationStore", "Conversations", "ReadableStore"]

log = logging.getLogger("telegram_fence.conversation.extension")


@runtime_checkable
class ConversationStore(Protocol):
    """What conversations need of a store: write transactions on its own connections (both backends have them)."""

    def write(self, *, durable: bool = False) -> AbstractContextManager[Any]: ...


@runtime_checkable
class ReadableStore(ConversationStore, Protocol):
    """A store that also reads without a write transaction (``SqliteUpdateStore.read``): no write lock per read."""

    def read(self) -> AbstractContextManager[Any]: ...


class _Frame(threading.local):
    ctx: AttemptContext | None = None
    pending: Pending | None = None  # made on first use (an attempt that finds nothing may never need one)
    empty_chat: int | None = None  # the running attempt's chat, when it has no conversation stored


class Conversations:
    """The conversations of one fence's store, fenced by its attempts. Safe to share between threads."""

    def __init__(self, store: ConversationStore, bot_id: int | None = None) -> None:
        self._store = store
        self._bot_id = bot_id
        self._frame = _Frame()
        self._loader = Loader(store.read if isinstance(store, ReadableStore) else store.write)
        self._read_ahead = True
        self._quiet = QuietRounds()
        self._warned = False

    def dispatch_elsewhere(self) -> None:
        """The fence runs its own handler, not telebot's dispatch: nothing is read ahead (a handler reads on first
        use). Call before the fence starts."""
        self._read_ahead = False

    @property
    def store(self) -> ConversationStore:
        return self._store

    # --- the dispatcher's round ------------------------------------------------------------------

    def claimed(self, contexts: Sequence[AttemptContext]) -> None:
        """The dispatcher claimed ``contexts`` (after the claims committed, before any begins): one statement asks
        which of their chats and replied-to messages have anything stored (see :mod:`.quiet`). Never raises: when
        it fails, every attempt reads at its start (said once at WARNING)."""
        if not self._read_ahead or not contexts:
            return
        chats: dict[int, int] = {}  # chat -> how many of the round's claims are of it
        replies: dict[int, int] = {}
        for ctx in contexts:
            chat = ctx.chat_id  # the update's ordering line: no other update of it runs before this one settles
            if chat is not None:
                chats[chat] = chats.get(chat, 0) + 1
                replied = replied_to(ctx.raw)
                if replied is not None:
                    replies[replied] = replies.get(replied, 0) + 1
        if not chats:
            return
        quiet = self._quiet
        stamp = quiet.open_round()
        try:
            busy_chats, busy_replies = self._loader.busy(chats.keys(), replies.keys())
            quiet.answered(stamp, chats, busy_chats, replies, busy_replies)
        except Exception:  # the dispatcher must go on: its attempts read at their start instead
            quiet.failed(chats, replies)
            if not self._warned:
                self._warned = True
                log.warning("could not ask which claimed chats have a conversation stored; each update reads its "
                            "own at its start", exc_info=True)

    # --- the attempt extension -------------------------------------------------------------------

    def begin(self, ctx: AttemptContext) -> None:
        """An attempt starts on this thread: unless its round found its chat empty, what telebot will read for a
        message or a callback query is read ahead in one statement."""
        frame = self._frame
        frame.ctx = ctx
        frame.pending = None
        chat = ctx.chat_id
        if not self._read_ahead:
            frame.empty_chat = None
            return
        if chat is not None and self._quiet.take_chat(chat):
            frame.empty_chat = chat
            return
        frame.empty_chat = None
        reads = reads_of(ctx.raw, self._bot_id)
        if reads is not None:
            pending = frame.pending = Pending(self._loader, ctx.update_id)
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
            self._committed(pending)

    def end(self, ctx: AttemptContext, ok: bool) -> None:
        """A clean attempt with changes left commits them with its settle; a failed one drops them."""
        frame = self._frame
        if frame.ctx is not ctx:
            return
        pending = frame.pending
        try:
            if ok and pending is not None and pending.dirty and not ctx.completed:
                with ctx.transaction(complete=True):
                    pass
        finally:
            frame.ctx = None
            frame.pending = None
            frame.empty_chat = None

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
        pending = frame.pending
        if pending is None:
            pending = frame.pending = Pending(self._loader, ctx.update_id, frame.empty_chat)
        return pending

    def knows_empty(self, kind: str, group: Any) -> bool:
        """Whether the running attempt knows, without a read, that handler group ``group`` (its own chat for
        ``"next_step"``, the message its update replies to for ``"reply"``) is empty. ``False`` whenever in doubt."""
        frame = self._frame
        empty_chat = frame.empty_chat  # set only for an attempt its round announced, of a chat found empty
        if empty_chat is None or frame.pending is not None or type(group) is not int:
            return False
        ctx = frame.ctx
        if ctx is None or ctx.completed or ctx is not current_attempt():
            return False
        if kind == NEXT_STEP:
            return group == empty_chat
        # only the message this update replies to was asked about in the round that claimed it
        return group == replied_to(ctx.raw) and self._quiet.reply_is_empty(group)

    def knows_no_state(self, chat_id: Any) -> bool:
        """Whether the running attempt knows, without a read, that chat ``chat_id`` has no state of any user."""
        frame = self._frame
        if frame.pending is not None or type(chat_id) is not int or chat_id != frame.empty_chat:
            return False
        ctx = frame.ctx
        return ctx is not None and not ctx.completed and ctx is current_attempt()

    @contextmanager
    def changing(self) -> Iterator[Pending]:
        """The changes an operation adds to: the running attempt's, or outside one a fresh set committed in a
        transaction of its own when the block ends."""
        pending = self.attempt_pending()
        if pending is not None:
            yield pending
            return
        with self._store.write() as conn:
            pending = Pending(Loader(lambda: nullcontext(conn)))
            yield pending
            pending.flush(conn)
        self._committed(pending)

    def _committed(self, pending: Pending) -> None:
        """``pending``'s changes committed: the chats they concern no longer count as empty."""
        if pending.dirty:
            self._quiet.touched(*pending.touched())
        pending.committed()

    @contextmanager
    def reading(self) -> Iterator[Pending]:
        """What an operation reads: the running attempt's view, or outside one the database as it is now."""
        pending = self.attempt_pending()
        yield pending if pending is not None else Pending(self._loader)
