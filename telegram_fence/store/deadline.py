"""What both stores share: ``with store:`` closing it, the per-thread deadline of ``bounded(seconds)`` (the health
endpoints' answer in time) and the exhaustion listeners told after a commit."""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["PerThread", "ThreadBound"]

log = logging.getLogger("telegram_fence.store")

_lock = threading.Lock()

_T = TypeVar("_T", bound="ThreadBound")


class PerThread(threading.local):
    #: inside :meth:`ThreadBound.bounded`: the monotonic time by which this thread's calls must have answered
    deadline: float | None = None
    #: this thread's transaction made an exhaustion of the store's own finding; told once it commits
    exhausted = False


class ThreadBound(ABC):
    """The base of both stores' connections; ``_local`` is the store's :class:`PerThread`."""

    _local: PerThread
    _listeners: tuple[Callable[[], None], ...] = ()

    @abstractmethod
    def close(self) -> None:
        """Close the store's connections (each backend's own)."""

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def bounded(self, seconds: float) -> Iterator[None]:
        """Within the block, this thread's store calls wait at most until ``seconds`` from now (a negative value
        counts as 0), then raise :class:`StoreUnavailable`: on SQLite its reads outside a transaction, on PostgreSQL
        each transaction it begins outside one already open. Nested blocks keep the earlier deadline."""
        local = self._local
        before = local.deadline
        mine = time.monotonic() + max(0.0, seconds)
        local.deadline = mine if before is None else min(before, mine)
        try:
            yield
        finally:
            local.deadline = before

    def add_exhaustion_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` on the committing thread after each commit of this store that made an exhaustion it
        found itself (attempts spent, found while claiming; an update it could not store, read or decode; not one
        made by ``exhaust``). It must be quick; an exception from it is logged and ignored. Returns a function
        that removes it. Safe from any thread."""
        with _lock:
            self._listeners = (*self._listeners, listener)

        def remove() -> None:
            with _lock:
                self._listeners = tuple(fn for fn in self._listeners if fn is not listener)

        return remove

    def _found_exhaustion(self) -> None:
        """Mark this thread's transaction: it made an exhaustion; the listeners are told once it commits."""
        self._local.exhausted = True

    def _tell_exhausted(self) -> None:
        """Call the exhaustion listeners: this thread committed an exhaustion."""
        self._local.exhausted = False
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.error("an exhaustion listener raised; ignored", exc_info=True)
