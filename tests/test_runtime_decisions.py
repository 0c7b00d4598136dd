"""The worker pool's decisions (telegram_fence.runtime.decisions), table-driven, without threads or a store."""

from __future__ import annotations

import re

import pytest

from telegram_fence.runtime import decisions as d


@pytest.mark.parametrize(
    ("started", "now", "timeout", "expired"),
    [(None, 100.0, 1.0, False), (10.0, 10.5, 1.0, False), (10.0, 11.0, 1.0, True), (10.0, 12.0, 1.0, True)],
)
def test_timed_out_at_handler_timeout(started: float | None, now: float, timeout: float, expired: bool) -> None:
    """A handler is timed out once it ran handler_timeout or longer; one not started never."""
    assert d.timed_out(started, now, timeout) is expired


@pytest.mark.parametrize(
    ("delay", "attempt", "max_attempts", "exhausted"),
    [(None, 1, 5, True), (1.0, 1, 5, False), (1.0, 4, 5, False), (1.0, 5, 5, True), (0.0, 6, 5, True),
     (0.0, 1, 1, True)],
)
def test_exhausts_without_a_delay_or_budget(delay: float | None, attempt: int, max_attempts: int,
                                            exhausted: bool) -> None:
    """A failure ends the update when the policy gives no delay or the attempt was the last allowed."""
    assert d.exhausts(delay, attempt, max_attempts) is exhausted


@pytest.mark.parametrize(("now", "delay", "due"), [(100.0, 5.0, 105.0), (100.0, -3.0, 100.0), (100.0, 0, 100.0)])
def test_retry_due_never_in_the_past(now: float, delay: float, due: float) -> None:
    """A retry is due ``delay`` seconds after now, a negative delay counting as none."""
    assert d.retry_due(now, delay) == due


def test_retry_due_refuses_a_delay_that_is_not_a_number() -> None:
    """A retry policy's non-numeric delay raises (the worker then logs and leaves the update to its lease)."""
    with pytest.raises((TypeError, ValueError)):
        d.retry_due(0.0, "soon")  # type: ignore[arg-type]


@pytest.mark.parametrize(("answer", "delay"), [(None, None), (5, 5.0), (2.5, 2.5), (-3.0, -3.0), (0, 0.0)])
def test_a_retry_policys_delay_is_none_or_a_finite_number(answer: object, delay: float | None) -> None:
    """``None`` (exhaust now) and finite numbers are the policy's delay as they are (``retry_due`` clamps at 0)."""
    assert d.policy_delay(answer) == delay


@pytest.mark.parametrize("answer", [float("nan"), float("inf"), float("-inf"), True, False, "5", [5]], ids=repr)
def test_a_retry_policys_answer_that_is_no_delay_is_refused_by_name(answer: object) -> None:
    """NaN, an infinity, a bool or no number is refused with a ValueError naming it (the worker then logs that line
    and waits POLICY_FALLBACK_DELAY): an infinite delay would leave the update pending and never due."""
    with pytest.raises(ValueError, match=re.escape(f"the retry policy answered {answer!r}: not a finite number")):
        d.policy_delay(answer)


@pytest.mark.parametrize(("lease", "beat", "scan"), [(30.0, 10.0, 1.0), (2.0, 2 / 3, 0.5), (0.09, 0.05, 0.0225)])
def test_beat_and_scan_intervals_follow_the_lease(lease: float, beat: float, scan: float) -> None:
    """Renewals come every third of a lease (at least 50 ms), full scans every quarter (at most 1 s)."""
    assert d.beat_interval(lease) == pytest.approx(beat)
    assert d.scan_interval(lease) == pytest.approx(scan)


@pytest.mark.parametrize(("lease", "idle"), [(30.0, 5.0), (8.0, 2.0), (2.0, 0.5), (1.0, 0.25)])
def test_idle_scans_are_rarer_but_never_rarer_than_busy_ones_need(lease: float, idle: float) -> None:
    """An idle pool scans every quarter lease up to 5 s, never more often than a busy one."""
    assert d.idle_scan_interval(lease) == pytest.approx(idle)
    assert d.idle_scan_interval(lease) >= d.scan_interval(lease)


@pytest.mark.parametrize(
    ("deadlines", "now", "wait"),
    [([], 10.0, None), ([None, None], 10.0, None), ([12.0, None, 11.0], 10.0, 1.0), ([9.0, 30.0], 10.0, 0.0)],
)
def test_next_wake_waits_for_the_earliest_deadline(deadlines: list[float | None], now: float,
                                                   wait: float | None) -> None:
    """The wait runs to the earliest deadline (none: until woken), never negative."""
    assert d.next_wake(deadlines, now) == wait
