"""The durable steps' crash drill: a plain telebot bot in a child process calls a local HTTP service through a step,
fails at random after it, then replies; it is SIGKILLed at random moments (the service answers after a short delay,
so kills land mid-call) and restarted each time, on both backends.

Every update's service call happens at most once, exactly once where the step is not uncertain; every uncertain step
is listed by ``telegram-fence steps --uncertain``, and only those updates are exhausted; no reply reaches Telegram
twice; nothing is lost; ``step_key`` is the same in the reply as in the service call, across attempts and
processes. The figures are printed.
"""

from __future__ import annotations

import http.server
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import eventually, signal_when_ready
from pg_support import DSN, drop_tables, new_table

from telegram_fence import SqliteUpdateStore
from telegram_fence.calls.journal import list_calls
from telegram_fence.steps.core import list_steps
from telegram_fence.testing import FakeBotAPI, ReadinessSocket

pytestmark = pytest.mark.drill

CHILD = str(Path(__file__).with_name("steps_child.py"))
WORKERS = 4


class Service(http.server.ThreadingHTTPServer):
    """The other service: records every call (update id, idempotency key, caller's pid), answers after 20 ms."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ServiceHandler)
        self.lock = threading.Lock()
        self.calls: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/work"

    def count(self) -> int:
        with self.lock:
            return len(self.calls)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a caller killed mid-call leaves a broken pipe: the call was made all the same


class _ServiceHandler(http.server.BaseHTTPRequestHandler):
    server: Service

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with self.server.lock:
            self.server.calls.append(body)
        time.sleep(0.02)  # the work: a kill may land while it runs
        answer = json.dumps({"pid": body["pid"], "key": body["key"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def service() -> Iterator[Service]:
    server = Service()
    thread = threading.Thread(target=server.serve_forever, name="test-service", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _spawn(api: FakeBotAPI, db: str, service: Service, ready: ReadinessSocket) -> subprocess.Popen[bytes]:
    env = ready.env(PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, CHILD, db, api.api_url, api.token, str(WORKERS), service.url], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _open(db: str) -> Any:
    if not db.startswith("postgres:"):
        return SqliteUpdateStore(db)
    from telegram_fence.store.postgres import PostgresUpdateStore

    dsn, _, table = db[len("postgres:"):].rpartition("|")
    return PostgresUpdateStore(dsn, table=table, create_table=False, pool_size=1)


def _finished(db: str) -> int:
    with _open(db) as store:
        stats = store.stats()
    return int(stats["settled"]) + int(stats["exhausted"])


def _listed_uncertain(db: str) -> list[dict[str, Any]]:
    """What ``telegram-fence steps DB --uncertain --json`` prints, run as a process."""
    where = [db] if not db.startswith("postgres:") else [*reversed(db[len("postgres:"):].rpartition("|")[::2])]
    argv = [where[0]] if len(where) == 1 else [where[1], "--table", where[0]]
    done = subprocess.run([sys.executable, "-m", "telegram_fence", "steps", *argv, "--uncertain", "--json"],
                          capture_output=True, text=True, timeout=60, check=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    listed: list[dict[str, Any]] = json.loads(done.stdout)
    return listed


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(DSN is None,
                                                                                    reason="no PostgreSQL"))])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The drill's database: a SQLite file, or a fresh PostgreSQL table (dropped afterwards)."""
    if request.param == "sqlite":
        yield str(tmp_path / "bot.db")
        return
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = new_table("tf_steps_drill")
    PostgresUpdateStore(str(DSN), table=table).close()
    try:
        yield f"postgres:{DSN}|{table}"
    finally:
        drop_tables(table)


def test_sigkill_drill_calls_each_service_at_most_once_and_lists_every_uncertain_step(
    db: str, service: Service
) -> None:
    """Repeated SIGKILLs while steps call the service and after them: no service call twice for an update, exactly
    one for every step recorded done, every uncertain step listed by ``steps --uncertain`` (and only those updates
    exhausted), no reply twice, every update finished, the idempotency key the same in the reply as in the call."""
    updates, kills = (300, 8) if not db.startswith("postgres:") else (150, 5)
    rng = random.Random()
    with FakeBotAPI(max_long_poll=0.5) as api, ReadinessSocket() as ready:
        ids = api.push_messages(updates, chats=list(range(1, 41)))
        child = _spawn(api, db, service, ready)
        done_kills = 0
        try:
            while done_kills < kills:
                # a random moment while steps run: a few to a few dozen service calls after now, plus up to one
                # call's work, so some kills land while a call runs and others between the step and the reply; never
                # past the last updates (a fast run can have called the service for nearly all before its last kill)
                target = min(service.count() + rng.randint(3, 40), updates - 20)
                assert eventually(lambda t=target: service.count() >= t, timeout=60, interval=0.005)
                time.sleep(rng.uniform(0.0, 0.03))
                child.send_signal(signal.SIGKILL)
                child.wait(10)
                done_kills += 1
                child = _spawn(api, db, service, ready)
            assert eventually(lambda: _finished(db) >= updates, timeout=180, interval=0.2)
        finally:
            signal_when_ready(child, ready)
            assert child.wait(20) == 0
        replies = Counter(str(call.params.get("text")) for call in api.calls_to("sendMessage"))
    with _open(db) as store:
        stats = store.stats()
        exhausted = {e.identity.update_id: e for e in store.due_exhaustions(limit=10 * updates)}
        with store.read() as conn:
            steps = {row.update_id: row for row in list_steps(conn, limit=10 * updates)}
            unknown_calls = {row.update_id for row in list_calls(conn, uncertain=True, limit=10 * updates)}
    listed = {(r["update_id"], r["name"]) for r in _listed_uncertain(db)}
    with service.lock:
        calls = list(service.calls)
    per_update = Counter(int(c["update_id"]) for c in calls)
    keys = {int(c["update_id"]): str(c["key"]) for c in calls}
    uncertain = {u for u, row in steps.items() if row.state in ("uncertain", "intent")}
    done = {u for u, row in steps.items() if row.state == "done"}
    replied = {int(text.split(":")[0]): text for text in replies}
    cross_process = sum(1 for text in replied.values() if text.split(":")[2] != text.split(":")[3])
    backend = "postgres" if db.startswith("postgres:") else "sqlite"
    print(f"\nsteps drill ({backend}): updates={updates} kills={done_kills} workers={WORKERS} "
          f"service_calls={len(calls)} done={len(done)} uncertain={len(uncertain)} exhausted={len(exhausted)} "
          f"replies={sum(replies.values())} replied_updates={len(replied)} "
          f"replied_by_another_process={cross_process}")
    assert done_kills == kills
    assert stats["pending"] == 0 and stats["claimed"] == 0
    assert stats["settled"] + stats["exhausted"] == updates, "every update finished"
    assert set(steps) == set(ids), "every update reached its step"
    assert max(per_update.values()) == 1, "a service call made twice for one update"
    assert all(per_update[u] == 1 for u in done), "a step recorded done without its one service call"
    assert set(per_update) <= set(ids)
    assert {(u, "work") for u in uncertain} == listed, "the uncertain steps are exactly those listed"
    assert set(exhausted) == uncertain, "only updates whose step is uncertain are exhausted"
    assert all("StepUncertain" in (e.error or "") for e in exhausted.values())
    assert len(uncertain) <= done_kills * WORKERS, "at most one step in flight per handler thread per kill"
    assert max(replies.values()) == 1, "a reply reached Telegram twice"
    assert set(replied) <= done
    assert done - set(replied) <= unknown_calls, "a reply neither sent nor journaled with an unknown outcome"
    for update_id, text in replied.items():
        _, key, _service_pid, _reply_pid = text.split(":")
        assert key == keys[update_id], "step_key differs between the service call and the reply"
