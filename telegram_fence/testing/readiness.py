"""Waiting until a fenced bot in a child process is ready to be stopped (a SIGTERM before its ``READY=1`` kills it):
the listening end of ``$NOTIFY_SOCKET``. Linux only (an abstract socket name, the sender's pid from ``SO_PASSCRED``).
"""

from __future__ import annotations

import os
import secrets
import select
import socket
import struct
import subprocess
import time
from typing import Any

__all__ = ["ReadinessSocket"]

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class ReadinessSocket:
    """A ``$NOTIFY_SOCKET`` for child processes: :meth:`env` gives their environment, :meth:`wait_ready` blocks
    until one of them (told apart by pid, so one socket serves a run of restarts) said ``READY=1``. A context manager.
    """

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            name = f"telegram-fence-ready-{os.getpid()}-{secrets.token_hex(8)}"
            self._sock.bind("\0" + name)
        except BaseException:
            self._sock.close()
            raise
        #: The value for ``$NOTIFY_SOCKET`` (an abstract name: no file to clean up, no path length limit).
        self.address = "@" + name
        self._heard: dict[int, list[str]] = {}

    def env(self, **extra: str) -> dict[str, str]:
        """A child's environment: ``os.environ`` and ``extra``, with ``NOTIFY_SOCKET`` set."""
        return {**os.environ, **extra, "NOTIFY_SOCKET": self.address}

    def heard(self, pid: int) -> list[str]:
        """The fields (``"READY=1"``, ``"STOPPING=1"``, …) process ``pid`` sent so far, in order."""
        self._drain(0.0)
        return list(self._heard.get(pid, []))

    def wait_ready(self, process: subprocess.Popen[Any], timeout: float = 30.0) -> bool:
        """Block until ``process`` sent ``READY=1``; False when it exited first or ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        while "READY=1" not in self._heard.get(process.pid, ()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if process.poll() is not None:
                self._drain(0.0)  # what it sent before it exited is queued already
                return "READY=1" in self._heard.get(process.pid, ())
            self._drain(min(remaining, 0.05))
        return True

    def _drain(self, timeout: float) -> None:
        """Read every datagram that is queued (waiting up to ``timeout`` for the first)."""
        wait = timeout
        while select.select([self._sock], [], [], wait)[0]:
            wait = 0.0
            data, ancillary, _, _ = self._sock.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
            pid = 0
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _UCRED.unpack(payload[: _UCRED.size])[0]
            self._heard.setdefault(pid, []).extend(data.decode(errors="replace").splitlines())

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> ReadinessSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

