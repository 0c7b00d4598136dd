"""Several real processes on one store file: fenced work without double handling, and racing schema upgrades."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw
from helpers import rows

from telegram_fence.store.schema import LATEST
from telegram_fence.store.sqlite import SqliteUpdateStore

CHILD = str(Path(__file__).with_name("store_child.py"))
TIMEOUT = 60.0


def update(update_id: int) -> dict[str, object]:
    """Every 10th update has no chat (its own line); the others fall into 50 chats."""
    if update_id % 10 == 0:
        return {"update_id": update_id, "inline_query": {"id": str(update_id), "query": "", "offset": ""}}
    chat = {"id": update_id % 50, "type": "group"}
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "chat": chat, "text": "x"}}


@contextmanager
def children(count: int, *args: str) -> Iterator[list[subprocess.Popen[str]]]:
    """Start ``count`` children and wait until each said ``ready``; kill any that is left at the end."""
    procs = [
        subprocess.Popen(
            [sys.executable, CHILD, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line == "ready", f"child said {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(TIMEOUT)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


def send(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def receive(proc: subprocess.Popen[str]) -> str:
    """The child's next line; a child that died fails the test with its stderr."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(TIMEOUT)
        raise AssertionError(f"child exited ({proc.returncode}) without answering; stderr: {proc.stderr.read()}")
    return line.strip()


def test_four_processes_of_four_threads_handle_each_update_once(tmp_path: Path) -> None:
    """4 processes x 4 threads on one file handle 2,000 updates: each once, one live claim per chat, no lock error."""
    path = tmp_path / "bot.db"
    with SqliteUpdateStore(path) as store:
        with store.write() as conn:
            conn.execute(
                "CREATE TABLE handled(update_id INTEGER NOT NULL UNIQUE, claim_id TEXT NOT NULL, "
                "pid INTEGER NOT NULL, chat_live INTEGER)"
            )
        for start in range(1, 2001, 100):
            store.record([update(i) for i in range(start, start + 100)], start + 100)

    with children(4, "work", str(path), "4") as procs:
        for proc in procs:  # released together, like a barrier
            send(proc, "go")
        reports = []
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == 0, err
            reports.append(json.loads(out.strip().splitlines()[-1]))

    assert [r["errors"] for r in reports] == [[]] * 4  # no BusyError or StoreUnavailable reached a worker
    assert sum(r["handled"] for r in reports) == 2000
    assert sum(1 for r in reports if r["handled"]) >= 2, reports
    conn = apsw.Connection(str(path))
    assert conn.execute("SELECT count(*), count(DISTINCT update_id) FROM handled").fetchone() == (2000, 2000)
    # every row was written by the claim that settled the update, and no update was ever claimed twice
    joined = conn.execute(
        "SELECT count(*) FROM handled h JOIN fence_updates u USING (update_id) "
        "WHERE u.claim_id = h.claim_id AND u.state = 2 AND u.attempt = 1"
    ).fetchone()[0]
    assert joined == 2000
    assert conn.execute("SELECT count(*) FROM fence_updates WHERE state <> 2").fetchone()[0] == 0
    # while an update of a chat was being handled, it was that chat's only live claim
    assert conn.execute("SELECT count(*) FROM handled WHERE chat_live IS NOT NULL AND chat_live <> 1").fetchone() == (
        0,
    )
    assert conn.execute("SELECT count(DISTINCT pid) FROM handled").fetchone()[0] >= 2
    conn.close()


def old_file(path: Path) -> None:
    with SqliteUpdateStore(path, schema_version=1) as old:
        old.record([update(1), update(2)], 3)
    conn = apsw.Connection(str(path))
    assert conn.pragma("user_version") == 1
    conn.close()


def check_upgraded(path: Path) -> None:
    with SqliteUpdateStore(path) as store:
        stats = store.stats()
        assert (stats["schema_version"], stats["cursor"], stats["pending"]) == (LATEST, 3, 2)
        tables = {r[0] for r in rows(store, "SELECT name FROM sqlite_schema WHERE type = 'table'")}
    assert {"fence_updates", "fence_meta", "fence_generations", "fence_outbox"} <= tables


def test_two_processes_that_both_read_the_old_schema_both_end_on_the_new_one(tmp_path: Path) -> None:
    """Two processes that both read schema version 1 before either upgrades it both open the file without error."""
    path = tmp_path / "old.db"
    old_file(path)
    with children(2, "open") as procs:
        for proc in procs:
            send(proc, f"open {path} 1")
        for proc in procs:  # both have read the old version outside any transaction ...
            assert receive(proc) == "read 1"
        for proc in procs:  # ... and now race for the upgrade
            send(proc, "continue")
        results = [json.loads(receive(proc)) for proc in procs]
    assert results == [{"before": 1, "after": LATEST, "error": None}] * 2
    check_upgraded(path)


def test_processes_opening_old_files_together_all_upgrade_them(tmp_path: Path) -> None:
    """Two processes released together onto each of 8 old files both end on the latest schema, never with an error."""
    paths = [tmp_path / f"old-{i}.db" for i in range(8)]
    for path in paths:
        old_file(path)
    with children(2, "open") as procs:
        results = []
        for path in paths:
            for proc in procs:
                send(proc, f"open {path} 0")
            results.extend(json.loads(receive(proc)) for proc in procs)
    assert [r["error"] for r in results] == [None] * 16
    assert [r["after"] for r in results] == [LATEST] * 16
    for path in paths:
        check_upgraded(path)


def test_processes_creating_one_new_file_together_both_open_it(tmp_path: Path) -> None:
    """Two processes released together onto each of 10 missing files both create and open it, never with an error."""
    paths = [tmp_path / f"new-{i}.db" for i in range(10)]
    with children(2, "open") as procs:
        results = []
        for path in paths:
            for proc in procs:
                send(proc, f"open {path} 0")
            results.extend(json.loads(receive(proc)) for proc in procs)
    assert [(r["error"], r["after"]) for r in results] == [(None, LATEST)] * 20
    for path in paths:
        assert oct(path.stat().st_mode & 0o777) == "0o600"
