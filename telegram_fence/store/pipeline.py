"""The optional split round of a store: begin a dispatcher round now, read its outcome later.

One job: the protocols :class:`PipelinedUpdateStore` (``begin_round``) and :class:`PendingRound` (``result``), and
the value :class:`RoundOutcome`. A store whose round waits on a server (PostgreSQL) offers it, so the dispatcher can
run the handlers of claims already committed while the server works on the next round; a store without it (SQLite,
whose round holds the interpreter only in short steps) keeps the synchronous path of
:class:`~telegram_fence.store.contract.BatchedUpdateStore`. May import the standard library and
:mod:`.contract` only.

A round begun is one transaction: settle ``settle``, record the batch with the cursor, claim some of its new
updates as they are stored (the rule of ``record_and_claim``, with the chats of ``held`` claims counted as free,
see :meth:`PipelinedUpdateStore.begin_round`), count the backlog and read the cursor for the poller, commit.
Nothing of it is known to the caller before :meth:`PendingRound.result` returned: the claims may run only then, and
the batch's offset be confirmed only then.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ..records import Record
from .contract import Claim, Identity

__all__ = ["PendingRound", "PipelinedUpdateStore", "RoundOutcome", "is_pipelined"]


class RoundOutcome(Record):
    """What a committed round did: how many of ``settle`` were still live and got settled, how many updates of the
    batch were new, the claims it took (in ``update_id`` order), and ``refused``: why the batch was not stored
    although the settles were (:class:`~telegram_fence.errors.LeadershipLost`), else ``None``.

    ``backlog`` and ``cursor``: what :meth:`~telegram_fence.store.MonitoredUpdateStore.backlog` and
    :meth:`~telegram_fence.store.UpdateStore.next_offset` would have answered as the round committed (counted inside
    its transaction, after its writes), so the poller need not ask again before its next ``getUpdates``; ``None``
    when the round did not count them (then they are read from the store). Never above what the store held then: the
    cursor only grows, so a carried cursor confirms nothing the store does not hold.

    ``conversing``: asked for (``begin_round(conversations=True)``), the chats of the batch that had a conversation
    stored (a state of any user, or next-step handlers) as the round committed, read inside its transaction after its
    claims; ``None`` when not asked, or when the claims were made after that read."""

    __slots__ = ("backlog", "claims", "conversing", "cursor", "new", "refused", "settled")
    settled: int
    new: int
    claims: list[Claim]
    refused: BaseException | None
    backlog: int | None
    cursor: int | None
    conversing: frozenset[int] | None

    def __init__(self, settled: int, new: int, claims: list[Claim] | None = None,
                 refused: BaseException | None = None, backlog: int | None = None, cursor: int | None = None,
                 conversing: frozenset[int] | None = None) -> None:
        object.__setattr__(self, "settled", settled)
        object.__setattr__(self, "new", new)
        object.__setattr__(self, "claims", [] if claims is None else claims)
        object.__setattr__(self, "refused", refused)
        object.__setattr__(self, "backlog", backlog)
        object.__setattr__(self, "cursor", cursor)
        object.__setattr__(self, "conversing", conversing)


class PendingRound(Protocol):
    """A round sent to the store and not read yet. Used by the thread that began it, once."""

    def result(self) -> RoundOutcome:
        """Wait for the round and return what it did, once it is committed.

        Raises what ``record_and_claim`` raises (:class:`~telegram_fence.errors.StoreError` subclasses); nothing of
        the round is stored then, unless the connection failed after the server committed it (the answer lost): the
        caller cannot tell, and must treat it as possibly committed (a batch recorded again is found stored; claims
        not run lapse after their lease). A round whose batch only was refused (its leadership lost) still settled
        ``settle`` (each settle is fenced by its identity: settling a finished attempt is right whoever records) and
        says so in :attr:`RoundOutcome.refused`. Call it exactly once."""
        ...


@runtime_checkable
class PipelinedUpdateStore(Protocol):
    """Optional: a dispatcher round sent now and read later (see the module docstring)."""

    def begin_round(
        self,
        settle: Iterable[Identity],
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        *,
        lease: float,
        limit: int,
        run: int = 1,
        held: Collection[Identity] = (),
        skip: Collection[int] = (),
        generation: int | None = None,
        body: bytes | str | None = None,
        conversations: bool = False,
    ) -> PendingRound | None:
        """Send one round: settle ``settle``, then ``record_and_claim(updates, next_offset, lease=, limit=, run=,
        skip=, generation=, body=)``, then commit; return at once with the round in flight.

        ``held``: claims the caller holds and will finish, one after another, before any claim of this round: a
        chat whose only open rows are these live claims counts as free (its new updates may be claimed, to run
        after them). ``conversations``: also say which chats of the batch have a conversation stored
        (:attr:`RoundOutcome.conversing`; the store's conversation tables must exist). ``None``: this batch cannot go
        this way (an update that
        cannot be stored as it is, a hook, a transaction open on this thread, ...); nothing was sent, and the
        caller makes the synchronous calls instead. Raises :class:`~telegram_fence.errors.InvalidUpdate` for a
        malformed item and :class:`~telegram_fence.errors.StoreError` subclasses when the round cannot be sent
        (nothing stored)."""
        ...


def is_pipelined(store: object) -> bool:
    """Whether ``store`` offers :meth:`PipelinedUpdateStore.begin_round` (checked once, in ``runtime.capabilities``)."""
    return callable(getattr(store, "begin_round", None))
