"""The store contract itself: the protocols of its three levels and the optional ones, and its value types.

Lives apart from the package ``__init__`` (which only re-exports it and names the backends) so that a
backend imports the contract without importing the package that imports the backends.

=====================  ==============================================================================
``UpdateStore``        ``record``, ``next_offset``, ``claim``, ``renew``, ``settle``, ``prune``
``FencedUpdateStore``  + ``claim_owned``, ``renew_owned``, ``owns``, ``settle_owned``, ``retry_owned``,
                       ``transaction``
``DurableUpdateStore`` + ``exhaust``, ``due_exhaustions``, ``acknowledge_exhaustion``
=====================  ==============================================================================

Two optional protocols sit beside them; the runtime uses each of their methods when the store has
it and falls back to the levels above when it does not (see each protocol for the fallback):

========================  ===========================================================================
``BatchedUpdateStore``    fast paths: ``record(..., skip=, generation=, on_record=, body=)``,
                          ``record_and_claim``, ``claim_many``, ``exchange``, ``settle_many``,
                          ``renew_many``, ``release``, ``write`` (with ``nests_writes``, ``accepts_body``)
``MonitoredUpdateStore``  ``clock``, ``backlog``, poller generations, ``stats``, ``close``
========================  ===========================================================================

An attempt is named by :class:`Identity` ``(update_id, attempt, claim_id)``. Every fenced method
compares all three, so neither a later attempt of the same update nor a pruned-and-recorded-again
``update_id`` can act on an old claim. The base level names an attempt by :class:`Step`
``(update_id, attempt)`` only, which is why it cannot fence against ``update_id`` reuse.

Another backend implements these protocols and proves it with
:mod:`telegram_fence.testing.conformance`: the fenced (or durable) contract first, the optional
protocols later, one method at a time if need be.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "BatchedUpdateStore",
    "Claim",
    "DurableUpdateStore",
    "Exhaustion",
    "FencedUpdateStore",
    "Identity",
    "MonitoredUpdateStore",
    "PollLeadership",
    "RecordHook",
    "Step",
    "UpdateStore",
    "is_batched",
    "is_durable",
    "is_fenced",
    "is_monitored",
]


@dataclass(frozen=True, slots=True)
class Step:
    """An attempt as the base level knows it: which update, which try (1 for the first)."""

    update_id: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Identity:
    """The full identity of one attempt; also the idempotency key of its exhaustion.

    ``claim_id`` is opaque and fresh for every claim: persist all three fields, derive nothing.
    """

    update_id: int
    attempt: int
    claim_id: str

    @property
    def step(self) -> Step:
        """The base-level name of this attempt."""
        return Step(self.update_id, self.attempt)

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
        """The claimed update's id (``identity.update_id``)."""
        return self.identity.update_id

    @property
    def attempt(self) -> int:
        """The claimed attempt's number (``identity.attempt``)."""
        return self.identity.attempt

    @property
    def step(self) -> Step:
        """The base-level name of the claimed attempt (``identity.step``)."""
        return self.identity.step


@dataclass(frozen=True, slots=True)
class Exhaustion:
    """A terminal failure waiting to be acknowledged: the update, its last attempt, and the error."""

    identity: Identity
    update: Mapping[str, Any] = field(repr=False)
    chat_id: int | None
    error: str
    exhausted_at: float


@runtime_checkable
class UpdateStore(Protocol):
    """The base contract: an inbox with a cursor and unfenced claims.

    Implementations say in their docstring which objects may be shared between threads.
    """

    def record(self, updates: Sequence[Mapping[str, Any]], next_offset: int) -> int:
        """Store a batch and raise the cursor in one atomic step; return how many updates were new."""
        ...

    def next_offset(self) -> int:
        """The stored cursor: the ``offset`` for the next ``getUpdates`` (0 when nothing was recorded)."""
        ...

    def claim(self, lease: float) -> Claim | None:
        """Claim the oldest due update for ``lease`` seconds, or return ``None`` when none is due."""
        ...

    def renew(self, step: Step, lease: float) -> bool:
        """Extend the live claim ``step`` to at least now + ``lease``; ``False`` when it is not live."""
        ...

    def settle(self, step: Step) -> bool:
        """Mark the live claim ``step`` handled; ``False`` when it is not live."""
        ...

    def prune(self, settled_before: float) -> int:
        """Delete finished rows older than ``settled_before``; return how many were deleted.

        Never deletes a row Telegram may still deliver again: one whose ``update_id`` the cursor has not
        passed (the webhook records without moving it) recorded less than
        :data:`~telegram_fence.updates.REDELIVERY_WINDOW` ago."""
        ...


@runtime_checkable
class FencedUpdateStore(UpdateStore, Protocol):
    """Adds claims with a persisted ``claim_id`` and the database as the judge of write authority."""

    def claim_owned(self, lease: float, *, max_attempts: int | None = None) -> Claim | None:
        """Claim the oldest due update with a fresh ``claim_id``; ``None`` when none is due."""
        ...

    def renew_owned(self, identity: Identity, lease: float) -> bool:
        """Extend exactly this live claim (never shorten it); ``False`` when it is not live."""
        ...

    def owns(self, identity: Identity, at: float | None = None) -> bool:
        """``True`` only for exactly this claim, still live at ``at`` (default now)."""
        ...

    def settle_owned(self, identity: Identity) -> bool:
        """Mark exactly this live claim handled; ``False`` when it is not live."""
        ...

    def retry_owned(self, identity: Identity, at: float, error: str) -> bool:
        """Put exactly this live claim back to pending, due at ``at``, keeping ``error``. ``at`` must be a finite time
        (:class:`~telegram_fence.errors.ConfigurationError` otherwise, nothing written)."""
        ...

    def transaction(self, identity: Identity, complete: bool = False) -> AbstractContextManager[Any]:
        """A write transaction that commits only while ``identity`` owns its update.

        Raises :class:`~telegram_fence.errors.OwnershipLost` (after rolling back) when it does not.
        With ``complete=True`` the update is settled in the same transaction.
        """
        ...


@runtime_checkable
class DurableUpdateStore(FencedUpdateStore, Protocol):
    """Adds terminal failures that survive restarts until acknowledged with their full identity."""

    def exhaust(self, identity: Identity, error: str) -> bool:
        """Turn exactly this live claim into an unacknowledged exhaustion; ``False`` when not live."""
        ...

    def due_exhaustions(self, after: Identity | None = None, limit: int = 100) -> list[Exhaustion]:
        """Unacknowledged exhaustions in ``update_id`` order, strictly after ``after``."""
        ...

    def acknowledge_exhaustion(self, identity: Identity) -> bool:
        """Make the exhaustion with exactly this identity prunable; ``False`` when there is none."""
        ...


#: A hook run inside the inbox transaction with the updates it stores for the first time.
RecordHook = Callable[[Any, Sequence[Mapping[str, Any]]], None]


@runtime_checkable
class BatchedUpdateStore(FencedUpdateStore, Protocol):
    """Optional fast paths: fewer transactions per update. Each is a shortcut for calls of the fenced level.

    The runtime checks for each method by name and uses it when present; without it, it makes the
    fenced calls named in the method's docstring instead (slower, same outcome). All methods are
    atomic: one transaction each, all of it or nothing. Store errors are raised as
    :class:`~telegram_fence.errors.StoreUnavailable` (lock held too long, store closed) and
    :class:`~telegram_fence.errors.ConfigurationError` (an argument out of range); nothing is
    written then.
    """

    #: ``True`` when the store calls made inside :meth:`write` on the same thread join its
    #: transaction (as savepoints). The dispatcher then records, settles and claims in one commit.
    nests_writes: bool
    #: ``True`` when :meth:`record` and :meth:`record_and_claim` take ``body=``.
    accepts_body: bool

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
        """:meth:`UpdateStore.record` with the poller's extras, all in the same transaction.

        ``skip``: ids stored as skipped (never claimed, never passed to ``on_record``).
        ``generation``: that poller generation's progress is marked. ``on_record(conn, new)``: runs
        with the updates stored for the first time; if it raises, nothing is stored and it propagates.
        ``body``: the raw ``getUpdates`` answer ``updates`` were decoded from (only when
        ``accepts_body``). Raises :class:`~telegram_fence.errors.InvalidUpdate` for a malformed
        item (nothing stored). The poller passes an extra only when it needs it.
        """
        ...

    def record_and_claim(
        self,
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        *,
        lease: float,
        limit: int,
        run: int = 1,
        skip: Collection[int] = (),
        generation: int | None = None,
        on_record: RecordHook | None = None,
        body: bytes | str | None = None,
    ) -> tuple[int, list[Claim]]:
        """:meth:`record`, and claim (attempt 1) up to ``limit`` of the new updates whose chats are free.

        Returns ``(how many were new, the claims)`` (``(n, [])`` when none could be claimed).
        Claims are taken in ``update_id`` order; a chat is free when it has no open (pending or
        claimed) row; it yields up to ``run`` consecutive updates. Fallback: :meth:`record`, then
        the claims of the next round.
        """
        ...

    def claim_many(
        self,
        lease: float,
        limit: int,
        *,
        max_attempts: int | None = None,
        exclude_chats: Collection[int] = (),
        known: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> list[Claim]:
        """Up to ``limit`` claims as :meth:`~FencedUpdateStore.claim_owned` makes them, at most one per chat.

        ``[]`` when nothing is due. Chats in ``exclude_chats`` are passed over; ``known`` maps ids
        to update dicts the caller holds (no need to read them back). Fallback: ``claim_owned``
        called until it returns ``None`` or ``limit`` is reached.
        """
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
        run: int = 1,
    ) -> tuple[int, list[Claim], bool]:
        """Settle ``settle`` and claim up to ``limit`` (0: settle only) in one transaction.

        Returns ``(how many were still live and got settled, the claims, more)``; ``more`` is
        ``False`` when nothing claimable was left out. With ``chats``/``chatless`` only those chats'
        next updates (and those chatless updates) are candidates; with ``run`` > 1 a chat yields up
        to ``run`` consecutive updates. Fallback: :meth:`settle_many` (or ``settle_owned``) then
        :meth:`claim_many` (or ``claim_owned``), two or more transactions.
        """
        ...

    def settle_many(self, identities: Iterable[Identity]) -> int:
        """Settle the live claims among ``identities``; return how many (0 for none).

        Fallback: ``settle_owned`` for each.
        """
        ...

    def renew_many(self, identities: Iterable[Identity], lease: float) -> set[Identity]:
        """Renew the live claims among ``identities``; return exactly those (matched on all three fields).

        ``set()`` for none. Fallback: ``renew_owned`` for each.
        """
        ...

    def release(self, identity: Identity, *, attempt_counts: bool = True) -> bool:
        """End exactly this live claim now; ``False`` when it is not live.

        ``attempt_counts=True``: the lease expires now and the attempt counts; ``False``: the row
        goes back to pending and the attempt is given back. Fallback: the lease runs out.
        """
        ...

    def write(self, *, durable: bool = False) -> AbstractContextManager[Any]:
        """A write transaction for the application's own tables; the store's calls inside it join it.

        Commits when the block ends, rolls back when it raises. ``durable=True`` commits at the
        inbox's durability (a :meth:`record` inside needs it). Fallback: none; an ``Outbox`` needs it.
        """
        ...


@runtime_checkable
class MonitoredUpdateStore(Protocol):
    """Optional: the store's clock, backpressure, poller generations and counts, and ``close``.

    Fallbacks when a method is missing: ``time.time`` for ``clock``; no backpressure (a fixed
    room of 100) for ``backlog``; no generations; ``stats()`` of the fence without store counts.
    """

    #: The store's clock (seconds); leases and ``due`` times are on it.
    clock: Callable[[], float]

    def backlog(self) -> int:
        """How many updates are claimed now or due now (0 for none); a read, no transaction."""
        ...

    def begin_generation(self, pid: int | None = None, *, door: str = "poll") -> int:
        """Start a new generation (committed) of ``door`` (``"poll"`` or ``"webhook"``: ``stats()`` shows it as
        the generation's ``door``) and return its number (1, 2, …; never reused)."""
        ...

    def mark_progress(self, generation: int) -> None:
        """Record that ``generation``'s poller completed a ``getUpdates`` call now."""
        ...

    def end_generation(self, generation: int, reason: str) -> None:
        """Record why ``generation`` ended (once; later calls keep the first reason)."""
        ...

    def stats(self) -> Mapping[str, Any]:
        """Counts by state, the cursor, the oldest open update's age, the latest generation."""
        ...

    def close(self) -> None:
        """Release the store's resources; later calls raise :class:`~telegram_fence.errors.StoreUnavailable`."""
        ...


_FENCED = ("claim_owned", "renew_owned", "owns", "settle_owned", "retry_owned", "transaction")
_DURABLE = ("exhaust", "due_exhaustions", "acknowledge_exhaustion")
_BATCHED = ("record_and_claim", "claim_many", "exchange", "settle_many", "renew_many", "release", "write")
_MONITORED = ("clock", "backlog", "begin_generation", "mark_progress", "end_generation", "stats", "close")


def _has(store: object, names: Iterable[str]) -> bool:
    return all(callable(getattr(store, name, None)) for name in names)


def is_fenced(store: object) -> bool:
    """Whether ``store`` offers the fenced methods (checked by name, as a runtime validation)."""
    return _has(store, _FENCED)


def is_durable(store: object) -> bool:
    """Whether ``store`` offers the fenced and the durable methods."""
    return is_fenced(store) and _has(store, _DURABLE)


def is_batched(store: object) -> bool:
    """Whether ``store`` offers every fast path of :class:`BatchedUpdateStore` (by name) on top of the
    fenced level. The runtime uses the batched level only whole (checked once, in
    ``runtime.capabilities``)."""
    return is_fenced(store) and _has(store, _BATCHED)


def is_monitored(store: object) -> bool:
    """Whether ``store`` offers every method of :class:`MonitoredUpdateStore` (by name)."""
    return _has(store, _MONITORED)


class PollLeadership(Protocol):
    """Who may poll when several processes share one database (``store.postgres.leadership`` has one; the fence
    looks for it once, at assembly, and its poller uses it).

    ``acquire(timeout)`` waits up to ``timeout`` seconds to lead (``True`` when it does); ``held`` tells whether this
    process leads now; ``release()`` steps down; ``epoch`` names the leadership held; ``last_error`` says why the
    last attempt to take it failed (``None`` when the database answered).
    """

    last_error: str | None

    @property
    def held(self) -> bool: ...

    @property
    def epoch(self) -> int | None: ...

    def acquire(self, timeout: float) -> bool: ...

    def release(self) -> None: ...
