"""The worker pool's decisions as functions of values (its intervals, a retry policy's answer), table-driven."""

from __future__ import annotations

import re

import pytest

from telegram_fence.runtime import outcomes, state


@pytest.mark.parametrize(("answer", "delay"), [(None, None), (5, 5.0), (2.5, 2.5), (-3.0, -3.0), (0, 0.0)])
def test_a_retry_policys_delay_is_none_or_a_finite_number(answer: object, delay: float | None) -> None:
    """``None`` (exhaust now) and finite numbers are the policy's delay as they are (a negative one waits 0 s)."""
    assert outcomes.policy_delay(answer) == delay


@pytest.mark.parametrize("answer", [float("nan"), float("inf"), float("-inf"), True, False, "5", [5]], ids=repr)
def test_a_retry_policys_answer_that_is_no_delay_is_refused_by_name(answer: object) -> None:
    """NaN, an infinity, a bool or no number is refused with a ValueError naming it (the worker then logs that line
    and waits POLICY_FALLBACK_DELAY): an infinite delay would leave the update pending and never due."""
    with pytest.raises(ValueError, match=re.escape(f"the retry policy answered {answer!r}: not a finite number")):
        outcomes.policy_delay(answer)


@pytest.mark.parametrize(("lease", "beat", "scan"), [(30.0, 10.0, 1.0), (2.0, 2 / 3, 0.5), (0.09, 0.05, 0.0225)])
def test_beat_and_scan_intervals_follow_the_lease(lease: float, beat: float, scan: float) -> None:
    """Renewals come every third of a lease (at least 50 ms), full scans every quarter (at most 1 s)."""
    assert state.beat_interval(lease) == pytest.approx(beat)
    assert state.scan_interval(lease) == pytest.approx(scan)


@pytest.mark.parametrize(("lease", "idle"), [(30.0, 5.0), (8.0, 2.0), (2.0, 0.5), (1.0, 0.25)])
def test_idle_scans_are_rarer_but_never_rarer_than_busy_ones_need(lease: float, idle: float) -> None:
    """An idle pool scans every quarter lease up to 5 s, never more often than a busy one."""
    assert state.idle_scan_interval(lease) == pytest.approx(idle)
    assert state.idle_scan_interval(lease) >= state.scan_interval(lease)
