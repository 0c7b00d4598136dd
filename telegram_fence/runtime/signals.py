"""Running until stopped, on signals: the first SIGINT/SIGTERM stops gracefully, a second stops at once.

Tells a service manager (systemd's notify protocol, ``$NOTIFY_SOCKET``) when the fence is ready and when it stops.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["notify", "serve_until_stopped"]

_log = logging.getLogger("telegram_fence.notify")

def notify(*fields: str) -> bool:
    """Send ``fields`` (``"READY=1"``, …), one per line, to ``$NOTIFY_SOCKET`` (a path or an ``@abstract`` name);
    ``True`` when the datagram left. Never raises: a service manager that went away must not stop the bot."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(fields).encode())
    except OSError as exc:
        _log.debug("could not notify the service manager at $NOTIFY_SOCKET: %s", exc)
        return False
    return True


#: Seconds a shutdown may take before ``stopping()`` is told (an idle bot's stop ends well within it)
_QUIET_STOP = 1.0


def serve_until_stopped(start: Callable[[], None], stop: Callable[[], None], join: Callable[[], Any],
                        stopped: threading.Event, log: logging.Logger, stopping: Callable[[], None] | None = None
                        ) -> int | None:
    """``start()``, wait until ``stopped`` is set, then ``join()``; ``None`` after a full shutdown. ``stopping()`` is
    called when the shutdown has not ended within a second.

    On the main thread SIGINT and SIGTERM call ``stop()``; a second one during the shutdown returns at once with
    ``128 + signal number`` (the shutdown goes on in the daemon thread ``fence-shutdown``). The previous handlers are
    restored before returning. The threads ``start()`` starts (and theirs) and the shutdown's block both signals, so the
    kernel hands them to the main thread: taken by another thread, a signal is only flagged and the main thread's
    wait sleeps on.
    ``READY=1`` is notified once started with the handlers in place, ``STOPPING=1`` once the stop began.
    """
    released = threading.Event()
    forced: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if stopped.is_set():
            forced.append(signum)
            released.set()
        else:
            stop()

    restore: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            restore[signum] = signal.signal(signum, on_signal)
    try:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, restore)  # the threads start() starts inherit the mask
        try:
            start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        notify("READY=1")
        stopped.wait()
        notify("STOPPING=1")

        def shut_down() -> None:
            signal.pthread_sigmask(signal.SIG_BLOCK, restore)  # a second signal too goes to the main thread
            try:
                join()
            finally:
                released.set()

        # The main thread stays free to take a second signal while the shutdown runs.
        threading.Thread(target=shut_down, name="fence-shutdown", daemon=True).start()
        if stopping is not None and not released.wait(_QUIET_STOP):
            stopping()
        released.wait()
    finally:
        for number, previous in restore.items():
            signal.signal(number, previous)
    if forced:
        log.warning("second signal: stopping at once; running handlers are abandoned and their "
                    "updates run again after their lease on the next start")
        return 128 + forced[0]
    return None
