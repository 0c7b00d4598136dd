"""What the attempt's wrapping costs per update: the extensions' begin and end around a trivial handler.

    python bench/attempt_overhead.py                # 5 rounds of 20,000 attempts, call journal on, states=False
    python bench/attempt_overhead.py --rounds 3 --n 50000

Builds a real ``Fence`` on a temporary SQLite file (never started), claims ``--n`` updates through the store,
then runs its handler choice (``HandlerChoice.run``: ``runtime.attempt.running`` with the call journal as the
attempt extension, then telebot's dispatch to one ``@bot.message_handler``) on each claim, on this one thread.
Parsing and the settle are outside the timing. Prints the thread CPU time per attempt of each round and their
median. A private benchmark of internals: it reads underscored names. Conversations are off (``states=False``):
their begin reads ahead unless the dispatcher's round announced the chat, which this bench does not run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import telebot

from telegram_fence import Fence
from telegram_fence.runtime.assembly import telebot_update
from telegram_fence.runtime.attempt import AttemptContext
from telegram_fence.store.sqlite import SqliteUpdateStore


def message(update_id: int, chats: int) -> dict[str, object]:
    user = {"id": chats + update_id % 50, "is_bot": False, "first_name": "User"}
    return {"update_id": update_id, "message": {"message_id": update_id, "from": user,
                                                "chat": {**user, "type": "private"}, "date": 1700000000,
                                                "text": f"m{update_id}"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    bot = telebot.TeleBot("1:bench", threaded=False)
    handled = [0]

    @bot.message_handler(func=lambda m: True)
    def count(message: telebot.types.Message) -> None:
        handled[0] += 1

    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteUpdateStore(os.path.join(tmp, "bench.db"))
        fence = Fence(bot, store, states=False)
        run = fence._handlers.run
        for r in range(args.rounds):
            base = 1 + r * args.n
            updates = [message(base + i, 1 + r * 50) for i in range(args.n)]  # fresh chats: free lines
            _, claims = store.record_and_claim(updates, base + args.n, lease=300, limit=args.n, run=args.n)
            work = [(telebot_update(c.update), AttemptContext(store, c)) for c in claims]
            cpu = time.thread_time()
            for update, ctx in work:
                run(update, ctx)
            cpu = time.thread_time() - cpu
            figures.append(cpu * 1e6 / len(work))
            print(f"round {r + 1}: {len(work)} attempts, {figures[-1]:.2f} µs CPU per attempt")
        store.close()
    assert handled[0] == args.n * args.rounds, handled
    print(f"median: {statistics.median(figures):.2f} µs CPU per attempt")


if __name__ == "__main__":
    main()
