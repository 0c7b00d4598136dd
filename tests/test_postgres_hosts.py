"""Several hosts, simulated by processes: three fences on one PostgreSQL store, leaders SIGKILLed mid-run.

The short form runs in CI (< 60 s); ``TF_SOAK=1`` runs it with more updates and kills.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import SOAK
from helpers import eventually
from pg_support import DSN, drop_tables, new_table, requires_pg

from telegram_fence.testing import FakeBotAPI

lock_keys = pytest.importorskip("telegram_fence.store.postgres.schema").lock_keys

pytestmark = [requires_pg, pytest.mark.drill]

CHILD = str(Path(__file__).with_name("pg_host_child.py"))
#: Polling must resume within this many seconds of the leader's death. The documented bound is
#: leader_check (0.5 s in the child) plus one getUpdates; the rest is slack for a loaded CI machine.
RESUME_BOUND = 10.0


@pytest.fixture
def table() -> Iterator[str]:
    from telegram_fence.store.postgres import PostgresUpdateStore

    name = new_table("tf_hosts")
    PostgresUpdateStore(DSN, table=name).close()
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name}_domain (update_id bigint NOT NULL, pid integer, claim_id text)")
    yield name
    drop_tables(name)


def _spawn(api: FakeBotAPI, table: str, *, partition: Path | None = None,
           log: Path | None = None) -> subprocess.Popen[bytes]:
    verbose = os.environ.get("TF_DRILL_VERBOSE")
    env = dict(os.environ)
    if partition is not None:
        env["TF_PARTITION_DIR"] = str(partition)
    stderr: Any = subprocess.DEVNULL
    if log is not None:
        stderr = log.open("wb")
    elif verbose:
        stderr = None
    return subprocess.Popen(
        [sys.executable, CHILD, api.api_url, api.token, str(DSN), table],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
    )


def _leader(table: str) -> tuple[int, int] | None:
    """``(epoch, pid)`` of the live leader (whose session holds the lock), or None while there is none."""
    ns = lock_keys(table)[1] & 0xFFFFFFFF
    with psycopg.connect(DSN) as conn:
        row = conn.execute(
            f"SELECT epoch, pid FROM {table}_leader WHERE id = 1 AND EXISTS (SELECT 1 FROM pg_locks "
            "WHERE locktype = 'advisory' AND classid = %s::bigint::oid AND objid = 0 AND objsubid = 2 AND granted "
            "AND pid = backend_pid)",
            (ns,),
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else None


def _domain(table: str) -> tuple[int, int, int]:
    """(rows, distinct updates, open rows)."""
    with psycopg.connect(DSN) as conn:
        rows, distinct = conn.execute(f"SELECT count(*), count(DISTINCT update_id) FROM {table}_domain").fetchone()
        (open_rows,) = conn.execute(f"SELECT count(*) FROM {table} WHERE state < 2").fetchone()
    return rows, distinct, open_rows


def _resumed_after(api: FakeBotAPI, moment: float) -> float | None:
    """Seconds from ``moment`` to the first getUpdates that arrived after it (None when none yet)."""
    times = [c.time for c in api.calls_to("getUpdates") if c.time > moment]
    return min(times) - moment if times else None


def stop_children(children: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every child still running, then wait for each (20 s), killing one that does not end."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()


@pytest.mark.soak
def test_three_hosts_survive_leader_kills(table: str) -> None:
    """3 processes share the store; the leader is SIGKILLed twice (and a non-leader once) mid-run: every update
    gets exactly one domain row, nothing stays open, all is confirmed, polling resumes within the bound."""
    updates, leader_kills = (6000, 6) if SOAK else (2000, 2)
    with FakeBotAPI(max_long_poll=0.5) as api:
        stop_pushing = threading.Event()
        pushed: list[int] = []

        def push() -> None:  # a steady stream, so the kills land mid-run
            for start in range(0, updates, 50):
                if stop_pushing.is_set():
                    return
                pushed.extend(api.push_messages(min(50, updates - start), chats=list(range(1, 31))))
                stop_pushing.wait(0.15)

        children = [_spawn(api, table) for _ in range(3)]
        pusher = threading.Thread(target=push, name="pusher")
        try:
            assert eventually(lambda: _leader(table) is not None, timeout=30), "no process took the leadership"
            pusher.start()
            resumes: list[float] = []
            for kill in range(leader_kills + 1):
                target_rows = updates * (kill + 1) // (leader_kills + 3)
                assert eventually(lambda t=target_rows: _domain(table)[1] >= t, timeout=60)
                led = _leader(table)
                assert led is not None
                epoch, leader_pid = led
                if kill == 1:  # one non-leader dies too
                    victim = next(c for c in children if c.pid != leader_pid and c.poll() is None)
                    victim.send_signal(signal.SIGKILL)
                    victim.wait(10)
                    children.append(_spawn(api, table))
                    continue
                child = next(c for c in children if c.pid == leader_pid)
                killed_at = time.time()
                child.send_signal(signal.SIGKILL)
                child.wait(10)
                children.append(_spawn(api, table))  # the host comes back
                assert eventually(lambda e=epoch: (_leader(table) or (0, 0))[0] > e, timeout=RESUME_BOUND)
                assert eventually(lambda k=killed_at: _resumed_after(api, k) is not None, timeout=RESUME_BOUND)
                resumes.append(_resumed_after(api, killed_at) or 0.0)
            pusher.join(120)
            assert len(pushed) == updates
            last = pushed[-1]
            assert eventually(lambda: _domain(table)[1] == updates and _domain(table)[2] == 0, timeout=90)
            assert api.wait_confirmed(last + 1, timeout=30)
        finally:
            stop_pushing.set()
            stop_children(children)
        rows, distinct, open_rows = _domain(table)
        assert (rows, distinct, open_rows) == (updates, updates, 0), "an update was lost, doubled or left open"
        assert api.confirmed_offset > last
        assert all(r < RESUME_BOUND for r in resumes), resumes
        assert len(resumes) == leader_kills
        print(f"polling resumed after {', '.join(f'{r:.2f}' for r in resumes)} s")


def test_partition_drill_cut_leader_cannot_record_its_batch(table: str, tmp_path: Path) -> None:
    """The leader's database session is cut while it holds a fetched batch: another process takes over, the old
    leader's record is refused, and every update ends with exactly one domain row."""
    with FakeBotAPI(max_long_poll=0.5) as api:
        logs = [tmp_path / f"child-{i}.log" for i in range(2)]
        children = [_spawn(api, table, partition=tmp_path, log=log) for log in logs]
        try:
            assert eventually(lambda: _leader(table) is not None, timeout=30), "no process took the leadership"
            first = api.push_messages(40, chats=[1, 2, 3, 4])
            assert eventually(lambda: _domain(table)[1] == 40, timeout=30)
            led = _leader(table)
            assert led is not None
            epoch, leader_pid = led
            held = [*api.push_messages(5, chats=[5]), api.push_message(6, "partition")]
            assert eventually(lambda: (tmp_path / "held").exists(), timeout=20), "the leader did not fetch the batch"
            with psycopg.connect(DSN, autocommit=True) as admin:
                cut = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 0 "
                    "AND objsubid = 2 AND classid = %s::bigint::oid AND granted)",
                    (lock_keys(table)[1] & 0xFFFFFFFF,),
                ).fetchone()[0]
            assert cut == 1
            assert eventually(lambda: (_leader(table) or (0, 0))[0] > epoch, timeout=RESUME_BOUND)
            (tmp_path / "release").touch()
            assert eventually(lambda: _domain(table)[1] == 46 and _domain(table)[2] == 0, timeout=30)
            assert api.wait_confirmed(held[-1] + 1, timeout=20)
        finally:
            stop_children(children)
        old_log = logs[[c.pid for c in children].index(leader_pid)].read_text()
        assert "poll leadership lost; the batch in hand was not recorded" in old_log
        rows, distinct, open_rows = _domain(table)
        assert (rows, distinct, open_rows) == (46, 46, 0)
        assert sorted(first + held) == list(range(first[0], held[-1] + 1))
