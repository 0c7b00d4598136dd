"""Crash proof: a fenced bot in a child process, killed with SIGKILL at random moments and restarted.

The short form runs in CI; ``TF_SOAK=1`` runs the long form (≥ 20 kills over ≥ 2,000 updates).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import SOAK
from helpers import eventually, signal_when_ready
from pg_support import DSN, drop_tables, new_table, requires_pg

from telegram_fence.cli.demo import DrillDb, DrillReport, _spawn, _wait_done, run_drill
from telegram_fence.testing import FakeBotAPI, ReadinessSocket

pytestmark = pytest.mark.drill


def assert_clean(report: DrillReport, updates: int, kills: int) -> None:
    """The drill's report says: every kill survived, every update handled with exactly one domain row, nothing
    left open, everything confirmed, a clean last exit."""
    assert report.problems == []
    assert report.kills == kills
    assert report.domain_rows == updates == report.updates_with_one_row
    assert report.handled == updates
    assert report.left_open == 0
    assert report.confirmed_offset > report.last_update_id
    assert report.final_exit_code == 0


@pytest.mark.soak
def test_sigkill_drill_loses_nothing_and_writes_once(tmp_path: Path) -> None:
    """After repeated SIGKILLs every update has exactly one domain row, nothing is left open, all is confirmed."""
    updates, kills = (2000, 20) if SOAK else (600, 6)
    report = run_drill(updates=updates, kills=kills, chats=25, workdir=tmp_path, seed=None, timeout=600)
    assert_clean(report, updates, kills)


@pytest.mark.soak
@requires_pg
def test_sigkill_drill_on_postgresql_loses_nothing_and_writes_once() -> None:
    """The same drill on PostgreSQL (the bot's store and its notes in the database): after repeated SIGKILLs
    every update has exactly one domain row, nothing is left open, all is confirmed."""
    updates, kills = (2000, 20) if SOAK else (200, 3)
    table = new_table("tf_drill")
    try:
        report = run_drill(updates=updates, kills=kills, chats=25, seed=None, timeout=600, postgres=DSN, table=table)
    finally:
        drop_tables(table, f"{table}_notes")
    assert_clean(report, updates, kills)


def test_sigterm_during_a_batch_exits_zero_and_loses_nothing(tmp_path: Path) -> None:
    """SIGTERM while handlers run: exit code 0; after a restart every update has exactly one domain row."""
    db = str(tmp_path / "bot.db")
    with FakeBotAPI(max_long_poll=1.0, latency={"sendMessage": 0.01}) as api, ReadinessSocket() as ready:
        ids = api.push_messages(200, chats=list(range(1, 11)))
        child = _spawn(api.api_url, api.token, db, 1.0, 4, ready)
        assert api.wait_for(lambda: len(api.sent) >= 40, timeout=30)
        signal_when_ready(child, ready)
        assert child.wait(timeout=20) == 0
        handled_before_restart = len(api.sent)
        assert handled_before_restart < 200, "the run finished before SIGTERM could land mid-batch"
        child = _spawn(api.api_url, api.token, db, 1.0, 4, ready)
        try:
            assert _wait_done(DrillDb(db), len(ids), time.monotonic() + 60)
        finally:
            signal_when_ready(child, ready)
            assert child.wait(timeout=20) == 0
        assert eventually(lambda: api.confirmed_offset > ids[-1], timeout=5)
    report = DrillReport(pushed=len(ids))
    DrillDb(db).check(ids, report)
    assert report.problems == []
    assert report.domain_rows == 200


def test_a_kill_point_past_the_replies_that_will_ever_be_sent_ends_the_wait_once_every_note_is_written(
    tmp_path: Path,
) -> None:
    """A reply a kill left uncertain is never sent again, so the drill's last kill points may never be reached: the
    wait for one ends as soon as every note is written (before: it waited out the whole timeout, 600 s in these
    tests, with all the work done)."""
    from telegram_fence.cli.demo import _reach
    from telegram_fence.testing import FakeBotAPI

    db = str(tmp_path / "drill.db")
    store = DrillDb(db).open_store()
    try:
        with store.write() as conn:
            for n in range(1, 4):
                conn.execute("INSERT INTO notes VALUES (?, 1, 'note', 'c')", (n,))
    finally:
        store.close()
    with FakeBotAPI() as api:
        deadline = time.monotonic() + 120
        assert _reach(api, 2, DrillDb(db), 3, deadline) is False  # no reply was ever sent; all 3 notes are written
        assert deadline - time.monotonic() > 100
        # a note missing: only the deadline ends it
        assert _reach(api, 2, DrillDb(db), 4, time.monotonic() + 1.5) is False
