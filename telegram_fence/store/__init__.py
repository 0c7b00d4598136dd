"""The update store contract, in three capability levels, and the SQLite implementation.

=====================  ==============================================================================
``UpdateStore``        ``record``, ``next_offset``, ``claim``, ``renew``, ``settle``, ``prune``
``FencedUpdateStore``  + ``claim_owned``, ``renew_owned``, ``owns``, ``settle_owned``, ``retry_owned``,
                       ``transaction``
``DurableUpdateStore`` + ``exhaust``, ``due_exhaustions``, ``acknowledge_exhaustion``
=====================  ==============================================================================

An attempt is named by :class:`Identity` ``(update_id, attempt, claim_id)``. Every fenced method
compares all three, so neither a later attempt of the same update nor a pruned-and-recorded-again
``update_id`` can act on an old claim. The base level names an attempt by :class:`Step`
``(update_id, attempt)`` only, which is why it cannot fence against ``update_id`` reuse.

Another backend implements these protocols and proves it with
:mod:`telegram_fence.testing.conformance`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Claim",
    "DurableUpdateStore",
    "Exhaustion",
    "FencedUpdateStore",
    "Identity",
    "SqliteUpdateStore",
    "Step",
    "UpdateStore",
    "is_durable",
    "is_fenced",
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
        return self.identity.update_id

    @property
    def attempt(self) -> int:
        return self.identity.attempt

    @property
    def step(self) -> Step:
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
        """Delete finished rows older than ``settled_before``; return how many were deleted."""
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
        """Put exactly this live claim back to pending, due at ``at``, keeping ``error``."""
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


_FENCED = ("claim_owned", "renew_owned", "owns", "settle_owned", "retry_owned", "transaction")
_DURABLE = ("exhaust", "due_exhaustions", "acknowledge_exhaustion")


def _has(store: object, names: Iterable[str]) -> bool:
    return all(callable(getattr(store, name, None)) for name in names)


def is_fenced(store: object) -> bool:
    """Whether ``store`` offers the fenced methods (checked by name, as a runtime validation)."""
    return _has(store, _FENCED)


def is_durable(store: object) -> bool:
    """Whether ``store`` offers the fenced and the durable methods."""
    return is_fenced(store) and _has(store, _DURABLE)


def __getattr__(name: str) -> Any:
    # Import the APSW implementation lazily so the contract imports without the driver.
    if name == "SqliteUpdateStore":
        from .sqlite import SqliteUpdateStore

        return SqliteUpdateStore
    raise AttributeError(name)
