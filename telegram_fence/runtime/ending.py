"""How the fence ends on its own: once, with the first reason (tokens masked), logged, told to the
operator channel and ``on_ended``, then a stop; and the operator channel that never takes its caller down.

May import the standard library, ``telegram`` and ``textlog`` (level 1) and ``runtime.settings`` (the operator's
protocol). Thread safety: :class:`Ending` may be used from any thread (the poller, the pool's threads, the webhook
watch may all end the fence at once).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..telegram import mask_tokens
from ..textlog import IN_MESSAGE
from .settings import OperatorPost

__all__ = ["Ending"]


class Ending:
    """Ends the fence once; ``reason`` is ``None`` until then, and afterwards the first reason given."""

    def __init__(
        self,
        *,
        operator: OperatorPost | None,
        on_ended: Callable[[str], Any] | None,
        stop: Callable[[], None],
        log: logging.Logger,
    ) -> None:
        self._operator = operator
        self._on_ended = on_ended
        self._stop = stop
        self._log = log
        self._lock = threading.Lock()
        self._reason: str | None = None

    @property
    def reason(self) -> str | None:
        """Why the fence ended on its own (tokens masked), or ``None``."""
        return self._reason

    def end(self, what: str, reason: str) -> None:
        """End the fence on its own, once: keep the first reason (tokens masked), log it, tell the operator and
        ``on_ended``, stop. ``what`` names the part that could not go on. Never raises."""
        reason = mask_tokens(reason)
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
        # The reason in the message too: a handler of the program's own (basicConfig, a WSGI server's) shows no
        # fields, and this is the line that says why the bot stopped. Text lines leave the field out (IN_MESSAGE).
        self._log.critical("%s ended: %s", what, reason, extra={"reason": reason, IN_MESSAGE: ("reason",)})
        self.tell_operator(f"telegram_fence: the {what} ended: {reason}")
        if self._on_ended is not None:
            try:
                self._on_ended(reason)
            except Exception:
                self._log.error("on_ended raised", exc_info=True)
        self._stop()

    def tell_operator(self, text: str) -> None:
        """Post ``text`` (tokens masked) to the operator channel, if any. Never raises: a broken channel
        must not take the thread that reports through it down with it."""
        if self._operator is not None:
            try:
                self._operator.post(mask_tokens(text))
            except Exception:
                self._log.error("the operator channel refused a message", exc_info=True)
