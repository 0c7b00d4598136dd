"""Small waiting helpers shared by the project's tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def eventually(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Wait until ``predicate()`` is truthy (state owned by other threads or processes); False on timeout."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        pause.wait(interval)
