"""The poller's hand-off to the dispatcher: a batch to record on the dispatcher's thread, and its answer.

One job: the :class:`RecordRequest` value the poller's thread hands to the dispatcher (see
``Dispatcher.record``) and waits on. May import the standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["RecordRequest"]


class RecordRequest:
    """A batch the poller asks the dispatcher to record (see ``Dispatcher.record``).

    Thread safety: ``result`` and ``error`` are written by the dispatcher before it sets ``done``
    and read by the poller only after ``done`` is set (the event orders them).
    """

    __slots__ = ("done", "error", "kwargs", "next_offset", "result", "updates")

    def __init__(self, updates: Sequence[Mapping[str, Any]], next_offset: int, kwargs: dict[str, Any]) -> None:
        self.updates = updates
        self.next_offset = next_offset
        self.kwargs = kwargs
        self.done = threading.Event()
        self.result = 0
        self.error: BaseException | None = None
