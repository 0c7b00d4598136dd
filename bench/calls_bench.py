"""The call journal's cost per Bot API call: what journaling adds to one call, on SQLite (FULL and NORMAL)
and PostgreSQL, with the number of commits per call.

    python bench/calls_bench.py                              # SQLite, work_synchronous FULL and NORMAL
    python bench/calls_bench.py --postgres "host=127.0.0.1 port=5432 user=postgres dbname=test"

One thread holds a claim and journals ``--calls`` calls the way the fence does for each request: the intent
(one fenced transaction: the ownership check and the insert, which also reads the call's shared 429 pauses)
and the outcome (one write transaction: the answer's JSON). No HTTP: this is the journal alone, what a call
pays on top of its round trip to Telegram. Rounds alternate the configurations; medians are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from telegram_fence.calls.journal import Journal
from telegram_fence.store.sqlite import SqliteUpdateStore

ANSWER = json.dumps({"ok": True, "result": {"message_id": 1, "date": 0, "chat": {"id": 1, "type": "private"},
                                            "text": "hello there"}})


def _claimed(store: Any) -> Any:
    store.record([{"update_id": 1, "message": {"message_id": 1, "date": 0, "chat": {"id": 1, "type": "private"},
                                               "text": "x"}}], 2)
    claim = next(iter(store.exchange((), 3600.0, 1)[1]), None)
    assert claim is not None
    return claim.identity


def _measure(store: Any, calls: int) -> float:
    """Seconds per journaled call (intent with the pause read + outcome) on ``store``."""
    identity = _claimed(store)
    journal = Journal(store)
    started = time.perf_counter()
    for seq in range(calls):
        assert journal.open_call(identity, seq, "sendMessage", 1, "fp", scope="chat:1") == (None, 0.0)
        journal.record(identity, seq, "sent", 200, ANSWER)
    return (time.perf_counter() - started) / calls


def _sqlite(sync: str, calls: int) -> float:
    with tempfile.TemporaryDirectory() as tmp, SqliteUpdateStore(Path(tmp) / "b.db", work_synchronous=sync) as store:
        return _measure(store, calls)


def _postgres(dsn: str, calls: int) -> float:
    from pg_cleanup import drop_store  # bench/ is the script's path

    from telegram_fence.store.postgres import PostgresUpdateStore

    table = f"tf_calls_bench_{uuid.uuid4().hex[:10]}"
    store = PostgresUpdateStore(dsn, table=table)
    try:
        return _measure(store, calls)
    finally:
        store.close()
        drop_store(dsn, table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", metavar="DSN", default=None, help="also measure PostgreSQL")
    args = parser.parse_args()
    configs: dict[str, Any] = {"sqlite FULL": lambda: _sqlite("FULL", args.calls),
                               "sqlite NORMAL": lambda: _sqlite("NORMAL", args.calls)}
    if args.postgres:
        configs["postgres"] = lambda: _postgres(args.postgres, max(200, args.calls // 4))
    results: dict[str, list[float]] = {name: [] for name in configs}
    for round_ in range(args.rounds):
        for name, run in configs.items():
            per_call = run()
            results[name].append(per_call)
            print(f"round {round_ + 1} {name:14s} {per_call * 1e6:8.0f} µs per call", flush=True)
    for name, values in results.items():
        print(f"{name:14s} median {statistics.median(values) * 1e6:.0f} µs per journaled call, "
              f"2 commits per call (intent with the pause read, outcome)")


if __name__ == "__main__":
    main()
