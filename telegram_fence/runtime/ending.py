"""How the fence ends: on its own, once, with the first reason (told to the log, the operator channel and
``on_ended``), and after a stop, in which order its parts end and the bound each gets.

:class:`Ending` may be used from any thread; the shutdown functions are the joining thread's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..telegram import mask_tokens
from ..textlog import IN_MESSAGE
from .settings import OperatorPost

if TYPE_CHECKING:
    from ..calls.journaled import CallJournal
    from ..ingress.poller import Poller
    from ..ingress.webhook_door import WebhookDoor
    from .exhaustions import ExhaustionDelivery
    from .metrics_http import HealthService
    from .pool import WorkerPool

__all__ = ["Ending", "end_unjoined", "join_parts", "say_waiting", "warn_running"]


class Ending:
    """Ends the fence once; ``reason`` is ``None`` until then, and afterwards the first reason given."""

    def __init__(self, *, operator: OperatorPost | None, on_ended: Callable[[str], Any] | None,
                 stop: Callable[[], None], log: logging.Logger) -> None:
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
        # The reason in the message too: a handler of the program's own shows no fields.
        self._log.critical("%s ended: %s", what, reason, extra={"reason": reason, IN_MESSAGE: ("reason",)})
        self.tell_operator(f"telegram_fence: the {what} ended: {reason}")
        if self._on_ended is not None:
            try:
                self._on_ended(reason)
            except Exception:
                self._log.error("on_ended raised", exc_info=True)
        self._stop()

    def tell_operator(self, text: str) -> None:
        """Post ``text`` (tokens masked) to the operator channel, if any. Never raises."""
        if self._operator is not None:
            try:
                self._operator.post(mask_tokens(text))
            except Exception:
                self._log.error("the operator channel refused a message", exc_info=True)


def end_unjoined(calls: CallJournal | None, outbox: Any, webhook: WebhookDoor) -> None:
    """The stopped pool ended its threads on its own: tell the other threads to end, without waiting, but
    ``metrics=``'s server (it answers until the join). Called on the pool's heartbeat thread."""
    if calls is not None:
        calls.stop_resending(0)  # the calls it still had stay queued for the next start
    if outbox is not None:
        outbox.stop()
    webhook.stop_threads()


def join_parts(timeout: float, *, grace: float, pool: WorkerPool | None, calls: CallJournal | None, outbox: Any,
               exhaustions: ExhaustionDelivery, poller: Poller | None, webhook: WebhookDoor, health: HealthService,
               reason: Callable[[], str | None], end_generation: bool, log: logging.Logger) -> bool:
    """End the parts of a stopped fence, in order, within ``timeout`` seconds; ``True`` when every thread ended (a
    part that overran its bound makes it ``False``; the later parts are still asked to end).

    The running handlers get ``grace`` (``shutdown_timeout``); then the call journal's resend thread, the outbox,
    the exhaustion delivery (the journal stops only when all of those ended); the poller, its generation ended with
    ``reason()`` (``"clean stop"``) when ``end_generation``; the webhook door; ``metrics=``'s server last.
    """
    deadline = time.monotonic() + timeout
    ok = True
    if pool is not None:
        ok = pool.join(min(grace, timeout)) and ok
        if pool.running():
            warn_running(log, pool, grace, "%d handler(s) still running after shutdown_timeout=%g s abandoned: "
                         "their updates run again on the next start, once their lease lapsed")
    if calls is not None:
        ok = calls.stop_resending(max(0.1, deadline - time.monotonic())) and ok
    if outbox is not None:
        outbox.stop()
        ok = outbox.join(max(0.1, deadline - time.monotonic())) and ok
    ok = exhaustions.join(max(0.1, deadline - time.monotonic())) and ok
    if calls is not None and ok:
        calls.stop()
    if poller is not None:
        ok = poller.finish(deadline, log) and ok
        if end_generation:
            poller.end_generation(reason() or "clean stop")
    ok = webhook.close(max(0.1, deadline - time.monotonic()), reason=reason() or "clean stop") and ok
    return health.stop(max(0.1, deadline - time.monotonic())) and ok


def warn_running(log: logging.Logger, pool: WorkerPool | None, grace: float, message: str, *,
                 timeout_first: bool = False) -> None:
    """Warn about the handlers still running in ``pool`` (``message`` takes their count and ``grace``, in that order
    unless ``timeout_first``)."""
    running = pool.running() if pool is not None else 0
    fields = {"running": running, "shutdown_timeout": grace, IN_MESSAGE: ("running", "shutdown_timeout")}
    log.warning(message, *((grace, running) if timeout_first else (running, grace)), extra=fields)


def say_waiting(log: logging.Logger, pool: WorkerPool | None, grace: float) -> None:
    """A second into ``run()``'s shutdown: a warning when handlers still run, so the wait is explained."""
    if pool is not None and pool.running():
        warn_running(log, pool, grace, "stopping: waiting (shutdown_timeout=%g s) for %d running handler(s); a second "
                     "Ctrl-C (SIGINT/SIGTERM) stops at once", timeout_first=True)
