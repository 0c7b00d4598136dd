"""The worker pool's decisions as plain functions of values: how much to claim, inline or not, when to retry.

One job: answer the pool's questions (queue depth, inline mode, settle hold, stalls, timeouts, retry
or exhaust, which claims to keep, where work may still be) without threads, locks or a store, so
they can be tested with tables. May import only the standard library. Thread-safe: pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

__all__ = [
    "FETCH_WAIT",
    "INLINE_BUDGET",
    "INLINE_CLIP",
    "INLINE_MAX",
    "INLINE_ROUND",
    "INLINE_RUN",
    "INLINE_STALL",
    "POLICY_FALLBACK_DELAY",
    "QUEUE_SECONDS",
    "SETTLE_HOLD",
    "average",
    "beat_interval",
    "exhausts",
    "first_of_each",
    "idle_scan_interval",
    "inline_mode",
    "next_wake",
    "one_per_chat",
    "policy_delay",
    "retry_due",
    "scan_interval",
    "settle_hold",
    "stalled",
    "target",
    "timed_out",
    "typical",
    "unserved",
]

#: Handler time the claimed-but-unstarted queue should hold per worker (see :func:`target`).
QUEUE_SECONDS = 0.004
#: Handlers faster than this on average run on the dispatcher itself (see :func:`inline_mode`).
INLINE_MAX = 0.0005
#: One run counts for at most this much in the average that decides inline mode (see :func:`typical`).
INLINE_CLIP = 2 * INLINE_MAX
#: Handler time one inline round may spend before the rest of its claims go to the workers.
INLINE_BUDGET = 0.05
#: An inline handler running longer than this hands the dispatcher's job to a new thread.
INLINE_STALL = 0.2
#: Claims per inline round, and consecutive updates of one chat claimed at once for it.
INLINE_ROUND = 256
#: In inline mode, how long finished attempts wait for the poller's next batch to be settled with it.
SETTLE_HOLD = 0.02
#: In inline mode, how long the dispatcher waits for the poller to send its next request.
FETCH_WAIT = 0.002
#: In inline mode, consecutive updates of one chat claimed at once.
INLINE_RUN = 16

T = TypeVar("T")


def inline_mode(handler_time: float) -> bool:
    """Whether the dispatcher runs the handlers itself: they are measured (> 0) and take at most ``INLINE_MAX``.

    Handing each update to a worker thread then costs more than the handler (thread switches, and
    the interpreter lock taken back after every SQL statement).
    """
    return 0 < handler_time <= INLINE_MAX


def target(handler_time: float, batch: int, workers: int, *, inline: bool | None = None) -> int:
    """How many attempts to hold (queued + running): enough queued work for about ``QUEUE_SECONDS``.

    Fast handlers get a deep queue (many updates per transaction, at most ``batch`` per worker);
    slow ones one spare per pool, so claimed-but-unstarted updates never hold chats that an idle
    worker could serve. In inline mode (``inline``; by default ``inline_mode(handler_time)``), ``INLINE_ROUND``.
    An unmeasured ``handler_time`` (<= 0) counts as fast.
    """
    if inline_mode(handler_time) if inline is None else inline:
        return INLINE_ROUND
    per_worker = batch if handler_time <= 0 else int(QUEUE_SECONDS / handler_time)
    per_worker = max(1, min(batch, per_worker))
    return workers * per_worker + 1


def settle_hold(handler_time: float, finished_at: float, now: float) -> float:
    """How much longer finished attempts may wait for the poller's next batch (<= 0: settle now).

    Only in inline mode, where the batch is usually on its way and settling with it costs no commit
    of its own; otherwise 0.
    """
    if not inline_mode(handler_time):
        return 0.0
    return SETTLE_HOLD - (now - finished_at)


def average(previous: float, elapsed: float) -> float:
    """The running average of handler time after one more run of ``elapsed`` (the first run sets it)."""
    return elapsed if previous <= 0 else 0.8 * previous + 0.2 * elapsed


def typical(previous: float, elapsed: float) -> float:
    """The average that decides inline mode after one more run of ``elapsed``: :func:`average` of the runs, each
    counted for at most ``INLINE_CLIP``.

    A fast handler's run that the machine slowed down (its thread preempted for a scheduler slice of a few
    milliseconds on a busy host) moves it to less than ``INLINE_MAX``: fast handlers stay on the dispatcher.
    A handler that became slow runs on the workers after three slow runs in a row.
    """
    return average(previous, min(elapsed, INLINE_CLIP))


def stalled(started: float | None, now: float) -> bool:
    """Whether an inline handler started at ``started`` (monotonic) has run for ``INLINE_STALL`` or longer."""
    return started is not None and now - started >= INLINE_STALL


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


def one_per_chat(items: Sequence[T], chat_of: Callable[[T], int | None]) -> tuple[list[T], list[T]]:
    """Split ``items`` (in order) into the first of each chat, and the later ones of a chat already kept.

    Items without a chat (``chat_of`` gives ``None``) are always kept.
    """
    seen: set[int] = set()
    kept: list[T] = []
    rest: list[T] = []
    for item in items:
        chat = chat_of(item)
        if chat is not None and chat in seen:
            rest.append(item)
            continue
        if chat is not None:
            seen.add(chat)
        kept.append(item)
    return kept, rest


def unserved(
    chats: set[int], chatless: set[int], claimed_chats: Iterable[Hashable], claimed_ids: Iterable[int], runs: bool
) -> tuple[set[int], set[int]]:
    """The hinted chats and chatless updates that stay candidates after a round cut off by its room.

    A chat that got a claim is served, unless the round claimed runs (several updates of a chat at
    once: the chat may hold more). A chatless update is served when it was claimed.
    """
    taken = set() if runs else set(claimed_chats)
    return chats - taken, chatless - set(claimed_ids)


def first_of_each(updates: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``updates`` without the later items of a repeated ``update_id`` (the store keeps the first)."""
    seen: set[int] = set()
    first = []
    for update in updates:
        if update["update_id"] not in seen:
            seen.add(update["update_id"])
            first.append(update)
    return first
