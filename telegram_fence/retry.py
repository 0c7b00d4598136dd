"""Retry decisions as plain functions of values.

A retry policy is ``fn(error, attempt) -> seconds | None``: the wait before the next attempt, or ``None`` to
exhaust the update now. The fence also exhausts it once ``attempt`` reaches ``max_attempts``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import requests
from telebot import apihelper

from .errors import (
    CallMismatch,
    CallUncertain,
    MessageRefused,
    RecipientGone,
    RetryAfter,
    StepNotStorable,
    StepUncertain,
    TelegramError,
)
from .telegram import causes, classify

__all__ = [
    "MAX_RETRY_AFTER_WAIT", "RetryPolicy", "backoff", "default_retry", "exponential", "poll_backoff",
    "retry_after_wait", "telegram_cause"
]

RetryPolicy = Callable[[BaseException, int], "float | None"]

#: The longest single wait the library honours for a 429's ``retry_after`` (asking again after it is harmless; a
#: hostile or broken value must not park a thread).
MAX_RETRY_AFTER_WAIT = 600.0
#: The wait for a ``retry_after`` that is not a number at all (NaN): Telegram's own smallest wait.
_UNKNOWN_RETRY_AFTER = 1.0

_TELEGRAM_TYPES: tuple[type[BaseException], ...] = (
    TelegramError,
    apihelper.ApiException,
    requests.exceptions.RequestException,
)


def exponential(attempt: int, base: float, cap: float, factor: float = 2.0) -> float:
    """``base * factor**(attempt-1)`` seconds after failed attempt ``attempt`` (1-based), at most ``cap``; 0 before any.
    The one growth rule behind every wait in the library."""
    if attempt < 1:
        return 0.0
    return min(cap, base * factor ** min(attempt - 1, 60))


def backoff(
    attempt: int,
    *,
    base: float = 5.0,
    factor: float = 4.0,
    cap: float = 900.0,
    jitter: float = 0.2,
    rng: Callable[[], float] = random.random,
) -> float:
    """Exponential delay after failed attempt number ``attempt`` (1-based): 5 s, 20 s, 80 s, … capped, spread by up
    to ±``jitter`` so updates that failed together do not retry together (``rng``: values in [0, 1))."""
    delay = exponential(max(attempt, 1), base, cap, factor)
    spread = delay * jitter * (2.0 * rng() - 1.0)
    return max(0.0, min(cap * (1 + jitter), delay + spread))


def retry_after_wait(seconds: float) -> float:
    """The wait to honour for a 429 that asked for ``seconds``, in ``[0, MAX_RETRY_AFTER_WAIT]`` (NaN or no number:
    1 s). Never raises."""
    try:
        value = float(seconds)
    except (TypeError, ValueError, OverflowError):
        return _UNKNOWN_RETRY_AFTER
    if math.isnan(value):
        return _UNKNOWN_RETRY_AFTER
    return min(max(value, 0.0), MAX_RETRY_AFTER_WAIT)


def telegram_cause(error: BaseException) -> TelegramError | None:
    """The classified Bot API failure behind ``error`` or its ``__cause__`` chain, or ``None``."""
    found = next((e for e in causes(error, context=False) if isinstance(e, _TELEGRAM_TYPES)), None)
    return None if found is None else classify(found)


def default_retry(error: BaseException, attempt: int) -> float | None:
    """The fence's default policy.

    - A refusal of the message itself or a recipient that is gone, a call journaled ``uncertain``
      (:class:`CallUncertain`), a call that does not match the journal (:class:`CallMismatch`), a durable step
      whose outcome is unknown (:class:`StepUncertain`) or whose result is not JSON (:class:`StepNotStorable`), here or
      as the cause of ``error``: ``None`` (exhaust now: a retry would meet the same journal);
    - a 429 raised by the handler: at least its ``retry_after`` (as :func:`retry_after_wait` caps it);
    - anything else: :func:`backoff` (5 s, 20 s, 80 s, … capped at 15 minutes, with jitter).
    """
    if _final_call(error):
        return None
    cause = telegram_cause(error)
    if isinstance(cause, (MessageRefused, RecipientGone)):
        return None
    delay = backoff(attempt)
    if isinstance(cause, RetryAfter):
        return max(retry_after_wait(cause.seconds), delay)
    return delay


def _final_call(error: BaseException) -> bool:
    """Whether ``error`` is (or was raised from) a journal answer no retry can change."""
    final = (CallUncertain, CallMismatch, StepUncertain, StepNotStorable)
    return any(isinstance(e, final) for e in causes(error, context=True))


def poll_backoff(failures: int, *, rng: Callable[[], float] = random.random) -> float:
    """Delay before the next ``getUpdates`` after ``failures`` consecutive transient failures: 0.5 s doubling to
    30 s, jittered in its upper half so restarted fleets do not stampede."""
    ceiling = exponential(max(failures, 1), 0.5, 30.0)
    return ceiling / 2 + (ceiling / 2) * rng()
