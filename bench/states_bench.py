"""The cost of durable conversation state per update: a fenced bot with telebot's memory storage vs. the fence's.

    python bench/states_bench.py                         # SQLite, 3 alternating rounds of 2,000 updates
    python bench/states_bench.py --store postgres --dsn "host=127.0.0.1 user=postgres dbname=test"

All updates are pushed to the fake Bot API server (in this process) before the fence starts; each variant runs
the same bot in a fresh fence and store, one after another, alternating, so load on the machine hits them alike:

- ``memory``: ``Fence(..., states=False)``: telebot's ``StateMemoryStorage`` and memory handler backends;
- ``fence-idle``: the fence's storage, a handler that never touches a state (telebot still asks the next-step
  backend for every message);
- ``fence-read``: the fence's storage, ``bot.get_state`` once per update;
- ``fence-write``: the fence's storage, ``bot.set_state`` once per update (the state alternates, so every update
  writes).

Prints per variant the median wall-clock µs per update and the CPU µs per update of this process (the fake
server runs in it too, alike for every variant; CPU time moves less with the load of other processes), each with
the extra against ``memory``, and the store transactions per update the run opened (fenced ``transaction()``
commits and ``write()`` blocks, counted on the store object; SQLite's ``read()`` is not a transaction).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import telebot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from telegram_fence import Fence, SqliteUpdateStore
from telegram_fence.testing import FakeBotAPI

VARIANTS = ("memory", "fence-idle", "fence-read", "fence-write")


class Counting:
    """Counts the store's ``transaction()`` and ``write()`` blocks (wrapping the methods of this one object)."""

    def __init__(self, store: Any) -> None:
        self.transactions = 0
        self.writes = 0
        transaction, write = store.transaction, store.write

        def counted_transaction(*args: Any, **kwargs: Any) -> Any:
            self.transactions += 1
            return transaction(*args, **kwargs)

        def counted_write(*args: Any, **kwargs: Any) -> Any:
            self.writes += 1
            return write(*args, **kwargs)

        store.transaction = counted_transaction
        store.write = counted_write


def open_store(kind: str, dsn: str | None, workdir: str) -> tuple[Any, str | None]:
    if kind == "sqlite":
        return SqliteUpdateStore(Path(workdir) / f"{uuid.uuid4().hex}.db"), None
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = f"tf_bench_states_{uuid.uuid4().hex[:10]}"
    return PostgresUpdateStore(dsn or "", table=table), table


def drop(dsn: str | None, table: str | None) -> None:
    if table is not None:
        from pg_cleanup import drop_store  # bench/ is the script's path

        drop_store(dsn or "", table)


def run_once(variant: str, n: int, kind: str, dsn: str | None, workdir: str) -> tuple[float, float, float]:
    """One run: (wall µs per update, CPU µs per update of this process, store transactions per update)."""
    with FakeBotAPI(max_long_poll=0.2) as api:
        api.push_messages(n, chats=list(range(1, 51)))
        bot = telebot.TeleBot(api.token, threaded=False)
        done = threading.Event()
        count = [0]

        @bot.message_handler(func=lambda m: True)
        def handle(message: telebot.types.Message) -> None:
            if variant == "fence-read":
                bot.get_state(message.from_user.id, message.chat.id)
            elif variant == "fence-write":
                bot.set_state(message.from_user.id, f"s{message.message_id % 2}", message.chat.id)
            count[0] += 1
            if count[0] == n:
                done.set()

        store, table = open_store(kind, dsn, workdir)
        counting = Counting(store)
        fence = Fence(bot, store, states=False if variant == "memory" else None, long_poll_timeout=0.2)
        started = time.perf_counter()
        cpu = time.process_time()
        fence.start()
        assert done.wait(600), f"{variant}: only {count[0]} of {n} handled"
        while fence.stats()["settled"] < n:  # the last settles commit after the handlers returned
            time.sleep(0.005)
        elapsed = time.perf_counter() - started
        used = time.process_time() - cpu
        fence.stop()
        fence.join(15)
        store.close()
        drop(dsn, table)
    return elapsed / n * 1e6, used / n * 1e6, (counting.transactions + counting.writes) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as workdir:
        for round_ in range(args.rounds):
            for variant in VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS)):
                us, cpu, tx = run_once(variant, args.n, args.store, args.dsn, workdir)
                results[variant].append((us, cpu, tx))
                print(f"round {round_ + 1} {variant:<12} {us:8.1f} µs/update  {cpu:8.1f} CPU µs/update  "
                      f"{tx:5.2f} transactions/update", flush=True)
    base = statistics.median(r[0] for r in results["memory"])
    base_cpu = statistics.median(r[1] for r in results["memory"])
    print(f"\n{args.store}, {args.n} updates over 50 chats, median of {args.rounds} rounds")
    for variant in VARIANTS:
        us = statistics.median(r[0] for r in results[variant])
        cpu = statistics.median(r[1] for r in results[variant])
        tx = statistics.median(r[2] for r in results[variant])
        print(f"{variant:<12} {us:8.1f} µs/update (+{us - base:6.1f})  {cpu:8.1f} CPU µs/update "
              f"(+{cpu - base_cpu:6.1f})  {tx:5.2f} store transactions/update")
    return 0


if __name__ == "__main__":
    sys.exit(main())
