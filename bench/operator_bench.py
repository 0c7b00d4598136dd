"""Benchmarks for the operator channel's post() and the JSON log formatter (run by hand, not in CI).

    python3 bench/operator_bench.py              # full run (~20 s)
    python3 bench/operator_bench.py --quick      # smaller counts, for a smoke test

1. ``OperatorChannel.post()`` cost per call (p50/p99/max, µs) while the sending thread is blocked on a
   ``sendMessage`` the fake Bot API server delays by 5 s: first below capacity, then with the queue full
   (every post drops the oldest message).
2. ``JsonFormatter`` throughput in lines per second through ``logging`` to a null stream and to a file:
   a plain info line with four fields, the same with three configured secrets, and an error line with a
   two-exception chain (``exc_info``).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import telebot

from telegram_fence.delivery.operator import OperatorChannel
from telegram_fence.jsonlog import JsonFormatter, JsonLineHandler
from telegram_fence.testing import FakeBotAPI


def percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def bench_post(posts: int, capacity: int) -> list[tuple[str, int, float, float, float]]:
    """Return rows (phase, calls, p50 µs, p99 µs, max µs) of post() with the sender blocked."""
    rows = []
    with FakeBotAPI() as api:
        bot = telebot.TeleBot(api.token, threaded=False)
        api.delay("sendMessage", 5)
        channel = OperatorChannel(bot, -1, capacity=capacity)
        channel.post("first: takes the sender into the 5 s delay")
        deadline = time.monotonic() + 5
        while not api.calls_to("sendMessage") and time.monotonic() < deadline:
            time.sleep(0.001)
        assert api.calls_to("sendMessage"), "the sender never reached the server"
        text = "watchdog: worker 3 stalled for 30 s on update 123456"
        clock = time.perf_counter_ns
        for phase, count in (("below capacity", capacity), ("queue full (drops oldest)", posts)):
            samples = []
            for _ in range(count):
                start = clock()
                channel.post(text)
                samples.append((clock() - start) / 1000)
            samples.sort()
            rows.append((phase, count, percentile(samples, 0.50), percentile(samples, 0.99), samples[-1]))
        assert api.sent == [], "the delayed send finished during the measurement; results invalid"
        dropped = channel.dropped
        channel.close(timeout=0)
        api.stop(timeout=0.1)
    assert dropped == posts, (dropped, posts)
    return rows


def bench_log(lines: int) -> list[tuple[str, str, int, float]]:
    """Return rows (case, sink, lines, lines per second) for JsonFormatter through logging."""
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="jsonlog-bench-"))
    token = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawq"

    def chain() -> BaseException:
        try:
            try:
                raise ConnectionError(f"connection refused for /bot{token}/getUpdates")
            except ConnectionError as inner:
                raise RuntimeError("poller gave up") from inner
        except RuntimeError as outer:
            return outer
        raise AssertionError("unreachable")

    exc = chain()
    cases: list[tuple[str, dict[str, object], Callable[[logging.Logger], None]]] = [
        (
            "info + 4 fields",
            {},
            lambda log: log.info(
                "update settled", extra={"update_id": 1234, "attempt": 1, "claim_id": "c0ffee", "chat_id": -5}
            ),
        ),
        (
            "info + 4 fields, 3 secrets",
            {"secrets": ["db-password-123", "api-key-xyz", "webhook-secret"]},
            lambda log: log.info(
                "update settled", extra={"update_id": 1234, "attempt": 1, "claim_id": "c0ffee", "chat_id": -5}
            ),
        ),
        (
            "error + exc_info chain of 2",
            {},
            lambda log: log.error("poller ended", exc_info=exc, extra={"update_id": 1234}),
        ),
    ]
    for case, kw, emit in cases:
        for sink in ("null stream", "file"):
            path = os.devnull if sink == "null stream" else str(tmp / "bench.jsonl")
            with open(path, "w", encoding="utf-8") as stream:
                handler = JsonLineHandler(stream, JsonFormatter(name="bench", **kw))  # type: ignore[arg-type]
                log = logging.getLogger(f"bench.{case}.{sink}")
                log.handlers[:] = [handler]
                log.propagate = False
                log.setLevel(logging.INFO)
                count = lines if "exc_info" not in case else max(1, lines // 5)
                for _ in range(min(1000, count)):  # warm up (linecache, caches)
                    emit(log)
                start = time.perf_counter()
                for _ in range(count):
                    emit(log)
                elapsed = time.perf_counter() - start
                log.handlers.clear()
            rows.append((case, sink, count, count / elapsed))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    parser.add_argument("--posts", type=int, default=200_000)
    parser.add_argument("--capacity", type=int, default=100)
    parser.add_argument("--lines", type=int, default=100_000)
    args = parser.parse_args(argv)
    posts, lines = (5_000, 5_000) if args.quick else (args.posts, args.lines)
    logging.getLogger("telegram_fence").addHandler(logging.NullHandler())  # keep the library's own logs quiet

    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}")
    print()
    print(f"OperatorChannel.post() with the sender blocked (sendMessage delayed 5 s), capacity {args.capacity}")
    print()
    print("| phase | calls | p50 µs | p99 µs | max µs |")
    print("|---|---:|---:|---:|---:|")
    for phase, count, p50, p99, worst in bench_post(posts, args.capacity):
        print(f"| {phase} | {count:,} | {p50:.2f} | {p99:.2f} | {worst:.0f} |")
    print()
    print("JsonFormatter through logging.Logger + JsonLineHandler (one write per line)")
    print()
    print("| case | sink | lines | lines/s |")
    print("|---|---|---:|---:|")
    for case, sink, count, rate in bench_log(lines):
        print(f"| {case} | {sink} | {count:,} | {rate:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
