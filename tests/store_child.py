"""A child process for tests/test_store_processes.py: real processes sharing one SQLite store file.

Modes (the parent drives each child through stdin/stdout, one line per message):

``work PATH THREADS``
    Prints ``ready``, waits for ``go``, then runs THREADS worker threads that claim updates with
    ``exchange`` and handle each by inserting ``(update_id, claim_id, pid, chat_live)`` into the
    table ``handled`` through ``transaction(complete=True)``, until no open update is left. Prints one
    JSON line ``{"handled": n, "errors": [...]}``.

``open``
    Prints ``ready``; then for each line ``open PATH GATE`` opens ``SqliteUpdateStore(PATH)`` and prints
    a JSON line ``{"before": v0, "after": v1, "error": null | "Type: message"}`` (``before`` is null when
    the file did not exist yet). With GATE ``1`` the
    child stops right after the store's first ``user_version`` read (outside any transaction), prints
    ``read V`` and waits for ``continue``: the parent uses it to make two processes both see the old
    schema before either upgrades it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import apsw
from store_helpers import claim_one

from telegram_fence.store import schema
from telegram_fence.store.sqlite import SqliteUpdateStore

LEASE = 60.0
_OPEN_ROWS = "SELECT count(*) FROM fence_updates WHERE state < 2"
_LIVE_IN_CHAT = "SELECT count(*) FROM fence_updates WHERE chat_id = ? AND state = 1 AND due_at > ?"
_INSERT = "INSERT INTO handled(update_id, claim_id, pid, chat_live) VALUES (?, ?, ?, ?)"


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def work(path: str, threads: int) -> int:
    store = SqliteUpdateStore(path)
    pid = os.getpid()
    handled = [0] * threads
    errors: list[str] = []
    stop = threading.Event()

    def worker(index: int) -> None:
        try:
            while not stop.is_set():
                claim = claim_one(store, LEASE)
                if claim is None:
                    with store.read() as conn:
                        open_rows = conn.execute(_OPEN_ROWS).fetchone()[0]
                    if open_rows == 0:
                        return
                    stop.wait(0.001)  # the open updates' chats are held by other workers
                    continue
                with store.transaction(claim.identity, complete=True) as conn:
                    live = None
                    if claim.chat_id is not None:
                        live = conn.execute(_LIVE_IN_CHAT, (claim.chat_id, time.time())).fetchone()[0]
                    conn.execute(_INSERT, (claim.update_id, claim.identity.claim_id, pid, live))
                handled[index] += 1
        except BaseException as exc:  # report everything: the parent asserts there is nothing
            errors.append(f"{type(exc).__name__}: {exc}")
            stop.set()

    _say("ready")
    if sys.stdin.readline().strip() != "go":
        return 2
    pool = [threading.Thread(target=worker, args=(i,), name=f"child-worker-{i}") for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    store.close()
    _say(json.dumps({"handled": sum(handled), "errors": errors}))
    return 0


def open_files() -> int:
    real_version_of = schema.version_of
    gate = {"armed": False}

    def gated_version_of(conn: apsw.Connection) -> int:
        version = real_version_of(conn)
        if gate["armed"]:
            gate["armed"] = False
            _say(f"read {version}")
            if sys.stdin.readline().strip() != "continue":
                raise RuntimeError("the parent did not say continue")
        return version

    schema.version_of = gated_version_of  # migrate() looks the name up in its module on every call
    _say("ready")
    for line in sys.stdin:
        command, path, armed = line.split()
        if command != "open":
            return 2
        before = None  # the file does not exist yet
        if os.path.exists(path):
            conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
            conn.set_busy_timeout(5000)  # the other child may be checkpointing as it closes the file
            before = conn.pragma("user_version")
            conn.close()
        gate["armed"] = armed == "1"
        result: dict[str, Any] = {"before": before, "after": None, "error": None}
        try:
            store = SqliteUpdateStore(path)
            result["after"] = store.stats()["schema_version"]
            store.close()
        except Exception as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
        _say(json.dumps(result))
    return 0


def main(argv: list[str]) -> int:
    if argv[1:2] == ["work"]:
        return work(argv[2], int(argv[3]))
    if argv[1:2] == ["open"]:
        return open_files()
    sys.stderr.write(f"usage: {argv[0]} work PATH THREADS | open\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
