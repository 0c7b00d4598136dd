"""Telling a service manager how the bot is doing: systemd's notify protocol (``sd_notify``), without libsystemd.

When ``$NOTIFY_SOCKET`` names a Unix datagram socket (systemd sets it for a ``Type=notify`` service; a supervisor or
a test harness may set it too: see :class:`telegram_fence.testing.ReadinessSocket`), :func:`notify` sends one
datagram of ``KEY=VALUE`` lines there. :func:`~telegram_fence.runtime.signals.serve_until_stopped` sends
``READY=1`` once the fence started with its SIGINT/SIGTERM handlers in place (from then on a SIGTERM is a graceful
stop, exit 0; before it, Python's default disposition would kill the process), and ``STOPPING=1`` when the stop
begins. Without the variable nothing is sent. May import the standard library only (layer 3, runtime).
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["notify"]

_log = logging.getLogger("telegram_fence.notify")


def notify(*fields: str) -> bool:
    """Send ``fields`` (``"READY=1"``, …), one per line, to ``$NOTIFY_SOCKET``; True when the datagram left.

    A path (``/run/…``) and an abstract name (``@name``) are understood, as systemd writes them; anything else,
    an unset variable or a socket nobody listens on returns False. Never raises: a service manager that went
    away must not stop the bot.
    """
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
