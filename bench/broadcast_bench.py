"""Broadcast benchmarks (run by hand): journal overhead, throughput, pacing accuracy, resume time.

    python3 bench/broadcast_bench.py [--recipients 5000] [--paced 300] [--rate 30] [--journal-lines 100000]

Everything runs against the in-process fake Bot API server (real HTTP on 127.0.0.1) with journals in a
temporary directory on the same file system as ``--dir`` (default: the system temp dir). Prints a
Markdown report.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import telebot

from telegram_fence.delivery.broadcast import JOURNAL_FILE, Broadcast
from telegram_fence.delivery.broadcast_journal import JournalState, JournalWriter, replay
from telegram_fence.testing import FakeBotAPI


def bench_journal(directory: Path, n: int) -> float:
    """µs per recipient for the journal alone: intent + outcome lines, each appended and fdatasynced."""
    path = directory / "journal-only.jsonl"
    path.write_bytes(b"")
    audience: list[int | str] = list(range(1, n + 1))
    state = JournalState(audience)
    writer = JournalWriter(path, 0)
    start = time.perf_counter()
    for i, chat in enumerate(audience):
        writer.record(state, {"ev": "intent", "i": i, "chat": chat})
        writer.record(state, {"ev": "sent", "i": i, "msg": i})
    elapsed = time.perf_counter() - start
    writer.close()
    return elapsed / n * 1e6


def bench_throughput(directory: Path, n: int) -> tuple[float, float, float]:
    """(plain loop sends/s, broadcast sends/s, overhead µs per recipient), no rate limit."""
    with FakeBotAPI() as api:
        bot = telebot.TeleBot(api.token, threaded=False)
        chats = list(range(1, n + 1))
        bot.send_message(1, "warm-up")
        start = time.perf_counter()
        for chat in chats:
            bot.send_message(chat, "plain loop")
        plain = time.perf_counter() - start

        broadcast = Broadcast(bot, directory, "throughput")
        broadcast.create(chats, "broadcast")
        start = time.perf_counter()
        report = broadcast.run(rate=math.inf)
        fenced = time.perf_counter() - start
        assert report.sent == n, report
    return n / plain, n / fenced, (fenced - plain) / n * 1e6


def bench_paced(directory: Path, n: int, rate: float) -> tuple[float, float, float]:
    """(achieved rate from the server's arrival times, smallest gap s, most sends in any 1-s window)."""
    with FakeBotAPI() as api:
        bot = telebot.TeleBot(api.token, threaded=False)
        broadcast = Broadcast(bot, directory, "paced")
        broadcast.create(range(1, n + 1), "paced")
        report = broadcast.run(rate=rate)
        assert report.sent == n, report
        times = [c.time for c in api.calls_to("sendMessage")]
    achieved = (len(times) - 1) / (times[-1] - times[0])
    gaps = [b - a for a, b in itertools.pairwise(times)]
    most, j = 0, 0
    for i, t in enumerate(times):  # half-open windows [t, t + 1)
        while times[j] <= t - 1.0:
            j += 1
        most = max(most, i - j + 1)
    return achieved, min(gaps), most


def bench_resume(directory: Path, lines: int) -> tuple[float, float, float]:
    """(replay s, status() s, run() s) for a journal of ``lines`` lines whose recipients are all decided."""
    recipients = lines // 2
    broadcast = Broadcast(telebot.TeleBot("1:" + "x" * 35, threaded=False), directory, "resume")
    broadcast.create(range(1, recipients + 1), "resume")
    t = int(time.time() * 1000)
    with open(directory / "resume" / JOURNAL_FILE, "w") as f:
        for i in range(recipients):
            f.write(json.dumps({"ev": "intent", "i": i, "chat": i + 1, "t": t}, separators=(",", ":")) + "\n")
            f.write(json.dumps({"ev": "sent", "i": i, "msg": 1, "t": t}, separators=(",", ":")) + "\n")
    data = (directory / "resume" / JOURNAL_FILE).read_bytes()
    replays = []
    for _ in range(3):
        start = time.perf_counter()
        replay(data, list(range(1, recipients + 1)))
        replays.append(time.perf_counter() - start)
    start = time.perf_counter()
    broadcast.status()
    status = time.perf_counter() - start
    start = time.perf_counter()
    report = broadcast.run(rate=math.inf)  # everyone decided: reads, recovers, returns
    run = time.perf_counter() - start
    assert report.sent == recipients, report
    return statistics.median(replays), status, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipients", type=int, default=5000, help="recipients for the unpaced run")
    parser.add_argument("--paced", type=int, default=300, help="recipients for the paced run")
    parser.add_argument("--rate", type=float, default=30.0, help="rate for the paced run")
    parser.add_argument("--journal-lines", type=int, default=100_000, help="journal size for the resume test")
    parser.add_argument("--dir", default=None, help="where to put journals (default: system temp dir)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        journal_us = bench_journal(directory, args.recipients)
        plain, fenced, overhead = bench_throughput(directory, args.recipients)
        achieved, min_gap, most = bench_paced(directory, args.paced, args.rate)
        replay_s, status_s, run_s = bench_resume(directory, args.journal_lines)

    print(f"## Broadcast benchmark ({os.cpu_count()} CPUs, Python {sys.version.split()[0]}, journals under {tmp})\n")
    print("| measure | value |")
    print("|---|---|")
    print(f"| journal alone: intent + outcome, each fdatasynced | {journal_us:.0f} µs per recipient |")
    print(f"| plain `send_message` loop, fake server, {args.recipients} chats | {plain:.0f} sends/s |")
    print(f"| `Broadcast.run(rate=inf)`, same server | {fenced:.0f} sends/s |")
    print(f"| broadcast overhead over the plain loop | {overhead:.0f} µs per recipient |")
    print(
        f"| `run(rate={args.rate:g})`, {args.paced} chats: achieved rate | {achieved:.2f}/s "
        f"({(achieved / args.rate - 1) * 100:+.2f} %) |"
    )
    print(f"| paced: smallest gap between sends / most sends in any 1 s window | {min_gap * 1000:.1f} ms / {most} |")
    print(f"| resume, {args.journal_lines} journal lines: replay only | {replay_s * 1000:.0f} ms |")
    print(f"| resume, {args.journal_lines} journal lines: `status()` | {status_s * 1000:.0f} ms |")
    print(f"| resume, {args.journal_lines} journal lines: `run()` (lock, replay, return) | {run_s * 1000:.0f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
