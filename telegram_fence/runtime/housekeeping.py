"""The fence's housekeeping, run on the heartbeat: the poller watchdog and pruning of old rows; and, at start, the
release of the claims of a process that is gone.

Plain logic over the poller's ``call_started`` and the store; it keeps no thread of its own and returns the
monotonic time it wants to run again (the heartbeat sleeps until then). May import the outbox's and the conversations'
pruning, the poller's type, ``store`` (types), ``runtime.capabilities`` and the standard library (layer 3,
runtime).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from ..conversation.backends import STEP_RETENTION, prune_steps
from ..ingress.poller import Poller
from ..store import UpdateStore
from .capabilities import StoreCapabilities

__all__ = ["Housekeeping", "release_dead_claims"]


class Housekeeping:
    """The watchdog over a stuck ``getUpdates`` and the pruning of settled rows and delivered captures.

    ``store``: what the fence's store offers (rows are pruned on its clock; next-step registrations and delivered
    captures through its ``write``); ``poller()`` gives the current poller (or
    ``None``); ``on_stuck(reason)`` ends the fence when a long poll outlived ``long_poll + watchdog_margin``.
    ``write(fn)`` runs a store write ``fn`` (the fence's: done by its pool's writer, the dispatcher thread).
    Called from the heartbeat thread only; not for sharing.
    """

    def __init__(
        self,
        store: StoreCapabilities,
        *,
        retention: float,
        long_poll: float,
        watchdog_margin: float,
        captures: bool,
        conversations: bool = False,
        poller: Callable[[], Poller | None],
        stopping: Callable[[], bool],
        tell: Callable[[str], None],
        on_stuck: Callable[[str], None],
        log: logging.Logger,
        write: Callable[[Callable[[], int]], int] = lambda fn: fn(),
    ) -> None:
        self._store = store
        self._write = write
        self._retention = retention
        self._limit = long_poll + watchdog_margin
        self._captures = captures
        self._conversations = conversations
        self._poller = poller
        self._stopping = stopping
        self._tell = tell
        self._on_stuck = on_stuck
        self._log = log
        self._last_prune = -math.inf  # the first tick prunes (monotonic time may start near 0: a fresh boot)

    def tick(self) -> float:
        """The watchdog and, when due, pruning; returns when (monotonic) to be called again."""
        now = time.monotonic()
        prune_every = min(600.0, max(1.0, self._retention / 10))
        limit = self._limit
        poller = self._poller()
        # The watchdog looks again just after the call in hand (or one starting now) passed its limit.
        next_look = now + limit
        if poller is not None and not self._stopping():
            started = poller.call_started
            if started is not None and now - started > limit:
                self._tell(f"telegram_fence watchdog: getUpdates has not returned for {limit:.0f} s")
                self._on_stuck(f"watchdog: getUpdates has not returned for more than {limit:.0f} s")
                return now + prune_every
            if started is not None:
                next_look = started + limit + 0.01
        if now - self._last_prune >= prune_every:
            self._last_prune = now
            self.prune()
        return min(next_look, self._last_prune + prune_every)

    def prune(self) -> None:
        """Delete settled rows and delivered captures older than ``retention``. Never raises: a failure is
        logged and the next tick tries again."""
        try:
            before = self._store.store.clock() - self._retention
        except Exception:
            self._log.warning("pruning failed: the store's clock raised", exc_info=True)
            return
        try:
            store = self._store.store
            pruned = self._write(lambda: store.prune(before))
            if pruned:
                self._log.info("pruned finished updates", extra={"pruned": pruned})
        except Exception:
            self._log.warning("pruning failed", exc_info=True)
        writes = self._store.store
        if self._conversations:
            try:
                steps_before = time.time() - STEP_RETENTION
                pruned = self._write(lambda: prune_steps(writes, steps_before))
                if pruned:
                    self._log.info("pruned next-step and reply handlers never taken", extra={"pruned": pruned})
            except Exception:
                self._log.warning("pruning old next-step and reply handlers failed", exc_info=True)
        if not self._captures or writes is None:
            return  # no captures are written into this store
        from ..delivery.outbox import prune_delivered  # only a fence that captures loads the outbox

        try:
            pruned = self._write(lambda: prune_delivered(writes, before))
            if pruned:
                self._log.info("pruned delivered captures", extra={"pruned": pruned})
        except Exception:
            self._log.warning("pruning delivered captures failed", exc_info=True)


def release_dead_claims(store: UpdateStore, log: logging.Logger) -> None:
    """At start: end the live claims of processes of this host that are gone (a killed run of this bot), so their
    updates run now instead of after their leases; said at WARNING with how many and whose. When the store fails
    here the leases stay the bound (the failure is logged)."""
    try:
        released = store.release_dead_claims()
    except Exception:
        log.warning("could not look for the claims of a process that is gone; they run after their leases",
                    exc_info=True)
        return
    for owner, count in released.items():
        pid = int(owner.split(".")[1], 16)
        log.warning("released %s claim(s) of process %s, which is gone; their updates run now", count, pid,
                    extra={"claims": count, "owner_pid": pid})
