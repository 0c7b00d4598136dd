"""Guarding the runtime's threads: nothing they raise ends them silently.

One job: run a background thread's body so that an exception escaping it is logged and ends the
fence with a reason (``on_fatal``), instead of leaving a dead thread behind a fence that seems to
run; and say which store errors a loop may outlive (retry after a back-off) and which it cannot.
May import ``errors``, ``runtime.attempt`` and the standard library. Logs as ``telegram_fence.guard``.
Thread-safe: the functions keep no state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..errors import ConfigurationError, SchemaError, StoreCorrupt
from .attempt import error_line

__all__ = ["can_outlive", "guarded"]

log = logging.getLogger("telegram_fence.guard")

#: Errors that repeating the same store call cannot fix: the fence ends with the reason instead.
_LASTING = (StoreCorrupt, SchemaError, ConfigurationError)


def can_outlive(error: BaseException) -> bool:
    """Whether a loop may log ``error``, back off and go on (``StoreUnavailable``, ``apsw.BusyError``, …).

    ``False`` for errors that stay (a damaged or too new database, a setting that cannot work) and for
    what is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``).
    """
    return isinstance(error, Exception) and not isinstance(error, _LASTING)


def guarded(body: Callable[[], None], on_fatal: Callable[[str], None]) -> Callable[[], None]:
    """``body`` wrapped for a thread: whatever it raises is logged and passed to ``on_fatal`` as a reason.

    The reason names the thread and the error (``fence-dispatcher: StoreCorrupt: …``). ``on_fatal``
    raising is logged too; the wrapper itself never raises.
    """

    def run() -> None:
        try:
            body()
        except BaseException as exc:
            name = threading.current_thread().name
            log.critical("%s cannot go on: %s", name, error_line(exc), exc_info=exc)
            try:
                on_fatal(f"{name} cannot go on: {error_line(exc)}")
            except Exception:
                log.error("ending the fence failed", exc_info=True)

    return run
