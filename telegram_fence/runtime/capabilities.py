"""What the fence's store can do, checked once at assembly through the store protocols' own checks.

One job: :class:`StoreCapabilities`, the store seen through the protocol levels it offers (fenced; batched,
durable, monitored or not) and the optional extras no protocol names (an exhaustion listener, a poll
leadership, the database file's path). The pool's parts call the typed views it holds instead of probing the store
with ``getattr`` or ``hasattr`` on their hot paths. May import ``store`` (the contract), ``ingress.poller`` (the
poll leadership's protocol) and the standard library.
Immutable: any thread may read it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..records import Record
from ..store import UpdateStore
from ..store.contract import PollLeadership

__all__ = ["StoreCapabilities"]


class StoreCapabilities(Record):
    """The store and the protocol views the runtime may use; ``None`` where the store does not offer a level.

    - ``store``: the fenced level every fence needs; ``fenced``: whether it offers all of it (``is_fenced``:
      an attempt handler needs ``renew_owned``, ``owns`` and ``transaction`` beside what the pool calls);
    - ``batched``: every fast path of :class:`~telegram_fence.store.UpdateStore` (``is_batched``),
      else ``None`` (the runtime then claims, settles and renews one attempt at a time and lets a
      timed-out claim's lease run out); ``nests_writes``: its ``write()`` nests the other calls, so a
      dispatcher round is one transaction; ``accepts_body``: its ``record`` takes the raw ``getUpdates`` body
      (``False`` where the store does not say so: the PostgreSQL store has no such attribute);
    - ``durable``: exhaustions are kept (``is_durable``), else ``None`` (a spent update is retried late);
    - ``monitored``: backlog, generations and stats (``is_monitored``), else ``None``;
    - ``clock``: the store's time (its ``clock``, else ``time.time``): retry times are in it;
    - ``exhaustion_listener``: ``add_exhaustion_listener`` where the store has it (exhaustions it finds itself);
    - ``poll_leadership``: the factory of a poll leadership (several processes on one database), or ``None``;
    - ``path``: the store's database file where it has one (its ``path``: SQLite), else ``None`` (PostgreSQL).
    """

    __slots__ = (
        "accepts_body",
        "batched",
        "clock",
        "durable",
        "exhaustion_listener",
        "fenced",
        "monitored",
        "nests_writes",
        "path",
        "poll_leadership",
        "store",
    )
    store: UpdateStore
    batched: UpdateStore | None
    durable: UpdateStore | None
    monitored: UpdateStore | None
    nests_writes: bool
    clock: Callable[[], float]
    exhaustion_listener: Callable[[Callable[[], None]], Callable[[], None]] | None
    poll_leadership: Callable[[], PollLeadership] | None
    fenced: bool
    accepts_body: bool
    path: str | None

    def __init__(self, store: UpdateStore, batched: UpdateStore | None,
                 durable: UpdateStore | None, monitored: UpdateStore | None, nests_writes: bool,
                 clock: Callable[[], float],
                 exhaustion_listener: Callable[[Callable[[], None]], Callable[[], None]] | None,
                 poll_leadership: Callable[[], PollLeadership] | None, fenced: bool = True,
                 accepts_body: bool = False, path: str | None = None) -> None:
        object.__setattr__(self, "store", store)
        object.__setattr__(self, "batched", batched)
        object.__setattr__(self, "durable", durable)
        object.__setattr__(self, "monitored", monitored)
        object.__setattr__(self, "nests_writes", nests_writes)
        object.__setattr__(self, "clock", clock)
        object.__setattr__(self, "exhaustion_listener", exhaustion_listener)
        object.__setattr__(self, "poll_leadership", poll_leadership)
        object.__setattr__(self, "fenced", fenced)
        object.__setattr__(self, "accepts_body", accepts_body)
        object.__setattr__(self, "path", path)

    @classmethod
    def of(cls, store: UpdateStore) -> StoreCapabilities:
        """Look at ``store`` once (it has every method of :class:`~telegram_fence.store.UpdateStore`: the fence
        checked it when it opened it) and at the extras no protocol names."""
        leadership = getattr(store, "poll_leadership", None)
        path = getattr(store, "path", None)
        return cls(
            store=store,
            batched=store,
            durable=store,
            monitored=store,
            nests_writes=True,
            clock=store.clock,
            exhaustion_listener=store.add_exhaustion_listener,
            poll_leadership=leadership if callable(leadership) else None,
            fenced=True,
            accepts_body=getattr(store, "accepts_body", False) is True,
            path=path if isinstance(path, str) and path else None,
        )
