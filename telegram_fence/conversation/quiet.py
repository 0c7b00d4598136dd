"""Which chats have no conversation stored: the per-round answer that spares their updates any read.

telebot's dispatch asks for the chat's next-step handlers on every message (and for the sender's state when a
``state=`` filter is registered, for the reply handlers when the message answers another). When the chat has no
conversation stored, each of those asks would be a read of the store. Instead, once per dispatcher round, after
the round's claims committed, one set-based statement asks which of the claimed chats (and replied-to messages)
have anything stored; :class:`QuietRounds` keeps the answer, and an attempt asks it instead of the store.

Why the answer is right for the attempts of that round: a conversation change commits with (or before) the settle
of the update that made it, and the next update of that chat is claimed only after that settle; a read taken after
the claim committed therefore sees every change committed before the claim, on every host (PostgreSQL reads each
statement at the latest commit). Each round's answer replaces the earlier one for every chat and message it asked
about (a failed read forgets them), so the answer an attempt finds was always taken after its own claim. What the
answer cannot see are changes committed after it was taken: those made in this process are noted
(:meth:`QuietRounds.touched`) and void it for the chats and messages they touched until a later round asks again,
so the next update of a chat run in the same round as the one that changed its conversation reads as before. A
change made meanwhile by another process to a chat whose update this process holds can only come from outside that
chat's own updates (a handler of another chat, a script): it is concurrent with the update, whichever it sees.

May import the standard library (layer 3, conversation). Safe to share between threads (one lock).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

__all__ = ["LIMIT", "QuietRounds"]

#: Answers (and noted changes) kept at most of each kind; past it they are dropped, and the attempts concerned
#: read as before.
LIMIT = 4096


class _Answers:
    """The stamp of the round whose read found each key empty (with how many of its claims may still use the
    answer), and of the last change noted for each key."""

    __slots__ = ("changed", "empty")

    def __init__(self) -> None:
        self.empty: dict[int, list[int]] = {}  # key -> [stamp of the round that found it empty, claims left]
        self.changed: dict[int, int] = {}  # key -> stamp of the round open when a change to it committed

    def answer(self, stamp: int, asked: dict[int, int], busy: set[int]) -> None:
        empty = self.empty
        if len(empty) > LIMIT:
            empty.clear()
        for key, claims in asked.items():
            if key in busy:
                empty.pop(key, None)
            else:
                empty[key] = [stamp, claims]

    def forget(self, asked: Iterable[int]) -> None:
        for key in asked:
            self.empty.pop(key, None)

    def is_empty(self, key: int, floor: int) -> bool:
        found = self.empty.get(key)
        return found is not None and found[0] >= floor and self.changed.get(key, -1) < found[0]


class QuietRounds:
    """The chats (no state of any user, no next-step handlers) and the messages (no reply handlers) the last round
    that asked about them found empty, each voided by a later change in this process. Safe to share between
    threads."""

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

    def answered(self, stamp: int, chats: dict[int, int], busy_chats: set[int], replies: dict[int, int],
                 busy_replies: set[int]) -> None:
        """The read of round ``stamp`` asked about ``chats`` and ``replies`` (each with the number of the round's
        claims it concerns) and found the ``busy_`` ones with something stored (the others empty)."""
        with self._lock:
            self._chats.answer(stamp, chats, busy_chats)
            self._replies.answer(stamp, replies, busy_replies)

    def failed(self, chats: Iterable[int], replies: Iterable[int]) -> None:
        """A round's read about ``chats`` and ``replies`` failed: no earlier answer counts for them any more."""
        with self._lock:
            self._chats.forget(chats)
            self._replies.forget(replies)

    def take_chat(self, chat: int) -> bool:
        """For an attempt of ``chat`` that begins: whether the round that claimed it found no state and no next-step
        handlers in ``chat``, and nothing in this process changed them since. Each claim the round announced takes
        the answer once; a claim no round announced finds none (and reads)."""
        answers = self._chats  # (inlined: asked once per update)
        with self._lock:
            found = answers.empty.get(chat)
            if found is None:
                return False
            found[1] -= 1
            if found[1] <= 0:
                del answers.empty[chat]
            return found[0] >= self._floor and answers.changed.get(chat, -1) < found[0]

    def reply_is_empty(self, message_id: int) -> bool:
        """Whether the last round that asked found no reply handlers waiting for ``message_id``, and nothing in this
        process registered any since (for an attempt whose round asked about it)."""
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
