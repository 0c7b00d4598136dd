"""Who has a SQLite store's file open: every open ``SqliteUpdateStore`` holds a shared ``flock`` on the file's
sidecar ``PATH-owners`` until it closes (or its process dies). A store that opening gets the lock exclusively knows
that no other store has the file open: every live claim in the file belongs to a process that is gone.
"""

from __future__ import annotations

import contextlib
import os

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no holders, the leases stay the bound
    fcntl = None  # type: ignore[assignment]

__all__ = ["SUFFIX", "Holders"]

#: The sidecar file's suffix (beside ``PATH-wal`` and ``PATH-shm``).
SUFFIX = "-owners"


class Holders:
    """This store's hold on its file (see the module docstring)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def open(cls, path: str) -> Holders | None:
        """Open ``path``'s sidecar (made when missing); ``None`` where it cannot be opened (the store is then never
        alone)."""
        if fcntl is None:
            return None
        try:
            fd = os.open(path + SUFFIX, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError:
            return None
        return cls(fd)

    def alone(self) -> bool:
        """Try to hold the file exclusively, without waiting (until :meth:`share`): whether no other store has it."""
        if self._fd is None:
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True

    def share(self) -> None:
        """Hold the file shared, as every open store does."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_SH)

    def close(self) -> None:
        """Let the file go (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
