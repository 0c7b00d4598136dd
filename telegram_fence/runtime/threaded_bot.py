"""Running a threaded telebot bot (``TeleBot(token)``, telebot's default ``threaded=True``) on the fence's own
threads: the one module that changes how a bot hands its handlers to threads.

telebot hands every handler (message, callback, next-step, middleware, …) to one method, ``_exec_task``, which
for a threaded bot puts it on the bot's ``worker_pool`` and returns before the handler ran: the fence could not
tell a handled update from a lost one. :func:`adopt` gives such a bot an ``_exec_task`` of its own that, on a
thread running a fence attempt (:func:`~telegram_fence.runtime.attempt.current_attempt`), runs the task right
there, as a ``threaded=False`` bot does (an exception the bot's ``exception_handler`` does not take propagates to
the fence: retry, exhaustion); on any other thread it hands the task to telebot's own path unchanged. So the
fence's workers run every handler and telebot's pool never gets one. The function it returns takes the change
back (the fence calls it in ``join()``). Uses telebot's ``threaded`` and ``exception_handler`` attributes and
the ``_exec_task`` method name (4.x). May import ``runtime.attempt`` and the standard library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .attempt import current_attempt

__all__ = ["adopt"]


def adopt(bot: Any) -> Callable[[], None]:
    """Make ``bot``'s handlers run on the calling fence thread when the bot is threaded; return the undo.

    A bot that is not threaded (or has no ``_exec_task``) is left alone and the undo does nothing. Thread
    safety: call it and the undo from the fence's owner thread; the installed method is safe on any thread.
    """
    if not getattr(bot, "threaded", False) or not callable(getattr(type(bot), "_exec_task", None)):
        return lambda: None
    telebots_own = type(bot)._exec_task

    def exec_task(task: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if current_attempt() is None:  # not a fence thread: telebot's path (its worker pool)
            telebots_own(bot, task, *args, **kwargs)
            return
        try:
            task(*args, **kwargs)
        except Exception as exc:
            handler = getattr(bot, "exception_handler", None)
            if handler is None or not handler.handle(exc):
                raise

    bot._exec_task = exec_task

    def undo() -> None:
        if bot.__dict__.get("_exec_task") is exec_task:
            del bot._exec_task

    return undo
