"""Where a fenced echo update's time goes on a worker: a timeline of each step, and the CPU of each thread.

    python bench/echo_timeline.py --store postgres --dsn "host=127.0.0.1 user=postgres dbname=test" --n 800
    python bench/echo_timeline.py --n 800 --no-journal          # SQLite, the call journal off

The echo bot of ``bench/throughput.py`` (one ``sendMessage`` per update, answered by the fake Bot API server after
20 ms, updates over 50 chats, 4 workers) runs in this process, with the fake server. Timestamps are taken around the
worker's steps (the attempt, the journal's intent and outcome, the filing of the finished attempt) by wrapping
those methods; each step's median and mean over the updates after the first 20 are printed, then the CPU each kind
of thread used per update (``/proc``). The server shares the interpreter: read the steps, not the rate.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import telebot

from telegram_fence import Fence
from telegram_fence.calls.journal import Journal
from telegram_fence.runtime.mailbox import Mailbox
from telegram_fence.runtime.workers import Workers
from telegram_fence.telegram import set_api_server
from telegram_fence.testing import FakeBotAPI

_MARKS: dict[str, list[tuple[str, float]]] = {}


def _mark(label: str) -> None:
    _MARKS.setdefault(threading.current_thread().name, []).append((label, time.perf_counter()))


def _wrap(cls: type, name: str, label: str) -> None:
    original: Callable[..., Any] = getattr(cls, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        _mark(label + "0")
        try:
            return original(*args, **kwargs)
        finally:
            _mark(label + "1")

    setattr(cls, name, timed)


def _cpu_by_thread() -> Counter[str]:
    used: Counter[str] = Counter()
    tick = os.sysconf("SC_CLK_TCK")
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = re.sub(r"-\d+$", "-N", re.sub(r"fake-bot-api:\d+", "fake-bot-api", thread.name))
        used[kind] += (int(fields[11]) + int(fields[12])) / tick
    return used


def _steps() -> dict[str, list[float]]:
    """Milliseconds per step and per update, from the workers' marks."""
    steps: dict[str, list[float]] = {}
    for thread, marks in _MARKS.items():
        if not thread.startswith("fence-worker"):
            continue
        last: dict[str, float] = {}
        for label, at in marks:
            for step, start, end in (("intent", "intent0", "intent1"), ("send (HTTP)", "intent1", "outcome0"),
                                     ("outcome", "outcome0", "outcome1"), ("attempt", "attempt0", "attempt1"),
                                     ("file", "file0", "file1"), ("wait for the next claim", "file1", "attempt0"),
                                     ("cycle", "attempt0", "attempt0")):
                if label == end and start in last:
                    steps.setdefault(step, []).append((at - last[start]) * 1000)
            last[label] = at
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=800)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--dsn", default=os.environ.get("TELEGRAM_FENCE_PG_DSN"))
    parser.add_argument("--no-journal", action="store_true")
    args = parser.parse_args()
    _wrap(Journal, "open_call", "intent")
    _wrap(Journal, "record", "outcome")
    _wrap(Workers, "attempt", "attempt")
    _wrap(Mailbox, "file", "file")
    table = f"tf_timeline_{uuid.uuid4().hex[:10]}"
    tmp = f"/tmp/{table}.db"
    if args.store == "postgres":
        from telegram_fence.store.postgres import PostgresUpdateStore

        if not args.dsn:
            parser.error("--store postgres needs --dsn (or TELEGRAM_FENCE_PG_DSN)")
        store: Any = PostgresUpdateStore(args.dsn, table=table)
    else:
        store = tmp
    n = args.n
    try:
        with FakeBotAPI(max_long_poll=1.0, latency={"sendMessage": 0.02}) as api:
            api.push_messages(n, chats=list(range(1, 51)), text="m{i}")
            set_api_server(api.api_url)
            bot = telebot.TeleBot(api.token, threaded=False)
            done, lock, count = threading.Event(), threading.Lock(), [0]

            @bot.message_handler(func=lambda m: True)
            def echo(message: telebot.types.Message) -> None:
                bot.send_message(message.chat.id, message.text)
                with lock:
                    count[0] += 1
                    if count[0] >= n:
                        done.set()

            fence = Fence(bot, store, workers=args.workers, long_poll_timeout=1, journal_calls=not args.no_journal)
            start = time.perf_counter()
            fence.start()
            done.wait()
            elapsed = time.perf_counter() - start
            cpu = _cpu_by_thread()
            fence.stop()
            fence.join(10)
    finally:
        _drop(args, store, table, tmp)
    journal = "off" if args.no_journal else "on"
    print(f"store={args.store} journal={journal} N={n} workers={args.workers}: {n / elapsed:.1f} updates/s "
          "(the fake server runs in this process)")
    for step, values in _steps().items():
        kept = values[20:] if len(values) > 40 else values
        print(f"  {step:24s} median {statistics.median(kept):7.2f} ms  mean {statistics.mean(kept):7.2f} ms  "
              f"({len(kept)} updates)")
    print("CPU per update by thread: " + ", ".join(f"{kind} {1000 * used / n:.2f} ms"
                                                   for kind, used in cpu.most_common(6)))


def _drop(args: argparse.Namespace, store: Any, table: str, tmp: str) -> None:
    if args.store == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(tmp + suffix):
                os.remove(tmp + suffix)
        return
    import psycopg

    from telegram_fence.store.postgres import table_names

    store.close()
    with psycopg.connect(str(args.dsn), autocommit=True) as conn:
        for name in table_names(table):
            conn.execute(f"DROP TABLE IF EXISTS {name}")
        conn.execute(f"DROP FUNCTION IF EXISTS {table}_calls_prune()")


if __name__ == "__main__":
    main()
