"""The parts a dispatcher's rounds work with.

One job: :class:`RoundParts`, what a round reads and writes (the pool's state, the seat, the mailbox, the store's
capabilities, the lease, the exchanger) and whom it tells (its progress, its new claims), and :class:`FetchSignal`,
the poller's word that it is about to call ``getUpdates``. The pool makes one ``RoundParts`` and hands it to the
dispatcher. May import ``store`` (types), ``runtime.attempt``, ``runtime.capabilities``, ``runtime.decisions``,
``runtime.exchange``, ``runtime.mailbox``, ``runtime.seat``, ``runtime.state`` and the standard library.

Thread safety: a ``RoundParts`` is immutable, its parts thread-safe on their own (see each); :meth:`RoundParts.adopt`
runs on the dispatcher's thread (``on_claimed`` is told there). :meth:`FetchSignal.fetching` is called on the
poller's thread, the other methods on the dispatcher's: two events order them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ..records import Record
from ..store import Claim
from . import decisions
from .attempt import AttemptContext
from .capabilities import StoreCapabilities
from .exchange import Exchanger
from .mailbox import Mailbox
from .seat import Seat
from .state import PoolState

__all__ = ["FetchSignal", "RoundParts"]


def _nobody(contexts: Sequence[AttemptContext]) -> None:
    """The default ``on_claimed``: nobody is told."""


class RoundParts(Record):
    """What a dispatcher round works with (see the module docstring).

    ``on_progress()`` is called after a round settled something; ``on_claimed(contexts)`` is told each round's new
    attempts on the dispatcher's thread, after their claims committed and before any of them begins (durable
    conversations ask the store once per round which of their chats have anything stored); it must not raise."""

    __slots__ = ("exchanger", "lease", "mailbox", "on_claimed", "on_progress", "seat", "state", "store")
    state: PoolState
    seat: Seat
    mailbox: Mailbox
    store: StoreCapabilities
    lease: float
    exchanger: Exchanger
    on_progress: Callable[[], None]
    on_claimed: Callable[[Sequence[AttemptContext]], None]

    def __init__(self, state: PoolState, seat: Seat, mailbox: Mailbox, store: StoreCapabilities, lease: float,
                 exchanger: Exchanger, on_progress: Callable[[], None],
                 on_claimed: Callable[[Sequence[AttemptContext]], None] = _nobody) -> None:
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "seat", seat)
        object.__setattr__(self, "mailbox", mailbox)
        object.__setattr__(self, "store", store)
        object.__setattr__(self, "lease", lease)
        object.__setattr__(self, "exchanger", exchanger)
        object.__setattr__(self, "on_progress", on_progress)
        object.__setattr__(self, "on_claimed", on_claimed)

    def adopt(self, claims: Sequence[Claim]) -> list[AttemptContext]:
        """The attempts of ``claims`` (just committed), now the pool's: their leases renewed by the heartbeat,
        ``on_claimed`` told (when there are any). Runs on the dispatcher's thread."""
        contexts = [AttemptContext(self.store.store, claim) for claim in claims]
        if contexts:
            self.state.leases.add(contexts)
            self.on_claimed(contexts)
        return contexts


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
