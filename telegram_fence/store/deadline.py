"""The per-thread deadline behind both stores' ``bounded(seconds)``: a block within which the calling thread's
store calls must have answered."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

__all__ = ["Deadlined", "within"]


class Deadlined(Protocol):
    """A thread's store state with room for the deadline: the monotonic time, or ``None`` outside any block."""

    deadline: float | None


@contextmanager
def within(local: Deadlined, seconds: float) -> Iterator[None]:
    """Set ``local.deadline`` to ``seconds`` from now for the block (a nested block keeps the earlier deadline;
    a negative ``seconds`` counts as 0) and restore what it was afterwards, also when the block raises."""
    before = local.deadline
    mine = time.monotonic() + max(0.0, seconds)
    local.deadline = mine if before is None else min(before, mine)
    try:
        yield
    finally:
        local.deadline = before
