"""SIGKILL of a process serving the webhook intake while deliveries are in flight."""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import apsw
import pytest
from helpers import eventually
from webhook_support import SECRET, post, update

pytestmark = pytest.mark.drill

CHILD = str(Path(__file__).with_name("webhook_child.py"))


def spawn(db: str) -> tuple[subprocess.Popen[str], int]:
    child = subprocess.Popen([sys.executable, CHILD, "serve", db], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "TF_TEST_SECRET": SECRET})
    assert child.stdout is not None
    return child, int(child.stdout.readline())


def on_disk(db: str) -> set[int]:
    conn = apsw.Connection(db, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return {row[0] for row in conn.execute("SELECT update_id FROM fence_updates")}
    finally:
        conn.close()


def test_sigkill_in_flight_loses_nothing_answered_and_redelivery_stores_once(tmp_path: Path) -> None:
    """After SIGKILLs mid-load every update answered 200 is on disk; the rest, redelivered, are stored once."""
    db = str(tmp_path / "hook.db")
    total = 1500
    work: queue.Queue[int] = queue.Queue()
    for update_id in range(1, total + 1):
        work.put(update_id)
    lock = threading.Lock()
    answered: set[int] = set()
    failed_attempts = 0
    port = [0]
    serving = threading.Event()  # cleared while no child serves

    def client() -> None:
        nonlocal failed_attempts
        while True:
            try:
                update_id = work.get(timeout=0.5)
            except queue.Empty:
                if work.empty() and len(answered) == total:
                    return
                continue
            if not serving.wait(60):
                return
            try:
                status = post(port[0], json.dumps(update(update_id, chat=update_id % 11)), timeout=10)[0]
            except (OSError, http.client.HTTPException):
                status = 0
            if status == 200:
                with lock:
                    answered.add(update_id)
            else:  # no answer (killed) or an error: Telegram delivers it again later
                with lock:
                    failed_attempts += 1
                work.put(update_id)

    child, port[0] = spawn(db)
    serving.set()
    clients = [threading.Thread(target=client, name=f"client-{i}") for i in range(40)]
    for thread in clients:
        thread.start()
    try:
        for kill_at in (300, 800):
            assert eventually(lambda at=kill_at: len(answered) >= at, timeout=60)
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            serving.clear()
            with lock:
                answered_before_kill = set(answered)
            # Whatever was answered 200 is on disk, even though the process died with requests in flight.
            assert answered_before_kill <= on_disk(db)
            child, port[0] = spawn(db)
            serving.set()
        for thread in clients:
            thread.join(120)
        assert len(answered) == total
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert failed_attempts > 0  # the kills did hit requests in flight
    conn = apsw.Connection(db, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        (rows,) = conn.execute("SELECT count(*) FROM fence_updates").fetchone()
        (distinct,) = conn.execute("SELECT count(DISTINCT update_id) FROM fence_updates").fetchone()
    finally:
        conn.close()
    assert rows == distinct == total
