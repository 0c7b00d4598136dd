"""The parts a dispatcher's rounds work with, shared by the dispatcher and the overlap it owns.

One job: :class:`RoundParts`, what a round reads and writes (the pool's state, the seat, the mailbox, the store's
capabilities, the lease, the exchanger) and whom it tells (its progress, its new claims), and :class:`FetchSignal`,
the poller's word that it is about to call ``getUpdates``. The pool makes one ``RoundParts``; the dispatcher hands it
to :class:`~telegram_fence.runtime.overlap.Overlap` with its ``FetchSignal``, so neither reaches into the other's
attributes. May import ``store`` (types), ``runtime.attempt``, ``runtime.capabilities``, ``runtime.decisions``,
``runtime.exchange``, ``runtime.mailbox``, ``runtime.seat``, ``runtime.state`` and the standard library.

Thread safety: a ``RoundParts`` is immutable, its parts thread-safe on their own (see each); :meth:`RoundParts.adopt`
runs on the dispatcher's thread (``on_claimed`` is told there). :meth:`FetchSignal.fetching` is called on the
poller's thread, the other methods on the dispatcher's: two events order them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from ..records import Record
from ..store import Claim
from . import decisions
from .attempt import AttemptContext
from .capabilities import StoreCapabilities
from .exchange import Exchanger
from .mailbox import Mailbox
from .seat import Seat
from .state import PoolState

__all__ = ["CarriedCounts", "FetchSignal", "RoundParts", "RoundReads"]


def _nobody(contexts: Sequence[AttemptContext]) -> None:
    """The default ``on_claimed``: nobody is told."""


class RoundReads(Protocol):
    """Who is told, instead of ``on_claimed``, the claims of a split round that also said which chats of its batch
    have a conversation stored (``conversation.extension.Conversations``)."""

    def open_round(self) -> int | None:
        """Before the round is sent: its stamp, or ``None`` (the round does not ask)."""
        ...

    def answered(self, contexts: Sequence[AttemptContext], stamp: int, conversing: frozenset[int]) -> None:
        """The round's new attempts and the chats it found conversing (must not raise)."""
        ...


class RoundParts(Record):
    """What a dispatcher round works with (see the module docstring).

    ``on_progress()`` is called after a round settled something; ``on_claimed(contexts)`` is told each round's new
    attempts on the dispatcher's thread, after their claims committed and before any of them begins (durable
    conversations ask the store once per round which of their chats have anything stored); it must not raise."""

    __slots__ = ("carried", "exchanger", "lease", "mailbox", "on_claimed", "on_progress", "reads", "seat", "state",
                 "store")
    state: PoolState
    seat: Seat
    mailbox: Mailbox
    store: StoreCapabilities
    lease: float
    exchanger: Exchanger
    on_progress: Callable[[], None]
    on_claimed: Callable[[Sequence[AttemptContext]], None]
    carried: CarriedCounts
    reads: RoundReads | None

    def __init__(self, state: PoolState, seat: Seat, mailbox: Mailbox, store: StoreCapabilities, lease: float,
                 exchanger: Exchanger, on_progress: Callable[[], None],
                 on_claimed: Callable[[Sequence[AttemptContext]], None] = _nobody,
                 carried: CarriedCounts | None = None, reads: RoundReads | None = None) -> None:
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "seat", seat)
        object.__setattr__(self, "mailbox", mailbox)
        object.__setattr__(self, "store", store)
        object.__setattr__(self, "lease", lease)
        object.__setattr__(self, "exchanger", exchanger)
        object.__setattr__(self, "on_progress", on_progress)
        object.__setattr__(self, "on_claimed", on_claimed)
        object.__setattr__(self, "carried", CarriedCounts() if carried is None else carried)
        object.__setattr__(self, "reads", reads)

    def adopt(self, claims: Sequence[Claim], read: tuple[int, frozenset[int] | None] | None = None
              ) -> list[AttemptContext]:
        """The attempts of ``claims`` (just committed), now the pool's: their leases renewed by the heartbeat,
        ``on_claimed`` told (when there are any), or ``reads`` with what their round read (``read``: its stamp and
        the chats it found conversing, when it asked). Runs on the dispatcher's thread. (Not the ``held`` claims of
        a split round, which are attempts the dispatcher has yet to run.)"""
        contexts = [AttemptContext(self.store.store, claim) for claim in claims]
        if contexts:
            self.state.leases.add(contexts)
            if read is not None and read[1] is not None and self.reads is not None:
                self.reads.answered(contexts, read[0], read[1])
            else:
                self.on_claimed(contexts)
        return contexts


class CarriedCounts:
    """The backlog and the cursor a committed round counted for the poller (a split round's answer carries them: see
    :class:`~telegram_fence.store.RoundOutcome`), so that its next ``getUpdates`` needs no store read of its own.

    Each offer serves one fetch: :meth:`backlog` takes the carried backlog once (a second call, the poller waiting
    for room, answers ``None``: read the store, time has passed), and :meth:`cursor` answers the carried cursor only
    right after :meth:`backlog` took the backlog of the same offer (else ``None``: read the store). A new offer
    replaces what was not taken. A carried value is what the store held as the round committed: until the poller
    fetches, the backlog changes only as a store read's would between that read and the fetch (nothing else records
    while the poller waits for its batch to be recorded; settles lower it, retries falling due raise it), and the
    cursor only grows, so a carried one confirms nothing the store does not hold. Thread-safe: offered on the
    dispatcher's thread, taken on the poller's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backlog: int | None = None
        self._offered_cursor: int | None = None  # the cursor of the offer whose backlog was not taken yet
        self._armed_cursor: int | None = None  # the cursor of the offer whose backlog was just taken

    def offer(self, backlog: int | None, cursor: int | None) -> None:
        """A round that recorded the poller's batch committed with these counts (``None``: not counted); call it
        before the poller's request is answered."""
        with self._lock:
            self._backlog = backlog
            self._offered_cursor = cursor if backlog is not None else None
            self._armed_cursor = None

    def backlog(self) -> int | None:
        """The carried backlog, once (``None``: none carried, or taken already)."""
        with self._lock:
            backlog, self._backlog = self._backlog, None
            self._armed_cursor, self._offered_cursor = self._offered_cursor if backlog is not None else None, None
            return backlog

    def cursor(self) -> int | None:
        """The carried cursor of the offer whose backlog :meth:`backlog` took last, once (``None``: read the
        store)."""
        with self._lock:
            cursor, self._armed_cursor = self._armed_cursor, None
            return cursor


class FetchSignal:
    """Whether the poller is about to call ``getUpdates`` (owned by the dispatcher, told by the poller)."""

    def __init__(self) -> None:
        self._started = threading.Event()  # the poller is about to call getUpdates (set on its thread)
        self._polling = threading.Event()  # a poller ever said it fetches (the webhook door has none to wait for)

    def fetching(self) -> None:
        """The poller is about to call ``getUpdates`` (called on the poller's thread)."""
        self._polling.set()
        self._started.set()

    @property
    def polling(self) -> bool:
        """Whether a poller ever said it fetches (``False`` with the webhook door: its batches come from the intake)."""
        return self._polling.is_set()

    def pending(self) -> bool:
        """Whether the poller said it fetches since the last :meth:`sent`."""
        return self._started.is_set()

    def sent(self) -> None:
        """A round with the poller's batch was sent: its next fetch is awaited from now on."""
        self._started.clear()

    def wait(self) -> None:
        """Before running a batch's handlers on the dispatcher's thread, let the poller send its next ``getUpdates``.

        The handlers hold the interpreter lock for milliseconds; a poller woken by the commit would wait for them
        before it could even send the request. Sent first, Telegram's answer is on its way while they run. Waits at
        most ``FETCH_WAIT`` (the poller may have no room), and not at all when no poller runs."""
        if self._polling.is_set():
            self._started.wait(decisions.FETCH_WAIT)
