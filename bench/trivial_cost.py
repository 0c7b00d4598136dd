"""Where the CPU of a trivial update goes: plain telebot, the fence, and the two parts any fenced pipeline pays.

    python bench/trivial_cost.py                     # 20,000 updates over 50 chats, 3 alternating rounds
    python bench/trivial_cost.py --n 5000 --rounds 1 --room 40,200

Four measurements of the same backlog (a handler that only counts the message), CPU per update, medians:

- ``plain``: ``TeleBot(token, threaded=False).polling()`` (as ``bench/throughput.py`` runs it);
- ``fence``: the same bot under ``Fence(bot, "bench.db")`` with its defaults (as ``bench/throughput.py`` runs it);
- ``handoff``: no store at all. A poller thread asks ``getUpdates`` and hands each batch to a writer thread, which
  hands each chat's next update to ``--workers`` threads (one update of a chat at a time) and takes it back when
  telebot's ``process_new_updates`` returned. The three hand-offs of the fence's pipeline and telebot's own parsing,
  with nothing recorded;
- ``store R``: the SQLite store alone, on one thread, without HTTP or telebot: each batch of 100 recorded, then
  rounds that settle what the last round claimed and claim up to ``R`` updates (``--room``), one per chat, in one
  transaction each (what the fence's writer asks of it). The updates are spread over ``R`` chats when ``--chats``
  is fewer, so that a round can fill.

``handoff + store`` is a floor for any design that records, claims and settles every update in SQLite and runs its
handler on a worker thread: what is left of the fence's figure above it is the fence's own bookkeeping (leases,
conversations, the call journal, hints). Every part runs in a child process of its own against
``telegram_fence.testing.FakeBotAPI`` (the store part needs no server).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import throughput
from bytecode import cache_dir, child_env  # bench/ is the script's path


def handoff_child(api_url: str, token: str, n: int, workers: int) -> None:
    """Run the store-less pipeline until ``n`` handlers returned; print the rate and the CPU per update."""
    import telebot
    from telebot.types import Update

    bot = telebot.TeleBot(token, threaded=False)
    done = threading.Event()
    count = [0]
    lock = threading.Lock()

    @bot.message_handler(func=lambda m: True)
    def trivial(message: telebot.types.Message) -> None:
        with lock:
            count[0] += 1
            if count[0] >= n:
                done.set()

    inbox: queue.SimpleQueue[tuple[str, Any, threading.Event | None]] = queue.SimpleQueue()
    ready: deque[dict[str, Any]] = deque()
    wake = threading.Condition()

    def poll() -> None:
        url = urlsplit(api_url.format(token, "getUpdates"))  # telebot's API_URL form: .../bot{0}/{1}
        conn = http.client.HTTPConnection(url.netloc)
        offset = 0
        while not done.is_set():
            conn.request("GET", f"{url.path}?offset={offset}&timeout=1")
            updates = json.loads(conn.getresponse().read())["result"]
            if updates:
                offset = updates[-1]["update_id"] + 1
                answered = threading.Event()
                inbox.put(("batch", updates, answered))
                answered.wait()  # as the fence's poller waits for the commit before it asks again

    def write() -> None:
        waiting: dict[int, deque[dict[str, Any]]] = {}
        busy: set[int] = set()
        while not done.is_set():
            try:
                kind, item, answered = inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            if kind == "batch":
                for update in item:
                    waiting.setdefault(update["message"]["chat"]["id"], deque()).append(update)
                assert answered is not None
                answered.set()
            else:
                busy.discard(item["message"]["chat"]["id"])
            due = [updates.popleft() for chat, updates in waiting.items() if updates and chat not in busy]
            busy.update(update["message"]["chat"]["id"] for update in due)
            if due:
                with wake:
                    ready.extend(due)
                    wake.notify(len(due))

    def work() -> None:
        while not done.is_set():
            with wake:
                while not ready:
                    if not wake.wait(0.5) and done.is_set():
                        return
                update = ready.popleft()
            bot.process_new_updates([Update.de_json(update)])
            inbox.put(("done", update, None))

    threads = [threading.Thread(target=poll, name="poll", daemon=True),
               threading.Thread(target=write, name="write", daemon=True)]
    threads += [threading.Thread(target=work, name=f"work-{i}", daemon=True) for i in range(workers)]
    start, cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.start()
    done.wait()
    elapsed, used = time.perf_counter() - start, time.process_time() - cpu
    print(json.dumps({"rate": n / elapsed, "cpu_us": used * 1e6 / n}))


def store_child(n: int, chats: int, room: int) -> None:
    """Record ``n`` updates in batches of 100 and run them through settle-and-claim rounds of up to ``room``."""
    from telegram_fence.store.sqlite import SqliteUpdateStore

    updates = [{"update_id": i + 1, "message": {
        "message_id": i + 1, "date": 0, "text": f"m{i}", "chat": {"id": i % chats + 1, "type": "private"},
        "from": {"id": i % chats + 1, "is_bot": False, "first_name": "u"}}} for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteUpdateStore(os.path.join(tmp, "bench.db"))
        claimed: list[Any] = []
        recorded = settled = 0
        start, cpu = time.perf_counter(), time.process_time()
        while settled < n:
            batch = updates[recorded:recorded + 100]
            recorded += len(batch)
            with store.write(durable=bool(batch)):
                if batch:
                    store.record(batch, recorded + 1)
                hinted = {u["message"]["chat"]["id"] for u in batch} | {c.chat_id for c in claimed}
                _, claims, _ = store.exchange([c.identity for c in claimed], 30.0, room,
                                              known={u["update_id"]: u for u in batch},
                                              chats=hinted if batch else None)
            settled += len(claimed)
            claimed = claims
        elapsed, used = time.perf_counter() - start, time.process_time() - cpu
        store.close()
    print(json.dumps({"rate": n / elapsed, "cpu_us": used * 1e6 / n}))


def run_child(args: list[str], pycache: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True,
                         timeout=900, env=child_env(pycache))
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_handoff(n: int, chats: int, workers: int, pycache: str) -> dict[str, float]:
    from telegram_fence.testing import FakeBotAPI

    with FakeBotAPI(max_long_poll=1.0) as api:
        api.push_messages(n, chats=list(range(1, chats + 1)), text="m{i}")
        return run_child(["handoff", api.api_url, api.token, str(n), str(workers)], pycache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4, help="the handoff pipeline's worker threads")
    parser.add_argument("--room", default="40,200", help="claims per store round, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs="+", metavar="ARG")
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "handoff":
            handoff_child(rest[0], rest[1], int(rest[2]), int(rest[3]))
        else:
            store_child(int(rest[0]), int(rest[1]), int(rest[2]))
        return
    pycache = cache_dir("tf-trivial-cost-pyc-").name
    throughput._PYCACHE = pycache  # its children read the same compiled bytecode as these
    rooms = [int(room) for room in args.room.split(",")]
    parts: dict[str, list[float]] = {}

    def measure(name: str, figures: dict[str, float]) -> None:
        parts.setdefault(name, []).append(figures["cpu_us"])
        print(f"{name:10s} {figures['rate']:8.0f}/s {figures['cpu_us']:6.1f} µs CPU per update", flush=True)

    run_handoff(50, args.chats, args.workers, pycache)  # unrecorded: writes the bytecode the others read
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}", flush=True)
        measure("plain", throughput.run_one("plain", "trivial", args.n, args.chats, 0))
        measure("fence", throughput.run_one("fence", "trivial", args.n, args.chats, 0))
        measure("handoff", run_handoff(args.n, args.chats, args.workers, pycache))
        for room in rooms:
            chats = str(max(args.chats, room))
            measure(f"store {room}", run_child(["store", str(args.n), chats, str(room)], pycache))
    median = {name: statistics.median(values) for name, values in parts.items()}
    plain = median["plain"]
    print(f"medians of {args.rounds} rounds, CPU per update (x plain's {plain:.1f} µs):")
    for name, value in median.items():
        print(f"  {name:24s} {value:6.1f} µs  {value / plain:4.2f}x")
    for room in rooms:
        floor = median["handoff"] + median[f"store {room}"]
        print(f"  {'handoff + store ' + str(room):24s} {floor:6.1f} µs  {floor / plain:4.2f}x")


if __name__ == "__main__":
    main()
