"""The worker pool's decisions as plain functions of values: when to renew, scan, retry or exhaust.

One job: answer the pool's questions (timeouts, retry or exhaust, the retry delay, how often to renew and to scan)
without threads, locks or a store, so they can be tested with tables. May import only the standard library.
Thread-safe: pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = [
    "POLICY_FALLBACK_DELAY",
    "beat_interval",
    "exhausts",
    "idle_scan_interval",
    "next_wake",
    "policy_delay",
    "retry_due",
    "scan_interval",
    "timed_out",
]


def timed_out(started: float | None, now: float, handler_timeout: float) -> bool:
    """Whether a handler started at ``started`` (monotonic) has run for ``handler_timeout`` or longer."""
    return started is not None and now - started >= handler_timeout


def exhausts(delay: float | None, attempt: int, max_attempts: int) -> bool:
    """Whether a failed attempt ends the update: the policy gave no delay, or the budget is used up."""
    return delay is None or attempt >= max_attempts


#: The delay used when the retry policy raised, or answered something that is no delay (see :func:`policy_delay`).
POLICY_FALLBACK_DELAY = 60.0


def policy_delay(answer: object) -> float | None:
    """A retry policy's ``answer`` as the delay to use: ``None`` (exhaust now) or a finite number of seconds (a
    negative one waits 0 s, as :func:`retry_due` does). Anything else (NaN, an infinity, a bool, no number) raises
    ``ValueError`` naming it: an infinite delay would leave the update pending, never due, and its chat's later
    updates waiting behind it forever; NaN waited 0 s and False meant 0 s too."""
    if answer is None:
        return None
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
        raise ValueError(f"the retry policy answered {answer!r}: not a finite number of seconds, nor None")
    return float(answer)


def retry_due(now: float, delay: float) -> float:
    """When a failed update is due again: ``delay`` seconds (never negative) after ``now``.

    Raises ``TypeError``/``ValueError`` when ``delay`` is not a number.
    """
    return now + max(0.0, float(delay))


def beat_interval(lease: float) -> float:
    """Seconds between lease renewals: a third of the lease (at least 50 ms), so two renewals may fail."""
    return max(0.05, lease / 3)


def scan_interval(lease: float) -> float:
    """Seconds between the dispatcher's full scans of the backlog: a quarter lease, at most one second."""
    return min(1.0, lease / 4)


def idle_scan_interval(lease: float) -> float:
    """Seconds between full scans while the pool holds nothing: a quarter lease, at most five seconds.

    What only a scan finds then (claims of a dead process lapsing, another process's retries) waits at
    most this long after it became due; this pool's own retries are waited for exactly.
    """
    return min(5.0, lease / 4)


def next_wake(deadlines: Iterable[float | None], now: float) -> float | None:
    """Seconds to wait until the earliest of ``deadlines`` (monotonic; ``None`` ones ignored), at least 0;
    ``None`` when there is none (wait until woken)."""
    due = [d for d in deadlines if d is not None]
    return None if not due else max(0.0, min(due) - now)


