"""The fenced dispatcher's whole loop for a trivial handler on ONE thread, without HTTP: CPU per update.

    python bench/fence_loop.py                       # 5 rounds of 20,000 updates over 50 chats, batches of 100
    python bench/fence_loop.py --rounds 3 --n 50000 --no-states

Builds a real ``Fence`` (call journal and conversations on, as a user gets it; never started) and drives its
worker pool the way ``fence-dispatcher`` does in inline mode, on this thread: each batch (as the poller hands it
over, with its body) goes to ``Dispatcher.round``, which settles what finished, records and claims; the claims are
announced (``on_claimed``: the conversations' one query per round) and run by ``Inline.run`` (parse, the attempt
extensions, telebot's dispatch to one ``@bot.message_handler``, the inline loop's bookkeeping). No poller and no
other thread, so no waits for the interpreter lock: the figure is the fence's own CPU per update on the
dispatcher's path, steadier than ``bench/throughput.py`` on a shared machine. Prints the thread CPU per update of
each round and their median. A private benchmark of internals: it reads underscored names.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import telebot
from dispatcher_bench import message  # the dispatcher benchmark's updates (bench/ is the script's path)

from telegram_fence import Fence
from telegram_fence.runtime.assembly import build_pool
from telegram_fence.runtime.attempt import AttemptContext
from telegram_fence.runtime.handoff import RecordRequest


def one_round(n: int, chats: int, states: bool, journal: bool) -> float:
    """CPU µs per update of the dispatcher's path over ``n`` updates (a fresh file)."""
    bot = telebot.TeleBot("1:bench", threaded=False)
    handled = [0]

    @bot.message_handler(func=lambda m: True)
    def count(message: telebot.types.Message) -> None:
        handled[0] += 1

    bodies = []
    for b in range(n // 100):
        batch = [message(1 + b * 100 + i, 1 + (b * 100 + i) % chats) for i in range(100)]
        bodies.append(json.dumps({"ok": True, "result": batch}).encode())
    with tempfile.TemporaryDirectory() as tmp:
        fence = Fence(bot, os.path.join(tmp, "bench.db"), journal_calls=journal, states=None if states else False)
        fence._handlers.close()
        conversations = fence._conversations
        pool = build_pool(fence._capabilities, fence._settings, handle=fence._handlers.run,
                          on_exhausted=lambda: None, on_progress=lambda: None, on_tick=lambda: None,
                          on_fatal=print,
                          on_claimed=(lambda c: None) if conversations is None else conversations.claimed)
        pool.seat.seat(threading.current_thread())
        pool.state.handler_time.measured(0.0001)  # measured fast: inline mode
        dispatcher, mailbox, store = pool.dispatcher, pool.mailbox, fence.store
        parts = getattr(dispatcher, "_parts", None)

        def adopt(claims: list[Any]) -> list[AttemptContext]:
            """What the dispatcher does with a round's claims before running them (``RoundParts.adopt``; spelled out
            on a tree from before it)."""
            if parts is not None:
                return list(parts.adopt(claims))
            contexts = [AttemptContext(store, claim) for claim in claims]
            pool.state.leases.add(contexts)
            dispatcher._on_claimed(contexts)
            return contexts

        def run_left(contexts: list[AttemptContext]) -> None:
            """What an inline run left (its time budget ran out: a slice of this shared machine's CPU taken away)
            runs here as a worker would run it."""
            for ctx in contexts:
                ctx.begin_run()
                mailbox.file(ctx, pool.workers.attempt(ctx), time.monotonic())
            contexts.clear()

        finished: list[AttemptContext] = []
        cpu = time.thread_time()
        for body in bodies:
            batch = json.loads(body)["result"]
            request = RecordRequest(batch, batch[-1]["update_id"] + 1, {"body": body})
            claims, _more = dispatcher.round([request], finished, 256, True)
            contexts = adopt(claims)
            dispatcher.inline.run(contexts)
            run_left(contexts)
            finished = mailbox.take_finished()
        while handled[0] < n:  # the chats' later updates, claimed once the earlier ones settled
            claims, _more = dispatcher.round([], finished, 256, True)
            contexts = adopt(claims)
            dispatcher.inline.run(contexts)
            run_left(contexts)
            finished = mailbox.take_finished()
        dispatcher.round([], finished, 0, True)
        cpu = time.thread_time() - cpu
        fence.store.close()
    assert handled[0] == n, handled
    return cpu * 1e6 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-states", action="store_true", help="the fence with states=False")
    parser.add_argument("--no-journal", action="store_true", help="the fence with journal_calls=False")
    args = parser.parse_args()
    figures = []
    for r in range(args.rounds):
        figures.append(one_round(args.n, args.chats, not args.no_states, not args.no_journal))
        print(f"round {r + 1}: {figures[-1]:.2f} µs CPU per update", flush=True)
    print(f"median: {statistics.median(figures):.2f} µs CPU per update (n={args.n}, chats={args.chats}, "
          f"states={not args.no_states}, journal={not args.no_journal})")


if __name__ == "__main__":
    main()
