"""How long a read command may take: its ``--timeout SECONDS`` (default 3 s), and the one line a store that did not
answer in time comes to.

A read command answers within its ``--timeout`` whatever holds the store's locks: SQLite's busy timeout, libpq's
``connect_timeout`` (whole seconds, at least 2) and the store's ``bounded`` reads all take what is left of it. A
store that did not answer is :class:`~telegram_fence.errors.StoreUnavailable`, printed as :func:`unread_line`
with exit 1 (nothing was written).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import StoreUnavailable
from .args import positive_float

__all__ = ["READ_TIMEOUT", "Budget", "add_timeout", "is_lock_error", "translated_locks", "unread_line"]

#: ``--timeout`` by default: seconds a read command may take (a supervisor's check must not hang on a lock)
READ_TIMEOUT = 3.0


def add_timeout(parser: argparse.ArgumentParser, *, postgres: bool = True) -> None:
    """Add ``--timeout SECONDS`` to a read command's parser; its help names PostgreSQL only with ``postgres``."""
    if postgres:
        text = ("answer within this (default %(default)g): a store locked longer, or a PostgreSQL server that does "
                "not answer, is one line on stderr and exit 1 (connecting to PostgreSQL takes whole seconds, at "
                "least 2)")
    else:
        text = ("answer within this (default %(default)g): a file locked longer by another connection is one line "
                "on stderr and exit 1")
    parser.add_argument("--timeout", type=positive_float, default=READ_TIMEOUT, metavar="SECONDS", help=text)


class Budget:
    """The time a command has left: made from its ``--timeout`` when it starts, read by each step that waits."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._deadline = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left (at least a millisecond, so a last step still fails by its own timeout, not by 0)."""
        return max(0.001, self._deadline - time.monotonic())

    def connect_timeout(self) -> int:
        """``connect_timeout`` for libpq: the seconds left, rounded up, at least 2 (libpq's own minimum)."""
        return max(2, math.ceil(self._deadline - time.monotonic()))


def is_lock_error(exc: BaseException) -> bool:
    """Whether ``exc`` is (or was caused by) a driver's "another connection holds the lock" or "gave up waiting"
    error; a driver not loaded yet is not looked at."""
    apsw = sys.modules.get("apsw")
    psycopg = sys.modules.get("psycopg")
    seen: BaseException | None = exc
    while seen is not None:
        if apsw is not None and isinstance(seen, (apsw.BusyError, apsw.LockedError)):
            return True
        if psycopg is not None and isinstance(seen, (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)):
            return True
        seen = seen.__cause__
    return False


@contextmanager
def translated_locks(where: str) -> Iterator[None]:
    """A lock error of the block (:func:`is_lock_error`) raised as :class:`StoreUnavailable` naming ``where``."""
    try:
        yield
    except StoreUnavailable:
        raise
    except Exception as exc:
        if not is_lock_error(exc):
            raise
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise StoreUnavailable(f"{where}: {first}") from exc


def unread_line(exc: StoreUnavailable, seconds: float, consequence: str) -> str:
    """The one line for a store that did not answer within ``seconds``: why, and ``consequence``."""
    why = "another connection holds a lock on it" if is_lock_error(exc) else "it did not answer"
    detail = " ".join(str(exc).split())
    return f"the store could not be read within {seconds:g} s: {why}, {consequence} (nothing was written; {detail})"
