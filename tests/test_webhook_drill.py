"""Crash proof for the webhook: the fake Bot API pushes updates to a fenced bot in ``run_webhook``,
which is killed with SIGKILL at random moments and restarted on the same port and database.

On SQLite and on PostgreSQL. The short form runs in CI (1,000 updates, 5 kills; 300 and 3 on PostgreSQL);
``TF_SOAK=1`` runs the long form (3,000, 20).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SOAK
from helpers import eventually, signal_when_ready
from pg_support import DSN, drop_tables, new_table, requires_pg
from webhook_support import SECRET

from telegram_fence.cli.demo import DRILL_DSN, DrillDb, DrillReport
from telegram_fence.testing import FakeBotAPI, ReadinessSocket

pytestmark = pytest.mark.drill

CHILD = str(Path(__file__).with_name("webhook_child.py"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(api: FakeBotAPI, db: str, port: int, ready: ReadinessSocket,
          postgres: str | None = None) -> subprocess.Popen[bytes]:
    env = ready.env(TF_TEST_TOKEN=api.token, TF_TEST_SECRET=SECRET, PYTHONUNBUFFERED="1")
    env.pop(DRILL_DSN, None)
    if postgres is not None:
        env[DRILL_DSN] = postgres  # the child runs on PostgreSQL, db being the inbox table
    return subprocess.Popen([sys.executable, CHILD, "drill", db, api.api_url, str(port)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=None if os.environ.get("TF_DRILL_VERBOSE") else subprocess.DEVNULL)


def notes(db: str, postgres: str | None = None) -> int:
    return DrillDb(db, postgres).count_notes()  # 0 while the child creates the database


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_pg)])
def drill_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """``(db, postgres)``: a SQLite file (``postgres`` None), or a PostgreSQL table and the DSN."""
    if request.param == "sqlite":
        yield str(tmp_path / "drill.db"), None
        return
    table = new_table("tf_hookdrill")
    try:
        yield table, DSN
    finally:
        drop_tables(table, f"{table}_notes")


@pytest.mark.soak
def test_webhook_sigkill_drill_loses_nothing_and_writes_once(drill_db: tuple[str, str | None]) -> None:
    """Deliveries pushed by the fake survive repeated SIGKILLs: one domain row per update, nothing open, queue empty;
    on SQLite and on PostgreSQL."""
    db, postgres = drill_db
    total, kills = (3000, 20) if SOAK else (1000, 5) if postgres is None else (300, 3)
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    port = free_port()
    # Kill points on a progress scale of deliveries answered (0..total) plus domain rows written
    # (total..2 total); at least one lands while deliveries are still in flight.
    points = sorted(rng.sample(range(1, 2 * total), kills))
    if points[0] >= total:
        points[0] = rng.randrange(1, total)
        points.sort()
    with FakeBotAPI(webhook_retry_delay=0.05, webhook_max_retry_delay=0.25) as api, ReadinessSocket() as ready:
        ids = api.push_messages(total, chats=list(range(1, 26)), text="note {i}")

        def progress() -> int:
            delivered = api.webhook_deliveries
            return delivered if delivered < total else total + notes(db, postgres)

        child = spawn(api, db, port, ready, postgres)
        try:
            for point in points:
                assert eventually(lambda p=point: progress() >= p, timeout=120, interval=0.005), (
                    f"no progress to {point} (seed {seed})")
                time.sleep(rng.random() * 0.02)  # jitter: land at different phases of a delivery or an attempt
                child.send_signal(signal.SIGKILL)
                child.wait(10)
                child = spawn(api, db, port, ready, postgres)
            assert api.wait_delivered(timeout=120), f"the fake still holds updates (seed {seed})"
            assert eventually(lambda: notes(db, postgres) >= total, timeout=120), (
                f"not every update handled (seed {seed})")
            # SIGTERM stops run_webhook cleanly once it serves (READY=1): the last kill may follow the last note.
            signal_when_ready(child, ready, timeout=60)
            assert child.wait(30) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
        assert api.pending_count == 0 and api.webhook_in_flight == 0
        assert api.webhook_deliveries >= total
        assert api.internal_errors == []
    report = DrillReport(pushed=len(ids), kills=kills)
    DrillDb(db, postgres).check(ids, report)
    assert report.problems == [], f"seed {seed}"
    assert report.domain_rows == total == report.updates_with_one_row
    assert report.handled == total
    assert report.left_open == 0
