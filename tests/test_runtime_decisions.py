"""The worker pool's decisions (telegram_fence.runtime.decisions), table-driven, without threads or a store."""

from __future__ import annotations

import re

import pytest

from telegram_fence.runtime import decisions as d


@pytest.mark.parametrize(
    ("handler_time", "inline"),
    [(0.0, False), (-1.0, False), (1e-6, True), (d.INLINE_MAX, True), (d.INLINE_MAX * 1.01, False), (0.5, False)],
)
def test_inline_mode_only_for_measured_fast_handlers(handler_time: float, inline: bool) -> None:
    """Inline mode is on exactly when the handlers are measured (> 0) and at most INLINE_MAX on average."""
    assert d.inline_mode(handler_time) is inline


@pytest.mark.parametrize(
    ("handler_time", "batch", "workers", "expected"),
    [
        (0.0, 16, 4, 4 * 16 + 1),  # unmeasured: a full batch per worker
        (d.INLINE_MAX / 2, 16, 4, d.INLINE_ROUND),  # inline: one inline round
        (0.001, 16, 4, 4 * 4 + 1),  # 4 ms of queue per worker / 1 ms per handler
        (0.001, 2, 4, 4 * 2 + 1),  # the batch caps the queue
        (0.5, 16, 4, 4 * 1 + 1),  # slow handlers: one each, one spare for the pool
        (0.5, 16, 1, 2),
    ],
)
def test_target_holds_about_queue_seconds_of_work(handler_time: float, batch: int, workers: int,
                                                  expected: int) -> None:
    """The pool holds about QUEUE_SECONDS of queued work per worker, bounded by the batch, at least one."""
    assert d.target(handler_time, batch, workers) == expected


@pytest.mark.parametrize(
    ("handler_time", "finished_at", "now", "expected"),
    [
        (0.001, 10.0, 10.0, 0.0),  # not inline: settle at once
        (d.INLINE_MAX, 10.0, 10.0, d.SETTLE_HOLD),
        (d.INLINE_MAX, 10.0, 10.0 + d.SETTLE_HOLD / 2, d.SETTLE_HOLD / 2),
        (d.INLINE_MAX, 10.0, 11.0, d.SETTLE_HOLD - 1.0),  # overdue: negative
    ],
)
def test_settle_hold_only_in_inline_mode(handler_time: float, finished_at: float, now: float,
                                         expected: float) -> None:
    """Finished attempts wait up to SETTLE_HOLD for the next batch in inline mode, never otherwise."""
    assert d.settle_hold(handler_time, finished_at, now) == pytest.approx(expected)


@pytest.mark.parametrize(("previous", "elapsed", "expected"), [(0.0, 0.3, 0.3), (1.0, 0.0, 0.8), (0.5, 1.0, 0.6)])
def test_average_starts_with_the_first_run_then_weighs_a_fifth(previous: float, elapsed: float,
                                                               expected: float) -> None:
    """The first measured run sets the average; each later run counts for a fifth."""
    assert d.average(previous, elapsed) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("started", "now", "stalled"),
    [(None, 5.0, False), (5.0, 5.0, False), (5.0, 5.0 + d.INLINE_STALL * 0.99, False),
     (5.0, 5.0 + d.INLINE_STALL, True), (5.0, 50.0, True)],
)
def test_stalled_after_inline_stall(started: float | None, now: float, stalled: bool) -> None:
    """An inline handler counts as stalled once it ran INLINE_STALL or longer; one not started never."""
    assert d.stalled(started, now) is stalled


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


@pytest.mark.parametrize(
    ("items", "kept", "rest"),
    [
        ([], [], []),
        ([("a", 1), ("b", 1), ("c", 2)], ["a", "c"], ["b"]),
        ([("a", None), ("b", None), ("c", 1), ("d", 1), ("e", 2), ("f", 1)], ["a", "b", "c", "e"], ["d", "f"]),
    ],
)
def test_one_per_chat_keeps_the_first_of_each_chat_in_order(items: list[tuple[str, int | None]], kept: list[str],
                                                             rest: list[str]) -> None:
    """The first item of each chat is kept in order; later ones of a kept chat are set apart; chatless all kept."""
    got_kept, got_rest = d.one_per_chat(items, lambda item: item[1])
    assert [name for name, _ in got_kept] == kept
    assert [name for name, _ in got_rest] == rest


@pytest.mark.parametrize(
    ("runs", "claimed_chats", "claimed_ids", "chats_left", "chatless_left"),
    [
        (False, [1], [10], {2, 3}, {21, 22}),  # chat 1 served; chatless update 10 was not hinted
        (False, [1, 2, 3], [21], set(), {22}),
        (True, [1, 2], [21], {1, 2, 3}, {22}),  # runs: a served chat may hold more
    ],
)
def test_unserved_hints_stay_candidates(runs: bool, claimed_chats: list[int], claimed_ids: list[int],
                                        chats_left: set[int], chatless_left: set[int]) -> None:
    """After a round cut off by its room, hinted chats without a claim (all, in runs) and unclaimed chatless
    updates stay candidates."""
    chats, chatless = d.unserved({1, 2, 3}, {21, 22}, claimed_chats, claimed_ids, runs)
    assert (chats, chatless) == (chats_left, chatless_left)


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


def test_typical_counts_a_run_for_at_most_inline_clip() -> None:
    """The average that decides inline mode counts one run for at most INLINE_CLIP (the first run sets it)."""
    assert d.typical(0.0, 0.3) == pytest.approx(d.INLINE_CLIP)
    assert d.typical(0.0, 1e-5) == pytest.approx(1e-5)
    assert d.typical(1e-4, 0.005) == pytest.approx(0.8 * 1e-4 + 0.2 * d.INLINE_CLIP)


def test_target_follows_the_inline_decision_it_is_given() -> None:
    """Given ``inline``, target() holds an inline round or the queue the average asks for, whatever the average."""
    assert d.target(0.001, 16, 4, inline=True) == d.INLINE_ROUND
    assert d.target(1e-5, 16, 4, inline=False) == 4 * 16 + 1


def test_one_slowed_run_keeps_fast_handlers_inline_three_slow_runs_end_it() -> None:
    """A fast handler's run that the machine slowed down (a 5 ms preemption) does not end inline mode; a handler
    that became slow (20 ms each time) leaves it after three runs; the average itself is not clipped."""
    from telegram_fence.runtime.state import HandlerTime

    times = HandlerTime()
    for _ in range(50):
        times.measured(30e-6)
    assert times.inline_mode()
    times.measured(0.005)  # preempted once
    assert times.inline_mode()
    assert times.value() > d.INLINE_MAX  # the queue depth still sees the real time
    for _ in range(20):
        times.measured(30e-6)
    assert times.inline_mode()
    times.measured(0.02)
    times.measured(0.02)
    assert times.inline_mode()
    times.measured(0.02)
    assert not times.inline_mode()
    assert times.target(16, 4) == 4 * 1 + 1  # slow handlers: one each, one spare (the real average decides)


def test_a_stalled_handler_ends_inline_mode_at_once() -> None:
    """at_least() (an inline handler stalled the dispatcher) ends inline mode whatever the runs before."""
    from telegram_fence.runtime.state import HandlerTime

    times = HandlerTime()
    for _ in range(10):
        times.measured(30e-6)
    times.at_least(d.INLINE_STALL)
    assert not times.inline_mode()
    assert times.settle_hold(10.0, 10.0) == 0.0
