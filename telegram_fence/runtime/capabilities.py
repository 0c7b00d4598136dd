"""The extras of the fence's store no protocol names, looked up once at assembly.

One job: :class:`StoreCapabilities`, the store (it has every method of :class:`~telegram_fence.store.UpdateStore`:
the fence checked it when it opened it) with its poll leadership (several processes on one database) and its
database file, where it has them. May import ``store`` (the contract) and the standard library. Immutable: any
thread may read it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..records import Record
from ..store import UpdateStore
from ..store.contract import PollLeadership

__all__ = ["StoreCapabilities"]


class StoreCapabilities(Record):
    """The store and its extras:

    - ``store``: the fence's store;
    - ``poll_leadership``: the factory of a poll leadership (several processes on one database), or ``None``;
    - ``path``: the store's database file where it has one (its ``path``: SQLite), else ``None`` (PostgreSQL).
    """

    __slots__ = ("path", "poll_leadership", "store")
    store: UpdateStore
    poll_leadership: Callable[[], PollLeadership] | None
    path: str | None

    def __init__(self, store: UpdateStore, poll_leadership: Callable[[], PollLeadership] | None = None,
                 path: str | None = None) -> None:
        object.__setattr__(self, "store", store)
        object.__setattr__(self, "poll_leadership", poll_leadership)
        object.__setattr__(self, "path", path)

    @classmethod
    def of(cls, store: UpdateStore) -> StoreCapabilities:
        """Look at ``store``'s extras once (never raises for one it lacks)."""
        leadership = getattr(store, "poll_leadership", None)
        path = getattr(store, "path", None)
        return cls(store, poll_leadership=leadership if callable(leadership) else None,
                   path=path if isinstance(path, str) and path else None)
