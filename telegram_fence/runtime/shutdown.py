"""The fence's shutdown: the order in which its started parts end after a stop, the bound each gets, and the warnings
about handlers still running.

May import the standard library and level 0-3 modules of telegram_fence (the parts it ends only for type checking).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..textlog import IN_MESSAGE

if TYPE_CHECKING:
    from ..calls.journaled import CallJournal
    from ..ingress.poller import Poller
    from ..ingress.webhook_door import WebhookDoor
    from .exhaustions import ExhaustionDelivery
    from .metrics_http import HealthService
    from .pool import WorkerPool

__all__ = ["end_unjoined", "join_parts", "say_waiting", "warn_running"]


def end_unjoined(calls: CallJournal | None, outbox: Any, webhook: WebhookDoor) -> None:
    """The stopped pool ended its threads on its own (no handler runs): the other threads the join would end are
    told to end, without waiting, but ``metrics=``'s server: ``/livez`` and ``/readyz`` answer until the join (a
    fence that ended on its own says why there, to whoever watches it). Called on the pool's heartbeat thread."""
    if calls is not None:
        calls.stop_resending(0)  # the calls it still had stay queued for the next start
    if outbox is not None:
        outbox.stop()
    webhook.stop_threads()


def join_parts(
    timeout: float,
    *,
    grace: float,
    pool: WorkerPool | None,
    calls: CallJournal | None,
    outbox: Any,
    exhaustions: ExhaustionDelivery,
    poller: Poller | None,
    webhook: WebhookDoor,
    health: HealthService,
    reason: Callable[[], str | None],
    end_generation: bool,
    log: logging.Logger,
) -> bool:
    """End the parts of a stopped fence, in order, within ``timeout`` seconds from now; ``True`` when every thread
    ended (a part that did not end in its bound makes it ``False``; the later parts are still asked to end).

    The running handlers get ``grace`` seconds (``shutdown_timeout``; a warning names those abandoned); then the call
    journal's resend thread (no handler hands it more now), the outbox, the exhaustion delivery; the journal itself
    is stopped only when everything before it ended. The poller is finished, and with ``end_generation`` its
    generation ended with ``reason()`` (``"clean stop"`` when ``None``, read at that moment: a watchdog end counts).
    The webhook door closes (later deliveries answer 503), then ``metrics=``'s server, last: ``/metrics`` and
    ``/readyz`` (stopping) answer during the shutdown, not after it. Not thread-safe: the joining thread's.
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
    """A warning of the shutdown about the handlers still running in ``pool`` (``message`` takes their count and
    ``grace``, the ``shutdown_timeout``, in that order unless ``timeout_first``); JSON lines get both as fields."""
    running = pool.running() if pool is not None else 0
    fields = {"running": running, "shutdown_timeout": grace, IN_MESSAGE: ("running", "shutdown_timeout")}
    log.warning(message, *((grace, running) if timeout_first else (running, grace)), extra=fields)


def say_waiting(log: logging.Logger, pool: WorkerPool | None, grace: float) -> None:
    """A second into ``run()``'s shutdown: a warning when handlers still run, so the wait is explained."""
    if pool is not None and pool.running():
        warn_running(log, pool, grace, "stopping: waiting (shutdown_timeout=%g s) for %d running handler(s); a second "
                     "Ctrl-C (SIGINT/SIGTERM) stops at once", timeout_first=True)
