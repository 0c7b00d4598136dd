"""The store contract: the one protocol the fence's runtime calls (:class:`UpdateStore`) and its value types.

An attempt is named by :class:`Identity` ``(update_id, attempt, claim_id)``: every method that acts on a claim
compares all three, so neither a later attempt nor a pruned-and-recorded-again ``update_id`` acts on an old claim.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["Claim", "Exhaustion", "Identity", "PollLeadership", "RecordHook", "UpdateStore", "missing_methods"]


@dataclass(frozen=True, slots=True)
class Identity:
    """The full identity of one attempt (``claim_id`` is opaque, fresh for every claim); also the idempotency key of
    its exhaustion."""

    update_id: int
    attempt: int
    claim_id: str

    def __str__(self) -> str:
        return f"{self.update_id}/{self.attempt}/{self.claim_id}"


@dataclass(frozen=True, slots=True)
class Claim:
    """A claimed update: who holds it (``identity``), what it is (``update``), until when."""

    identity: Identity
    update: Mapping[str, Any] = field(repr=False)
    chat_id: int | None
    lease_until: float

    @property
    def update_id(self) -> int:
        return self.identity.update_id

    @property
    def attempt(self) -> int:
        return self.identity.attempt


@dataclass(frozen=True, slots=True)
class Exhaustion:
    """A terminal failure waiting to be acknowledged: the update, its last attempt, and the error."""

    identity: Identity
    update: Mapping[str, Any] = field(repr=False)
    chat_id: int | None
    error: str
    exhausted_at: float


#: A hook run inside the inbox transaction with the updates it stores for the first time.
RecordHook = Callable[[Any, Sequence[Mapping[str, Any]]], None]


@runtime_checkable
class UpdateStore(Protocol):
    """What the fence's runtime calls on its store. Every method is atomic and may be called from any thread; store
    errors are :class:`~telegram_fence.errors.StoreError` subclasses, an argument out of range is
    :class:`~telegram_fence.errors.ConfigurationError`; nothing is written then.
    """

    #: The store's clock (seconds); leases and ``due`` times are on it.
    clock: Callable[[], float]

    def record(
        self,
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        *,
        skip: Collection[int] = (),
        generation: int | None = None,
        on_record: RecordHook | None = None,
        body: bytes | str | None = None,
    ) -> int:
        """Store a batch and raise the cursor to ``next_offset`` (never lower it) in one transaction; return how many
        updates were new. ``skip``: ids stored as skipped. ``on_record(conn, new)`` runs with the new updates; if it
        raises, nothing is stored. ``body``: the raw answer ``updates`` were decoded from. Raises
        :class:`~telegram_fence.errors.InvalidUpdate` for a malformed item (nothing stored)."""
        ...

    def next_offset(self) -> int:
        """The stored cursor: the ``offset`` for the next ``getUpdates`` (0 when nothing was recorded)."""
        ...

    def exchange(
        self,
        settle: Iterable[Identity],
        lease: float,
        limit: int,
        *,
        max_attempts: int | None = None,
        known: Mapping[int, Mapping[str, Any]] | None = None,
        chats: Collection[int] | None = None,
        chatless: Collection[int] = (),
    ) -> tuple[int, list[Claim], bool]:
        """Settle ``settle`` and claim up to ``limit`` (0: settle only) in one transaction: the oldest due updates
        whose chat has no live claim and no older open update, each with a fresh ``claim_id``, for ``lease`` seconds;
        an update whose attempts are spent becomes an exhaustion instead. Returns ``(settled, claims, more)``.
        ``known``: update dicts the caller holds. ``chats``/``chatless``: only those chats' next updates (and those
        chatless ones) are candidates."""
        ...

    def renew_many(self, identities: Iterable[Identity], lease: float) -> set[Identity]:
        """Renew the live claims among ``identities``; return exactly those (matched on all three fields)."""
        ...

    def owns(self, identity: Identity, at: float | None = None) -> bool:
        """``True`` only for exactly this claim, still live at ``at`` (default now)."""
        ...

    def settle_many(self, identities: Iterable[Identity]) -> int:
        """Settle the live claims among ``identities``; return how many (0 for none)."""
        ...

    def retry_owned(self, identity: Identity, at: float, error: str) -> bool:
        """Put exactly this live claim back to pending, due at ``at`` (a finite time), keeping ``error``; its chat
        waits for it. ``False`` when it is not live."""
        ...

    def release(self, identity: Identity, *, attempt_counts: bool = True) -> bool:
        """End exactly this live claim now; ``False`` when it is not live. ``attempt_counts=True``: the lease
        expires now and the attempt counts; ``False``: the row goes back to pending and the attempt is given back."""
        ...

    def transaction(self, identity: Identity, complete: bool = False) -> AbstractContextManager[Any]:
        """A write transaction that commits only while ``identity`` owns its update, else raises
        :class:`~telegram_fence.errors.OwnershipLost` (rolled back); ``complete=True`` settles the update in it."""
        ...

    def release_dead_claims(self) -> dict[str, int]:
        """End now every live claim of a gone process of this host (its attempt counts); return the count per
        owner."""
        ...

    def exhaust(self, identity: Identity, error: str) -> bool:
        """Turn exactly this live claim into an unacknowledged exhaustion; ``False`` when not live."""
        ...

    def due_exhaustions(self, after: Identity | None = None, limit: int = 100) -> list[Exhaustion]:
        """Unacknowledged exhaustions in ``update_id`` order, strictly after ``after``."""
        ...

    def acknowledge_exhaustion(self, identity: Identity) -> bool:
        """Make the exhaustion with exactly this identity prunable; ``False`` when there is none."""
        ...

    def add_exhaustion_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` after each commit that made an exhaustion the store found itself; return a function
        that removes it."""
        ...

    def write(self, *, durable: bool = False) -> AbstractContextManager[Any]:
        """A write transaction for the application's own tables (store calls on the same thread join it);
        ``durable=True`` commits at the inbox's durability."""
        ...

    def begin_generation(self, pid: int | None = None, *, door: str = "poll") -> int:
        """Start a new generation of ``door`` (``"poll"`` or ``"webhook"``); return its number (never reused)."""
        ...

    def mark_progress(self, generation: int) -> None:
        """Record that ``generation``'s door took in updates now."""
        ...

    def end_generation(self, generation: int, reason: str) -> None:
        """Record why ``generation`` ended (once; later calls keep the first reason)."""
        ...

    def stats(self) -> Mapping[str, Any]:
        """Counts by state, the cursor, the oldest open update's age, the latest generation."""
        ...

    def prune(self, settled_before: float) -> int:
        """Delete finished rows older than ``settled_before``; return how many were deleted. Never deletes a row
        Telegram may still deliver again (see :data:`~telegram_fence.updates.REDELIVERY_WINDOW`)."""
        ...

    def close(self) -> None:
        """Release the store's resources; later calls raise :class:`~telegram_fence.errors.StoreUnavailable`."""
        ...


def missing_methods(store: object) -> list[str]:
    """The names of :class:`UpdateStore`'s members that ``store`` lacks, in the protocol's order."""
    names = [*UpdateStore.__annotations__, *(n for n, v in vars(UpdateStore).items() if callable(v) and n[0] != "_")]
    return [name for name in names if not callable(getattr(store, name, None))]


class PollLeadership(Protocol):
    """Who may poll when several processes share one database: ``acquire(timeout)`` waits to lead (``True`` when it
    does), ``held`` tells whether this process leads, ``release()`` steps down, ``epoch`` names the leadership held,
    ``last_error`` says why the last attempt failed."""

    last_error: str | None

    @property
    def held(self) -> bool: ...

    @property
    def epoch(self) -> int | None: ...

    def acquire(self, timeout: float) -> bool: ...

    def release(self) -> None: ...
