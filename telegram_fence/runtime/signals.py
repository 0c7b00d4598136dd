"""Running until stopped, on signals: the first SIGINT/SIGTERM stops gracefully, a second stops at once.

Used by :meth:`Fence.run <telegram_fence.Fence.run>` and ``run_webhook``; tells a service manager (``$NOTIFY_SOCKET``,
see :mod:`~telegram_fence.runtime.notify`) when the fence is ready and when it stops. May import the standard
library and ``runtime.notify`` only (layer 3, runtime).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from .notify import notify

__all__ = ["serve_until_stopped"]

#: Seconds a shutdown may take before ``stopping()`` is told (an idle bot's stop ends well within it)
_QUIET_STOP = 1.0


def serve_until_stopped(
    start: Callable[[], None],
    stop: Callable[[], None],
    join: Callable[[], Any],
    stopped: threading.Event,
    log: logging.Logger,
    stopping: Callable[[], None] | None = None,
) -> int | None:
    """``start()``, wait until ``stopped`` is set, then ``join()``; returns ``None`` after a full shutdown.
    ``stopping()``, when given, is called when the shutdown has not ended within a second (to say what it waits for).

    On the main thread SIGINT and SIGTERM call ``stop()``; a second one while the shutdown runs returns at once
    with ``128 + signal number`` (the shutdown goes on in the daemon thread ``fence-shutdown`` and is abandoned
    when the process exits). The previous signal handlers are restored before returning, also on an exception.

    Once ``start()`` returned, with the handlers in place, ``READY=1`` goes to ``$NOTIFY_SOCKET`` when it is set
    (systemd's ``Type=notify``; a harness that sends SIGTERM waits for it: before it, Python's default SIGTERM
    disposition would kill the process instead of stopping it), and ``STOPPING=1`` once the stop began.
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
        start()
        notify("READY=1")
        stopped.wait()
        notify("STOPPING=1")

        def shut_down() -> None:
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
