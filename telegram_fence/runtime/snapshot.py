"""The fence's ``stats()`` snapshot, as a function of its parts: the store, the poller, the pool.

May import the standard library, ``store`` and ``telegram`` (level 1) and ``ingress`` (level 2). Reads only: safe
from any thread, as the parts' own counters are.
"""

from __future__ import annotations

import time
from typing import Any

from ..ingress.poller import Poller
from ..store import UpdateStore
from ..telegram import mask_tokens
from .pool import WorkerPool

__all__ = ["fence_stats", "fence_threads", "fence_vitals"]


def fence_stats(
    store: UpdateStore | None,
    poller: Poller | None,
    pool: WorkerPool | None,
    *,
    paused: bool,
    webhook: dict[str, Any] | None,
    ended_reason: str | None,
    stopping: bool,
    threads: dict[str, bool] | None = None,
) -> dict[str, Any]:
    """The store's counts and cursor (``store``: the fence's store as a monitored one; ``None``: no counts), the
    poller's generation and progress, the pool, the webhook, and ``threads``: whether the fence started and which
    of its threads are alive (what liveness reads).

    Never raises for a store that fails: its error (tokens masked) is kept under ``store_error``.
    """
    try:
        data: dict[str, Any] = dict(store.stats()) if store is not None else {}
    except Exception as exc:
        data = {"store_error": mask_tokens(repr(exc))}
    data["poller"] = None if poller is None else {
        "alive": poller.alive,
        "generation": poller.generation,
        "polls": poller.polls,
        "recorded": poller.recorded,
        "in_call_for": None if poller.call_started is None else time.monotonic() - poller.call_started,
        "progress_age": poller.progress_age,
        "last_error": poller.last_error,
        "paused": paused,
        "leading": poller.leading,
    }
    data["workers"] = None if pool is None else {
        "alive": pool.alive,
        "in_flight": pool.in_flight(),
        "running": pool.running(),
        **pool.counts,
    }
    data["webhook"] = webhook
    data["threads"] = threads
    data["ended_reason"] = ended_reason
    data["stopping"] = stopping
    return data


def fence_threads(started: bool, pool: WorkerPool | None, exhaustions_alive: bool) -> dict[str, bool]:
    """Whether the fence started and which of its threads are alive (the pool's, the exhaustions')."""
    return {"started": started, **(pool.threads() if pool is not None else {}), "exhaustions": exhaustions_alive}


def fence_vitals(threads: dict[str, bool], ended_reason: str | None, pool: WorkerPool | None,
                 poller: Poller | None) -> dict[str, Any]:
    """What liveness reads, without the store: the threads, the workers and poller alive, the end."""
    return {"threads": threads, "ended_reason": ended_reason,
            "workers": None if pool is None else {"alive": pool.alive},
            "poller": None if poller is None else {"alive": poller.alive}}
