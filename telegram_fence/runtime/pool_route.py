"""The fence's way to its pool's one writer: a write of the fence's own threads (the exhaustion delivery, the
housekeeping on the heartbeat, the webhook intake's group commit) goes to the running pool's writer, and runs on
the calling thread while no pool runs (before ``start``, after ``join``). May import ``runtime.handoff``,
``runtime.pool`` and the standard library.

Thread safety: any thread may call it; it keeps no state beyond the two callables it was given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from .handoff import PulledRecord
from .pool import WorkerPool

__all__ = ["PoolRoute"]

T = TypeVar("T")


class PoolRoute:
    """Routes writes to ``pool()``'s writer when it returns a pool, else does them at once (``record``: on the
    store's own ``record``). Failures of the write are raised to the caller unchanged."""

    def __init__(self, pool: Callable[[], WorkerPool | None], record: Callable[..., int]) -> None:
        self._pool = pool
        self._record = record

    def write(self, fn: Callable[[], T]) -> T:
        """``fn()``, done by the pool's writer (the dispatcher) while it runs."""
        pool = self._pool()
        return fn() if pool is None else pool.writer.call(fn)

    def heartbeat_write(self, fn: Callable[[], T]) -> T:
        """The same for what runs on the heartbeat (housekeeping): it still hands over a stuck dispatcher."""
        pool = self._pool()
        return fn() if pool is None else pool.heartbeat.write(fn)

    def record(self, updates: Sequence[Mapping[str, Any]], next_offset: int, **kwargs: Any) -> int:
        """The webhook intake's group commit, done by the pool's writer while it runs."""
        pool = self._pool()
        if pool is None:
            return int(self._record(updates, next_offset, **kwargs))
        return pool.record(updates, next_offset, **kwargs)

    def post(self, take: Callable[[], tuple[list[Mapping[str, Any]], dict[str, Any]] | None],
             done: Callable[[BaseException | None], None]) -> PulledRecord | None:
        """The webhook intake's group for the pool's writer to take when its next round begins (the intake's
        ``GroupHandOff``); ``None`` while no pool's writer serves (the intake then commits it itself)."""
        pool = self._pool()
        if pool is None:
            return None
        request = PulledRecord(take, done)
        return request if pool.writer.post(request) else None

    def orphaned(self, ticket: object) -> bool:
        """Whether the pool's writer went away without taking ``ticket`` (a :meth:`post`'s)."""
        pool = self._pool()
        return isinstance(ticket, PulledRecord) and (pool is None or pool.writer.orphaned(ticket))

    def wake(self) -> None:
        """The webhook intake committed: the pool claims the new rows (its writer, when it recorded them, knows
        their chats already: no wake-up then)."""
        pool = self._pool()
        if pool is not None and not pool.writer.serving():
            pool.wake()
