"""Retry decisions as plain functions: table-driven, no I/O."""

from __future__ import annotations

import math

import pytest
import requests
from telebot import apihelper

from telegram_fence.errors import MessageRefused, RecipientGone, RetryAfter, Transient
from telegram_fence.retry import (
    MAX_RETRY_AFTER_WAIT,
    backoff,
    default_retry,
    poll_backoff,
    retry_after_wait,
    telegram_cause,
)


def api_error(code: int, description: str, retry_after: int | None = None) -> apihelper.ApiTelegramException:
    body: dict[str, object] = {"ok": False, "error_code": code, "description": description}
    if retry_after is not None:
        body["parameters"] = {"retry_after": retry_after}
    return apihelper.ApiTelegramException("sendMessage", None, body)


@pytest.mark.parametrize(
    ("attempt", "rng", "expected"),
    [
        (1, 0.5, 5.0),
        (2, 0.5, 20.0),
        (3, 0.5, 80.0),
        (4, 0.5, 320.0),
        (5, 0.5, 900.0),
        (9, 0.5, 900.0),
        (1, 0.0, 4.0),
        (1, 0.999999, 6.0),
    ],
)
def test_backoff_table(attempt: int, rng: float, expected: float) -> None:
    """backoff() grows 5 s * 4^(n-1), caps at 15 minutes, and jitters by at most ±20%."""
    assert backoff(attempt, rng=lambda: rng) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    ("error", "expect_none"),
    [
        (api_error(400, "Bad Request: message is too long"), True),
        (api_error(400, "Bad Request: can't parse entities: unclosed tag"), True),
        (api_error(403, "Forbidden: bot was blocked by the user"), True),
        (api_error(400, "Bad Request: chat not found"), True),
        (api_error(500, "Internal Server Error"), False),
        (requests.exceptions.ConnectionError("connection refused"), False),
        (ValueError("a bug in the handler"), False),
    ],
)
def test_default_policy_exhausts_only_what_repeating_cannot_fix(error: BaseException, expect_none: bool) -> None:
    """Refusals of the message and gone recipients are exhausted at once; everything else backs off."""
    delay = default_retry(error, 1)
    assert (delay is None) is expect_none
    if not expect_none:
        assert delay is not None and 4.0 <= delay <= 6.0


def test_default_policy_waits_at_least_retry_after() -> None:
    """A 429 raised by a handler waits at least Telegram's retry_after, even on the first attempt."""
    assert default_retry(api_error(429, "Too Many Requests", retry_after=120), 1) >= 120
    assert default_retry(api_error(429, "Too Many Requests", retry_after=1), 3) >= 64


def test_telegram_cause_follows_the_cause_chain() -> None:
    """A telebot error wrapped by the handler (raise … from exc) is still classified."""
    try:
        try:
            raise api_error(403, "Forbidden: user is deactivated")
        except apihelper.ApiTelegramException as exc:
            raise RuntimeError("could not notify the user") from exc
    except RuntimeError as wrapped:
        assert isinstance(telegram_cause(wrapped), RecipientGone)
    assert telegram_cause(ValueError("plain")) is None
    assert isinstance(telegram_cause(MessageRefused("too long")), MessageRefused)
    assert isinstance(telegram_cause(RetryAfter(3)), RetryAfter)
    assert isinstance(telegram_cause(Transient("reset")), Transient)


@pytest.mark.parametrize(
    ("failures", "low", "high"),
    [(1, 0.25, 0.5), (2, 0.5, 1.0), (6, 8.0, 16.0), (7, 15.0, 30.0), (50, 15, 30)],
)
def test_poll_backoff_bounds(failures: int, low: float, high: float) -> None:
    """The poller's delay doubles from 0.5 s to a 30 s ceiling and stays in the upper half of it."""
    assert low <= poll_backoff(failures, rng=lambda: 0.0) <= high
    assert low <= poll_backoff(failures, rng=lambda: 0.999) <= high


@pytest.mark.parametrize(
    ("attempt", "base", "cap", "factor", "expected"),
    [(0, 1.0, 10.0, 2.0, 0.0), (1, 1.0, 10.0, 2.0, 1.0), (3, 1.0, 10.0, 2.0, 4.0), (5, 1.0, 10.0, 2.0, 10.0),
     (2, 5.0, 900.0, 4.0, 20.0), (10_000, 0.5, 30.0, 2.0, 30.0)],
)
def test_exponential_table(attempt: int, base: float, cap: float, factor: float, expected: float) -> None:
    """The shared growth rule: nothing before a failure, base * factor^(n-1) after, never above cap or overflowing."""
    from telegram_fence.retry import exponential

    assert exponential(attempt, base, cap, factor) == expected


@pytest.mark.parametrize(
    ("asked", "waited"),
    [
        (7.0, 7.0),
        (0.0, 0.0),
        (-5.0, 0.0),
        (600.0, 600.0),
        (1e9, 600.0),
        (math.inf, 600.0),
        (-math.inf, 0.0),
        (math.nan, 1.0),
    ],
)
def test_retry_after_wait_caps_absurd_values(asked: float, waited: float) -> None:
    """A retry_after is waited as asked inside [0, 600] s; beyond the cap (infinity too) the cap, below 0 none,
    NaN 1 s."""
    assert MAX_RETRY_AFTER_WAIT == 600.0
    assert retry_after_wait(asked) == waited


@pytest.mark.parametrize("asked", [1e9, math.inf, math.nan])
def test_default_retry_never_waits_an_absurd_retry_after(asked: float) -> None:
    """A handler's 429 with a retry_after of years, infinity or NaN is retried after a finite, capped delay."""
    delay = default_retry(RetryAfter(asked), 1)
    assert delay is not None and math.isfinite(delay) and 0 <= delay <= 900 * 1.2
