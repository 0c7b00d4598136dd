"""What durable conversations cost the fence's dispatcher thread per update, when no chat has one stored.

    python bench/conversation_overhead.py                  # 4 alternating pairs of 20,000 trivial updates
    python bench/conversation_overhead.py --pairs 2 --n 5000

The trivial handler is dispatched through telebot's ``@bot.message_handler`` (telebot asks the next-step backend
about every message), in one process with the fake Bot API server, alternating ``states=None`` (the fence's
conversations, the default) and ``states=False``. The dispatcher thread runs such fast handlers itself (inline
mode), so its CPU time per update (``time.thread_time`` over its whole life) holds the per-round question, the
attempt's bookkeeping and telebot's asks, and nothing of the fake server's or the poller's work: a steadier figure
than the rate on a loaded machine. Prints each run, then the median of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import telebot

from telegram_fence import Fence
from telegram_fence.runtime.dispatcher import Dispatcher
from telegram_fence.telegram import set_api_server
from telegram_fence.testing import FakeBotAPI

_CPU: list[float] = []  # the CPU seconds of each dispatcher thread that ended (a handover starts another)


def _measured(loop: Callable[[Dispatcher], None]) -> Callable[[Dispatcher], None]:
    def measured(self: Dispatcher) -> None:
        started = time.thread_time()
        try:
            loop(self)
        finally:
            _CPU.append(time.thread_time() - started)

    return measured


def run_once(states: bool, n: int, chats: int) -> tuple[float, float]:
    """One fenced run; returns (updates per second, dispatcher CPU µs per update)."""
    with tempfile.TemporaryDirectory() as tmp, FakeBotAPI(max_long_poll=1.0) as api:
        api.push_messages(n, chats=list(range(1, chats + 1)), text="m{i}")
        set_api_server(api.api_url)
        bot = telebot.TeleBot(api.token, threaded=False)
        done = threading.Event()
        count = [0]

        @bot.message_handler(func=lambda message: True)
        def trivial(message: telebot.types.Message) -> None:
            count[0] += 1  # one thread at a time: the dispatcher runs these inline
            if count[0] >= n:
                done.set()

        fence = Fence(bot, os.path.join(tmp, "bench.db"), workers=4, long_poll_timeout=1,
                      states=None if states else False)
        _CPU.clear()
        start = time.perf_counter()
        fence.start()
        done.wait()
        elapsed = time.perf_counter() - start
        fence.stop()
        fence.join(10)
        return n / elapsed, sum(_CPU) * 1e6 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--pairs", type=int, default=4)
    args = parser.parse_args()
    Dispatcher.loop = _measured(Dispatcher.loop)  # type: ignore[method-assign]
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for pair in range(args.pairs):
        for states in (True, False):
            rate, cpu = run_once(states, args.n, args.chats)
            results[states].append((rate, cpu))
            print(f"pair {pair + 1} {'states=None ' if states else 'states=False'}: {rate:8.0f}/s, dispatcher "
                  f"{cpu:5.1f} µs CPU/update", flush=True)
    on, off = (statistics.median(cpu for _rate, cpu in results[flag]) for flag in (True, False))
    print(f"median dispatcher CPU per update: conversations {on:.1f} µs, states=False {off:.1f} µs "
          f"(+{on - off:.1f} µs, {100 * (on - off) / off:+.1f}%)")


if __name__ == "__main__":
    main()
