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
    """A batch the poller asks the dispatcher to record (see ``Dispatcher.record``), and its answer.

    Thread safety: the dispatcher calls :meth:`keep` or :meth:`fail` before :meth:`finish`; the asking
    thread reads :meth:`outcome` only after :meth:`wait` returned ``True`` (the event orders them).
    """

    __slots__ = ("_done", "_error", "_result", "kwargs", "next_offset", "updates")

    def __init__(self, updates: Sequence[Mapping[str, Any]], next_offset: int, kwargs: dict[str, Any]) -> None:
        self.updates = updates
        self.next_offset = next_offset
        self.kwargs = kwargs
        self._done = threading.Event()
        self._result = 0
        self._error: BaseException | None = None

    def keep(self, result: int) -> None:
        """What ``store.record`` returned (the answer once the transaction holding it committed)."""
        self._result = result

    def fail(self, error: BaseException) -> None:
        """Recording failed (or its transaction did): nothing of the batch was stored."""
        self._error, self._result = error, 0

    def finish(self) -> None:
        """The answer is final: wake the asking thread."""
        self._done.set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the answer; ``True`` once it is final."""
        return self._done.wait(timeout)

    def outcome(self) -> int:
        """``store.record``'s result; raises what recording raised (call after :meth:`wait` returned ``True``)."""
        if self._error is not None:
            raise self._error
        return self._result
