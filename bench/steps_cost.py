"""What a durable step adds to the call it wraps: the intent and the result written, or the recorded result read.

    python bench/steps_cost.py                       # SQLite, 5 rounds of 2,000 steps
    python bench/steps_cost.py --rounds 3 --n 5000
    python bench/steps_cost.py --dsn 'host=127.0.0.1 dbname=test user=postgres'    # PostgreSQL instead

Records ``--n`` updates in a fresh store (a temporary SQLite file at the store's defaults, ``work_synchronous``
``NORMAL`` as the call journal has it; or a table of its own on PostgreSQL, dropped afterwards), claims each, and
times ``step("work", fn)`` inside each claim's attempt against ``fn()`` alone (``fn`` returns a small dict at once):
the first reach (intent, call, result: two fenced write transactions), then, after every claim was handed back and
claimed again, the replay (the recorded result returned: one fenced transaction that reads it). Wall time on this
one thread, claims and hand-backs outside the timing. Prints each round's milliseconds per step and the medians.
It claims the updates and builds their attempt contexts itself, as the fence's workers do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from telegram_fence import AttemptContext


def message(update_id: int) -> dict[str, object]:
    user = {"id": update_id, "is_bot": False, "first_name": "User"}
    return {"update_id": update_id, "message": {"message_id": update_id, "from": user,
                                                "chat": {**user, "type": "private"}, "date": 1700000000,
                                                "text": f"m{update_id}"}}


def answer() -> dict[str, Any]:
    return {"text": "an answer", "tokens": 42}


def claims(store: Any, n: int) -> list[AttemptContext]:
    """``n`` live claims of the store, as attempt contexts."""
    found = []
    while len(found) < n:
        claim = next(iter(store.exchange((), 300.0, 1)[1]), None)
        assert claim is not None, "fewer claimable updates than asked for"
        found.append(AttemptContext(store, claim))
    return found


def one_round(store: Any, base: int, n: int) -> tuple[float, float, float]:
    """``(fn alone, first reach, replay)`` in milliseconds per call, over ``n`` fresh updates from ``base``."""
    store.record([message(base + i) for i in range(n)], base + n)
    contexts = claims(store, n)
    started = time.perf_counter()
    for _ in contexts:
        answer()
    alone = time.perf_counter() - started
    started = time.perf_counter()
    for ctx in contexts:
        ctx.step("work", answer)
    first = time.perf_counter() - started
    for ctx in contexts:
        store.release(ctx.identity, attempt_counts=False)
    contexts = claims(store, n)
    started = time.perf_counter()
    for ctx in contexts:
        assert ctx.step("work", _never) == {"text": "an answer", "tokens": 42}
    replay = time.perf_counter() - started
    for ctx in contexts:
        store.settle_many([ctx.identity])
    return alone * 1e3 / n, first * 1e3 / n, replay * 1e3 / n


def _never() -> None:
    raise AssertionError("a replayed step called its function")


def open_store(dsn: str | None, tmp: str) -> tuple[Any, str | None]:
    if dsn is None:
        from telegram_fence.store.sqlite import SqliteUpdateStore

        return SqliteUpdateStore(os.path.join(tmp, "bench.db")), None
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = f"tf_steps_bench_{uuid.uuid4().hex[:8]}"
    return PostgresUpdateStore(dsn, table=table), table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dsn", default=None, help="a PostgreSQL connection string (default: a SQLite file)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store, table = open_store(args.dsn, tmp)
        try:
            for r in range(args.rounds):
                alone, first, replay = one_round(store, 1 + r * args.n, args.n)
                rows.append((first - alone, replay - alone))
                print(f"round {r + 1}: {args.n} steps, fn alone {alone:.4f} ms, step {first:.3f} ms "
                      f"(adds {first - alone:.3f} ms), replay {replay:.3f} ms")
        finally:
            store.close()
            if table is not None and args.dsn is not None:
                from pg_cleanup import drop_store  # bench/ is the script's path

                drop_store(args.dsn, table)
    backend = "PostgreSQL" if args.dsn else "SQLite"
    print(f"median on {backend}: a step adds {statistics.median(r[0] for r in rows):.3f} ms per call; "
          f"a replay costs {statistics.median(r[1] for r in rows):.3f} ms")


if __name__ == "__main__":
    main()
