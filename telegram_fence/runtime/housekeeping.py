"""The fence's housekeeping, run on the heartbeat: the poller watchdog and pruning of old rows."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from ..conversation.backends import STEP_RETENTION, prune_steps
from ..ingress.poller import Poller
from ..store import UpdateStore

__all__ = ["Housekeeping", "release_dead_claims"]


class Housekeeping:
    """The watchdog over a stuck ``getUpdates`` and the pruning of settled rows, next-step handlers and delivered
    captures. ``poller()`` gives the current poller (or ``None``); ``on_stuck(reason)`` ends the fence when a long
    poll outlived ``long_poll + watchdog_margin``; ``write(fn)`` runs a store write (through the writer). Called
    from the heartbeat thread only.
    """

    def __init__(
        self,
        store: UpdateStore,
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
        """Delete settled rows and delivered captures older than ``retention``. Never raises (logged)."""
        try:
            before = self._store.clock() - self._retention
        except Exception:
            self._log.warning("pruning failed: the store's clock raised", exc_info=True)
            return
        try:
            store = self._store
            pruned = self._write(lambda: store.prune(before))
            if pruned:
                self._log.info("pruned finished updates", extra={"pruned": pruned})
        except Exception:
            self._log.warning("pruning failed", exc_info=True)
        writes = self._store
        if self._conversations:
            try:
                steps_before = time.time() - STEP_RETENTION
                pruned = self._write(lambda: prune_steps(writes, steps_before))
                if pruned:
                    self._log.info("pruned next-step and reply handlers never taken", extra={"pruned": pruned})
            except Exception:
                self._log.warning("pruning old next-step and reply handlers failed", exc_info=True)
        if not self._captures:
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
    updates run now instead of after their leases. Never raises (logged)."""
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
