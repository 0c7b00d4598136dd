"""Waiting until a fenced bot in a child process is ready to be stopped: the listening end of ``$NOTIFY_SOCKET``.

A SIGTERM sent before the child's ``READY=1`` kills it instead of stopping it; a harness waits here first.
Linux only (an abstract socket name, the sender's pid from ``SO_PASSCRED``).
"""

from __future__ import annotations

import os
import secrets
import select
import socket
import struct
import subprocess
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

__all__ = ["ReadinessSocket"]

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class ReadinessSocket:
    """A ``$NOTIFY_SOCKET`` for child processes: :meth:`env` gives their environment, :meth:`wait_ready` blocks
    until one of them (told apart by pid, so one socket serves a run of restarts) said ``READY=1``.

    Use it as a context manager or call :meth:`close`. Children of the child that inherit the variable are
    heard too, under their own pid.
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

    def env(self, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """A child's environment: ``base`` (default ``os.environ``) and ``extra``, with ``NOTIFY_SOCKET`` set."""
        return {**(os.environ if base is None else base), **extra, "NOTIFY_SOCKET": self.address}

    def heard(self, pid: int) -> list[str]:
        """The fields (``"READY=1"``, ``"STOPPING=1"``, …) process ``pid`` sent so far, in order."""
        self._drain(0.0)
        return list(self._heard.get(pid, []))

    def wait_ready(self, process: subprocess.Popen[Any], timeout: float = 30.0) -> bool:
        """Block until ``process`` sent ``READY=1``; False when it exited first or ``timeout`` seconds passed."""
        field = "READY=1"
        deadline = time.monotonic() + timeout
        exited = _exit_watch(process.pid)
        try:
            while field not in self._heard.get(process.pid, ()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if process.poll() is not None:
                    self._drain(0.0)  # what it sent before it exited is queued already
                    return field in self._heard.get(process.pid, ())
                # Wakes on a datagram or on the child's exit (its pidfd); without pidfd, looks again every 50 ms.
                watched = [self._sock.fileno(), *([exited] if exited is not None else [])]
                readable, _, _ = select.select(watched, [], [],
                                               remaining if exited is not None else min(remaining, 0.05))
                if self._sock.fileno() in readable:
                    self._drain(0.0)
            return True
        finally:
            if exited is not None:
                os.close(exited)

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

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def _exit_watch(pid: int) -> int | None:
    """A pidfd that turns readable when ``pid`` exits, or None (kernel < 5.3, or the process is gone)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None
