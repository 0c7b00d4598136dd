"""The benchmark scripts still run on the current code (a moved or renamed name breaks them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.bench


def test_the_postgres_memory_benchmark_runs_on_the_current_runtime() -> None:
    """bench/pg_memory.py (it reads the PostgreSQL store's pool) runs plain telebot and a fence on PostgreSQL with a
    backlog waiting in the database, and prints its median lines and its ``--smaps`` breakdown (no size is asserted)."""

    dsn = os.environ.get("TELEGRAM_FENCE_PG_DSN")
    if not dsn:
        pytest.skip("TELEGRAM_FENCE_PG_DSN is not set")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pg_memory.py"), "--dsn", dsn, "--rounds", "1", "--n", "60",
         "--only", "pg", "--backlog", "database", "--smaps"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pg         peak" in done.stdout and "over plain telebot" in done.stdout
    assert "store modules" in done.stdout
    assert re.search(r"pg +resident by kind at the end \(kB; \d+ malloc arenas, \d+ thread stacks", done.stdout)
    assert "apsw loaded" not in done.stdout and "psycopg_pool loaded" not in done.stdout


def test_the_import_cost_benchmark_runs_every_statement() -> None:
    """bench/import_cost.py runs each statement (the import ones and a default fence built, started and stopped) in
    fresh interpreters and prints one line for each (no timing is asserted)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "import_cost.py"), "--rounds", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 7 and all("x import telebot" in line and "x cpu" in line for line in lines)
    assert lines[-1].startswith("import + Fence(bot, db) + start/stop")


def test_the_realistic_benchmark_reports_every_workload(tmp_path: Path) -> None:
    """bench/realistic.py --quick runs plain telebot and the fenced bot on SQLite through the busy group, the backlog,
    the slow upstream and the handlers-in-flight workloads, prints each one's figure, and bench/charts.py draws its
    JSON as a PNG (no timing is asserted)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    figures = tmp_path / "realistic.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "realistic.py"), "--quick", "--rounds", "1", "--bots", "plain,sqlite",
         "--no-warmup", "--json", str(figures)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for bot in ("plain", "sqlite"):
        for workload in ("busy", "slow"):
            assert re.search(rf"^{workload} +{bot} +reply delay p50 [0-9.]+ ms, p99 [0-9.]+ ms", done.stdout, re.M)
        assert re.search(rf"^backlog +{bot} +drain [0-9]+ updates/s", done.stdout, re.M), done.stdout
        assert re.search(rf"^inflight +{bot} +[0-9]+ handlers in flight; peak RSS [0-9.]+ MB", done.stdout, re.M)
    pytest.importorskip("matplotlib")
    chart = tmp_path / "realistic.png"
    drawn = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "charts.py"), str(figures), str(chart)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_steps_cost_benchmark_runs_on_the_current_code() -> None:
    """bench/steps_cost.py (it builds attempt contexts and runs steps itself) replays every step without calling its
    function (it asserts that itself) and prints its median line (no timing is asserted)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "steps_cost.py"), "--n", "100", "--rounds", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "median on SQLite: a step adds" in done.stdout


def test_the_trivial_cost_benchmark_sets_the_parts_beside_the_fence() -> None:
    """bench/trivial_cost.py runs plain telebot, the fence, the store-less hand-off pipeline and the store alone on a
    small backlog and prints the CPU per update of each, and of the hand-offs and the store together (no timing is
    asserted)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "trivial_cost.py"), "--n", "300", "--rounds", "1", "--room", "40"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for part in ("plain", "fence", "handoff", "store 40", "handoff + store 40"):
        assert re.search(rf"^  {re.escape(part)} +[0-9.]+ µs +[0-9.]+x$", done.stdout, re.M), done.stdout
