"""Which chats have no conversation stored: the per-round answer that spares their updates any read.

telebot asks for the chat's next-step handlers on every message (and the sender's state, the reply handlers). Once
per dispatcher round, after its claims committed, one statement asks which claimed chats (and replied-to messages)
have anything stored; an attempt asks :class:`QuietRounds` instead of the store. The answer is right for that
round's attempts: a change commits with (or before) the settle of its update, and the chat's next update is claimed
after that settle, so a read taken after the claim sees it. Changes committed in this process after the read void
the answer for what they touched (:meth:`QuietRounds.touched`); another process can change a held chat only from
outside its updates, concurrently with the update. May import the standard library. Safe to share (one lock).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

__all__ = ["LIMIT", "QuietRounds"]

#: Answers (and noted changes) kept at most of each kind; past it they are dropped, and the attempts concerned
#: read as before.
LIMIT = 4096


class _Answers:
    """Per key: the round that found it empty (and its claims left), and the round of its last noted change."""

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

    def answered(self, stamp: int, chats: dict[int, int], busy_chats: set[int], replies: dict[int, int],
                 busy_replies: set[int]) -> None:
        """Round ``stamp`` asked about ``chats`` and ``replies`` (with their claims) and found the ``busy_`` ones
        with something stored."""
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
        it since. Each claim the round announced takes the answer once."""
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
