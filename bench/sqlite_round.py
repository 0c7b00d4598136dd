"""The CPU of each SQL statement of a SQLite round, per statement kind (a private benchmark of internals).

    python bench/sqlite_round.py                          # store alone: webhook-like rounds of 10
    python bench/sqlite_round.py --batch 25 --rounds 1000
    python bench/sqlite_round.py --fence --deliveries 3000  # a running fence's webhook_app behind waitress
    python bench/ab.py --a ../old --b . --rounds 3 --pick 'CPU per round' -- bench/sqlite_round.py

Store alone: each round records ``--batch`` new updates (chats of 500, as ``webhook_bench.py`` sends them), settles
the claims of the round before and claims the heads of the chats just freed or given updates, in one
``write(durable=True)`` (what the dispatcher's webhook round asks of the store), on a file that already holds 5,000
settled rows. ``--fence``: the fenced variant of ``webhook_bench.py --bare`` (40 kept-alive connections from a child
process, trivial handler, ``synchronous=FULL``), with only the ``fence-dispatcher`` thread's statements counted.
Each statement's CPU is the calling thread's CPU time around its ``execute`` (``time.thread_time``; under load it
also holds cache misses and the interpreter lock's hand-off), so compare runs of this script with each other.
Reaches into ``StoreBase._open`` to wrap every connection.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from telegram_fence.store.sqlite import SqliteUpdateStore, connection

COST: collections.defaultdict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
ONLY: list[str | None] = [None]  # the thread whose statements count (None: every thread)


class TimedConnection:
    """An APSW connection whose ``execute`` adds its CPU time to ``COST``; savepoint blocks count as one kind."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def _counts(self) -> bool:
        return ONLY[0] is None or threading.current_thread().name == ONLY[0]

    def execute(self, statement: str, *args: Any, **kwargs: Any) -> Any:
        if not self._counts():
            return self._conn.execute(statement, *args, **kwargs)
        started = time.thread_time()
        cursor = self._conn.execute(statement, *args, **kwargs)
        cost = COST[" ".join(statement.split())[:56]]
        cost[0] += 1
        cost[1] += time.thread_time() - started
        return cursor

    def __enter__(self) -> TimedConnection:
        started = time.thread_time()
        self._conn.__enter__()
        self._note("SAVEPOINT (a nested store call)", started)
        return self

    def __exit__(self, *exc: Any) -> Any:
        started = time.thread_time()
        try:
            return self._conn.__exit__(*exc)
        finally:
            self._note("RELEASE / ROLLBACK TO (its end)", started)

    def _note(self, kind: str, started: float) -> None:
        if self._counts():
            COST[kind][0] += 1
            COST[kind][1] += time.thread_time() - started

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def update(update_id: int) -> dict[str, Any]:
    chat = update_id % 500
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": 1_700_000_000, "chat": {"id": chat, "type": "private"},
        "from": {"id": chat, "is_bot": False, "first_name": "u"}, "text": "hello"}}


def store_rounds(directory: str, rounds: int, batch: int, synchronous: str) -> tuple[float, int]:
    """Run the store-alone rounds; returns (CPU seconds of the rounds, claims of the last round)."""
    store = SqliteUpdateStore(os.path.join(directory, "round.db"), synchronous=synchronous,
                              work_synchronous=synchronous)
    try:
        next_id = 1
        for _ in range(50):  # a history of settled rows, as a running bot has
            store.record([update(i) for i in range(next_id, next_id + 100)], 0)
            next_id += 100
            store.settle_many([claim.identity for claim in store.claim_many(30, 100)])
        claims: list[Any] = []
        COST.clear()
        started = time.thread_time()
        for _ in range(rounds):
            updates = [update(i) for i in range(next_id, next_id + batch)]
            next_id += batch
            with store.write(durable=True):
                store.record(updates, 0)
                chats = {u["message"]["chat"]["id"] for u in updates} | {claim.chat_id for claim in claims}
                _, claims, _ = store.exchange([claim.identity for claim in claims], 30, 40, max_attempts=5,
                                              known={u["update_id"]: u for u in updates}, chats=chats)
        return time.thread_time() - started, len(claims)
    finally:
        store.close()


def fence_run(directory: str, deliveries: int) -> tuple[float, int]:
    """The fenced webhook variant behind waitress; returns (deliveries per second, commits)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import webhook_bench

    app, close = webhook_bench.make_fenced(directory)
    server, port, thread = webhook_bench.serve(app, 40)
    COST.clear()
    try:
        child = subprocess.run([sys.executable, webhook_bench.__file__, "--client", str(port), str(deliveries), "40"],
                               capture_output=True, text=True, check=True)
        commits = int(app.stats()["commits"])
    finally:
        server.close()
        thread.join(5)
        close()
    return float(child.stdout.strip().splitlines()[-1]), commits


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000, help="store-alone rounds (default 2000)")
    parser.add_argument("--batch", type=int, default=10, help="new updates per store-alone round (default 10)")
    parser.add_argument("--synchronous", default="OFF", help="store alone: the file's synchronous level (default OFF)")
    parser.add_argument("--fence", action="store_true", help="a running fence's webhook_app instead of the store")
    parser.add_argument("--deliveries", type=int, default=3000, help="--fence: deliveries (default 3000)")
    parser.add_argument("--dir", default=None, help="directory for the database files (default: a temp dir)")
    args = parser.parse_args()
    if args.fence:
        ONLY[0] = "fence-dispatcher"
    opened = connection.StoreBase._open

    def timed_open(self: connection.StoreBase) -> Any:
        conn = opened(self)  # only the counted thread's: other parts of the fence check for a real APSW connection
        return TimedConnection(conn) if ONLY[0] in (None, threading.current_thread().name) else conn

    connection.StoreBase._open = timed_open  # type: ignore[method-assign]
    directory = tempfile.mkdtemp(prefix="sqlite-round-", dir=args.dir)
    if args.fence:
        rate, commits = fence_run(directory, args.deliveries)
        per, unit = args.deliveries, "delivery"
        print(f"fence webhook: {rate:,.0f} deliveries/s, {commits} commits ({args.deliveries / max(1, commits):.1f} "
              f"per commit); dispatcher statements CPU {sum(c for _, c in COST.values()) / per * 1e6:.1f} us per "
              f"delivery")
    else:
        cpu, claims = store_rounds(directory, args.rounds, args.batch, args.synchronous)
        per, unit = args.rounds, "round"
        print(f"store alone: {cpu / args.rounds * 1e6:.0f} us CPU per round of {args.batch} (synchronous="
              f"{args.synchronous}), {claims} claims in the last; statements "
              f"{sum(c for _, c in COST.values()) / per * 1e6:.0f} us")
    for kind, (calls, cpu) in sorted(COST.items(), key=lambda item: -item[1][1]):
        print(f"{cpu / per * 1e6:9.2f} us per {unit} {int(calls):7d} calls  {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
