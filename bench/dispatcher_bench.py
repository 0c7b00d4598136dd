"""The dispatcher's work for a trivial handler on ONE thread, without HTTP: where the time of an update goes.

    python bench/dispatcher_bench.py              # 20,000 updates over 50 chats, batches of 100
    python bench/dispatcher_bench.py --n 50000 --chats 500

Feeds batches (as the poller would hand them over) to ``Dispatcher.round`` in inline mode, runs the
handlers the way the dispatcher does, and prints updates per second and the time of each SQL statement
(per update), measured around each ``execute``. A private benchmark of internals: it calls underscored names.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from typing import Any

import telebot

from telegram_fence.retry import default_retry
from telegram_fence.runtime.assembly import telebot_update
from telegram_fence.runtime.attempt import AttemptContext
from telegram_fence.runtime.handoff import RecordRequest
from telegram_fence.runtime.pool import WorkerPool
from telegram_fence.store.sqlite import SqliteUpdateStore

SQL_TIME: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])


class TimedConnection:
    """Wraps an APSW connection: times every ``execute`` (rows fetched inside the timing)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        rows = list(self._conn.execute(sql, *args, **kwargs))
        entry = SQL_TIME[" ".join(sql.split())[:60]]
        entry[0] += 1
        entry[1] += time.perf_counter() - start
        return _Rows(rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __enter__(self) -> Any:
        return self._conn.__enter__()

    def __exit__(self, *exc: object) -> Any:
        return self._conn.__exit__(*exc)


class _Rows(list):  # type: ignore[type-arg]
    def fetchone(self) -> Any:
        return self[0] if self else None

    def close(self) -> None:
        pass


def message(update_id: int, chat: int) -> dict[str, Any]:
    user = {"id": chat, "is_bot": False, "first_name": "User", "username": f"u{chat}"}
    return {"update_id": update_id, "message": {"message_id": update_id, "from": user,
                                                "chat": {**user, "type": "private"}, "date": 1700000000,
                                                "text": f"m{update_id}"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--backlog", type=int, default=900, help="record a batch while fewer are open")
    args = parser.parse_args()
    bot = telebot.TeleBot("1:bench", threaded=False)
    handled = [0]

    @bot.message_handler(func=lambda m: True)
    def count(message: telebot.types.Message) -> None:
        handled[0] += 1

    bodies = [json.dumps([message(1 + b * 100 + i, 1 + (b * 100 + i) % args.chats) for i in range(100)])
              for b in range(args.n // 100)]
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteUpdateStore(os.path.join(tmp, "bench.db"))
        plain_conn = store._conn
        store._conn = lambda: TimedConnection(plain_conn())  # type: ignore[method-assign]
        pool = WorkerPool(store=store, handle=lambda update, ctx: bot.process_new_updates([update]),
                          parse=telebot_update, workers=4, lease=30, max_attempts=5, retry=default_retry,
                          handler_timeout=300)
        finished: list[AttemptContext] = []
        start, cpu = time.perf_counter(), time.thread_time()
        next_batch = 0
        while handled[0] < args.n:
            request = None
            if next_batch < len(bodies) and store.backlog() < args.backlog:
                batch = json.loads(bodies[next_batch])
                next_batch += 1
                request = RecordRequest(batch, batch[-1]["update_id"] + 1, {})
            claims, _more = pool.dispatcher.round([request] if request is not None else [], finished, 256, True)
            finished = []
            for claim in claims:
                ctx = AttemptContext(store, claim)
                ctx.started = time.monotonic()
                if pool.workers.attempt(ctx) == "settle":
                    finished.append(ctx)
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
        store.close()
    n = args.n
    print(f"{n / elapsed:,.0f} updates/s: {elapsed * 1e6 / n:.1f} µs per update ({cpu * 1e6 / n:.1f} µs CPU)")
    sql = sum(t for _, t in SQL_TIME.values())
    print(f"SQL statements: {sql * 1e6 / n:.1f} µs per update")
    for text, (calls, seconds) in sorted(SQL_TIME.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"  {seconds * 1e6 / n:5.2f} µs/update  {calls:6d} calls  {text}")


if __name__ == "__main__":
    main()
