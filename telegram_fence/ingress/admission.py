"""The gate the poller waits at before a long poll: :class:`Admission` (whether the application accepts work now:
``Fence.pause``/``resume``). May import the standard library only (layer 2, ingress).
"""

from __future__ import annotations

import threading

__all__ = ["Admission"]


class Admission:
    """Whether the application accepts work; the poller waits for it before every long poll.

    Safe to share between threads.
    """

    def __init__(self, accepting: bool = True) -> None:
        self._cv = threading.Condition()
        self._accepting = accepting
        self._stopping = False

    @property
    def accepting(self) -> bool:
        return self._accepting

    def set(self, accepting: bool) -> None:
        with self._cv:
            self._accepting = accepting
            self._cv.notify_all()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    def wait(self) -> bool:
        """Block until accepting (``True``) or stopping (``False``)."""
        with self._cv:
            while not self._accepting and not self._stopping:
                self._cv.wait()
            return not self._stopping
