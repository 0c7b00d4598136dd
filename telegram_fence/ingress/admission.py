"""The two gates the poller waits at before a long poll: :class:`Admission` (whether the application accepts work
now: ``Fence.pause``/``resume``) and :class:`Progress` (the pool made room: it settled something). May import the
standard library only (layer 2, ingress).
"""

from __future__ import annotations

import threading

__all__ = ["Admission", "Progress"]


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


class Progress:
    """The pool's progress as the poller waits for it: :meth:`notify` after a settle, :meth:`wait` for the next one
    (or ``timeout`` seconds, or at once once ``stop`` is set). Safe to share between threads."""

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._cv = threading.Condition()

    def notify(self) -> None:
        """Wake every waiter (also used to let them see the stop)."""
        with self._cv:
            self._cv.notify_all()

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for :meth:`notify`; returns at once when stopping."""
        with self._cv:
            if not self._stop.is_set():
                self._cv.wait(timeout)
