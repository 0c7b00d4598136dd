"""Retry decisions as plain functions: table-driven, no I/O."""

from __future__ import annotations

import pytest
import requests
from telebot import apihelper

from telegram_fence.errors import MessageRefused, RecipientGone, RetryAfter, Transient
from telegram_fence.retry import backoff, default_retry, poll_backoff, telegram_cause


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
