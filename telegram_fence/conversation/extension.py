"""Which conversation changes belong to which attempt: the attempt extension that commits them with the attempt,
and which claimed chats have no conversation stored.

An attempt's changes go into its :class:`~.sql.Pending`, written inside each ``ctx.transaction()`` and at the
end of a clean attempt with its settle; an attempt that raised or lost its claim leaves nothing. Outside an attempt
a change is written at once. telebot asks for the chat's next-step handlers on every message (and the sender's
state, the reply handlers): once per dispatcher round, after its claims committed, one statement asks which claimed
chats (and replied-to messages) have anything stored, and an attempt of an empty one reads nothing
(:class:`QuietRounds`); otherwise what telebot will read is read ahead in one statement at its start.

Why the round's answer is right: docs/states.md, "Cost". May import ``runtime.attempt``, ``calls.journal`` (its
store types), the conversation's modules and the standard library (layer 3, conversation).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from ..calls.journal import JournalStore, reader
from ..runtime.attempt import AttemptContext, current_attempt
from .sql import NEXT_STEP, Loader, Pending
from .values import reads_of, replied_to

__all__ = ["LIMIT", "Conversations", "QuietRounds"]

log = logging.getLogger("telegram_fence.conversation.extension")


#: Answers (and noted changes) kept at most of each kind; past it they are dropped, and the attempts concerned
#: read as before.
LIMIT = 4096


class _Answers:
    """Per key: the round that found it empty, and the round of its last noted change."""

    __slots__ = ("changed", "empty")

    def __init__(self) -> None:
        self.empty: dict[int, int] = {}  # key -> stamp of the round that found it empty
        self.changed: dict[int, int] = {}  # key -> stamp of the round open when a change to it committed

    def answer(self, stamp: int, asked: Iterable[int], busy: set[int]) -> None:
        empty = self.empty
        if len(empty) > LIMIT:
            empty.clear()
        for key in asked:
            if key in busy:
                empty.pop(key, None)
            else:
                empty[key] = stamp

    def forget(self, asked: Iterable[int]) -> None:
        for key in asked:
            self.empty.pop(key, None)

    def is_empty(self, key: int, floor: int) -> bool:
        found = self.empty.get(key)
        return found is not None and found >= floor and self.changed.get(key, -1) < found


class QuietRounds:
    """The chats and messages the last round that asked found empty, each voided by a later change in this
    process. Safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamp = 0  # rounds opened so far; a change is stamped with the round open when it committed
        self._floor = 0  # answers of rounds below this are void (the noted changes were dropped)
        self._chats = _Answers()
        self._replies = _Answers()

    def open_round(self) -> int:
        """A round's read is about to be taken: its stamp. Changes noted from now on void its answers."""
        with self._lock:
            self._stamp += 1
            return self._stamp

    def answered(self, stamp: int, chats: set[int], busy_chats: set[int], replies: set[int],
                 busy_replies: set[int]) -> None:
        """Round ``stamp`` asked about ``chats`` and ``replies`` and found the ``busy_`` ones with something
        stored."""
        with self._lock:
            self._chats.answer(stamp, chats, busy_chats)
            self._replies.answer(stamp, replies, busy_replies)

    def failed(self, chats: Iterable[int], replies: Iterable[int]) -> None:
        """A round's read about ``chats`` and ``replies`` failed: no earlier answer counts for them any more."""
        with self._lock:
            self._chats.forget(chats)
            self._replies.forget(replies)

    def take_chat(self, chat: int) -> bool:
        """For an attempt of ``chat`` that begins: whether its round found ``chat`` empty and nothing here changed
        it since. The round's one claim of the chat takes the answer."""
        answers = self._chats  # (inlined: asked once per update)
        with self._lock:
            found = answers.empty.pop(chat, None)
            return found is not None and found >= self._floor and answers.changed.get(chat, -1) < found

    def reply_is_empty(self, message_id: int) -> bool:
        """Whether the last round that asked found no reply handlers for ``message_id``, none registered here since."""
        with self._lock:
            return self._replies.is_empty(message_id, self._floor)

    def touched(self, chats: Iterable[int], replies: Iterable[int]) -> None:
        """Changes to the conversations of ``chats`` and to the reply handlers of ``replies`` committed just now."""
        with self._lock:
            stamp = self._stamp
            changed_chats, changed_replies = self._chats.changed, self._replies.changed
            for chat in chats:
                changed_chats[chat] = stamp
            for reply in replies:
                changed_replies[reply] = stamp
            if len(changed_chats) + len(changed_replies) > LIMIT:
                self._floor = stamp + 1  # every answer so far may be concerned: void them all
                changed_chats.clear()
                changed_replies.clear()


class _Frame(threading.local):
    ctx: AttemptContext | None = None
    pending: Pending | None = None  # made on first use (an attempt that finds nothing may never need one)
    empty_chat: int | None = None  # the running attempt's chat, when it has no conversation stored


class Conversations:
    """The conversations of one fence's store, fenced by its attempts. Safe to share between threads."""

    def __init__(self, store: JournalStore, bot_id: int | None = None) -> None:
        self._store = store
        self._bot_id = bot_id
        self._frame = _Frame()
        self._loader = Loader(reader(store))
        self._read_ahead = True
        self._quiet = QuietRounds()
        self._warned = False

    def dispatch_elsewhere(self) -> None:
        """The fence runs its own handler, not telebot's dispatch: nothing is read ahead (a handler reads on first
        use). Call before the fence starts."""
        self._read_ahead = False

    # --- the dispatcher's round ------------------------------------------------------------------

    def claimed(self, contexts: Sequence[AttemptContext]) -> None:
        """The dispatcher claimed ``contexts`` (after the claims committed, before any begins): one statement asks
        which of their chats and replied-to messages have anything stored (see :class:`QuietRounds`). Never raises: when
        it fails, every attempt reads at its start (said once at WARNING)."""
        if not self._read_ahead or not contexts:
            return
        chats: set[int] = set()  # a round claims at most one update of a chat
        replies: set[int] = set()
        for ctx in contexts:
            chat = ctx.chat_id  # the update's ordering line: no other update of it runs before this one settles
            if chat is not None:
                chats.add(chat)
                replied = replied_to(ctx.raw)
                if replied is not None:
                    replies.add(replied)
        if not chats:
            return
        quiet = self._quiet
        stamp = quiet.open_round()
        try:
            busy_chats, busy_replies = self._loader.busy(chats, replies)
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
