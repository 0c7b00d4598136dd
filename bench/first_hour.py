"""What a new user feels in the first hour: plain telebot vs. the fenced bot, both at default settings.

    python bench/first_hour.py  # the first-hour table (about 3 minutes)
    python bench/first_hour.py --stops 5 --idle 10 --messages 400 --json

Each bot runs in its own child process against the fake Bot API server (in this process), which
honours the long-poll timeout the bot asks for (telebot's ``infinity_polling`` asks 20 s, the fence
25 s). Both bots echo every message with one ``sendMessage``:

- plain: ``telebot.TeleBot(token)`` (threaded, the default) and ``bot.infinity_polling()``;
- fenced: ``telebot.TeleBot(token, threaded=False)`` and ``Fence(bot, "bot.db").run()``.

Measured, per bot:

- stop time: SIGINT (Ctrl-C) and SIGTERM sent to an idle bot (one message handled, then idle in a
  long poll), until the process exited; the exit code and whether stderr has a WARNING or a traceback;
- wakeups per second while idle: the growth of ``voluntary_ctxt_switches`` summed over every thread
  (``/proc/PID/task/*/status``) over ``--idle`` seconds, divided by the seconds;
- idle RSS (``VmRSS`` while idle) and peak RSS (``VmHWM`` after the latency run);
- reply latency at ``--rate`` messages per second: from the push of a message to the arrival of its
  echo at the fake server, p50 and p99 over ``--messages`` messages spread over 10 chats.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from telegram_fence.testing import FakeBotAPI  # noqa: E402

MODES = ("plain", "fenced")


# --- the child: one bot ---------------------------------------------------------------------------


def child(mode: str, api_url: str, token: str, db: str) -> int:
    import telebot
    from telebot import apihelper

    apihelper.API_URL = api_url
    bot = telebot.TeleBot(token) if mode == "plain" else telebot.TeleBot(token, threaded=False)

    @bot.message_handler(func=lambda message: True)
    def echo(message: Any) -> None:
        bot.send_message(message.chat.id, message.text)

    if mode == "plain":
        bot.infinity_polling()
        return 0
    from telegram_fence import Fence

    return Fence(bot, db).run()


# --- measuring ------------------------------------------------------------------------------------


def _spawn(mode: str, api: FakeBotAPI, workdir: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    db = os.path.join(workdir, f"{mode}-{time.monotonic_ns()}.db")
    return subprocess.Popen(
        [sys.executable, __file__, "child", mode, api.api_url, api.token, db],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # As from a terminal: a shell starts background jobs with SIGINT ignored, and a child that
        # inherits that never sees Ctrl-C (plain telebot then ignores it; the fence sets its own handler).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _warm_idle(api: FakeBotAPI, proc: subprocess.Popen[str]) -> None:
    """One message handled, then the bot sits in a long poll."""
    api.push_message(1, "warm-up")
    if not api.wait_for(lambda: any(s.text == "warm-up" for s in api.sent), timeout=60):
        raise RuntimeError(f"the {proc.args[3]} bot never answered; stderr: {_stderr(proc)}")
    # Answered, and a long poll open (often begun before the answer: the poller runs one batch ahead).
    api.wait_for(lambda: api.polling, timeout=30)
    threading.Event().wait(1.0)


def _stderr(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate()
    return err[-2000:]


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total


def measure_stop(mode: str, signum: int, workdir: str) -> dict[str, Any]:
    with FakeBotAPI() as api:
        proc = _spawn(mode, api, workdir)
        _warm_idle(api, proc)
        began = time.monotonic()
        proc.send_signal(signum)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        seconds = time.monotonic() - began
    return {
        "seconds": seconds,
        "exit_code": proc.returncode,
        "warning": "WARNING" in err,
        "traceback": "Traceback" in err,
    }


def measure_run(mode: str, workdir: str, idle: float, rate: float, messages: int) -> dict[str, Any]:
    with FakeBotAPI() as api:
        proc = _spawn(mode, api, workdir)
        try:
            _warm_idle(api, proc)
            idle_rss = _status(proc.pid, "VmRSS")
            before = _switches(proc.pid)
            threading.Event().wait(idle)
            wakeups = (_switches(proc.pid) - before) / idle
            threads = len(list(Path(f"/proc/{proc.pid}/task").iterdir()))
            pushed: dict[str, float] = {}
            tick = threading.Event()
            start = time.monotonic()
            for i in range(messages):
                due = start + i / rate
                tick.wait(max(0.0, due - time.monotonic()))
                text = f"m{i}"
                pushed[text] = time.time()
                api.push_message(100 + i % 10, text)
            api.wait_for(lambda: len(api.sent) >= messages + 1, timeout=120)
            arrived = {c.params.get("text"): c.time for c in api.calls_to("sendMessage")}
            latencies = sorted((arrived[t] - pushed[t]) * 1000 for t in pushed if t in arrived)
            peak_rss = _status(proc.pid, "VmHWM")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    if len(latencies) < messages:
        raise RuntimeError(f"{mode}: only {len(latencies)} of {messages} echoes arrived")
    return {
        "idle_wakeups_per_s": wakeups,
        "threads": threads,
        "idle_rss_mb": idle_rss / 1024,
        "peak_rss_mb": peak_rss / 1024,
        "latency_p50_ms": statistics.median(latencies),
        "latency_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        return child(*sys.argv[2:6])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, default=3, help="stops measured per bot and signal")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle wakeup counting")
    parser.add_argument("--rate", type=float, default=20.0, help="messages per second in the latency run")
    parser.add_argument("--messages", type=int, default=400, help="messages in the latency run")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON too")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for mode in MODES:
            stops = {
                name: [measure_stop(mode, signum, workdir) for _ in range(args.stops)]
                for name, signum in (("SIGINT", signal.SIGINT), ("SIGTERM", signal.SIGTERM))
            }
            run = measure_run(mode, workdir, args.idle, args.rate, args.messages)
            results[mode] = {"stops": stops, **run}
            print(f"{mode}: done", file=sys.stderr)
    _print_table(results, args)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


def _stop_cell(runs: list[dict[str, Any]]) -> str:
    seconds = sorted(r["seconds"] for r in runs)
    codes = sorted({r["exit_code"] for r in runs})
    notes = []
    if any(r["warning"] for r in runs):
        notes.append("WARNING")
    if any(r["traceback"] for r in runs):
        notes.append("traceback")
    return (f"{seconds[0]:.2f} to {seconds[-1]:.2f} s (exit {', '.join(map(str, codes))}"
            + (f"; {', '.join(notes)}" if notes else "") + ")")


def _print_table(results: dict[str, Any], args: argparse.Namespace) -> None:
    plain, fenced = results["plain"], results["fenced"]
    rows = [
        ("Ctrl-C (SIGINT) on an idle bot", _stop_cell(plain["stops"]["SIGINT"]), _stop_cell(fenced["stops"]["SIGINT"])),
        ("SIGTERM on an idle bot", _stop_cell(plain["stops"]["SIGTERM"]), _stop_cell(fenced["stops"]["SIGTERM"])),
        (f"wakeups per second while idle (all threads, {args.idle:.0f} s)",
         f"{plain['idle_wakeups_per_s']:.1f} ({plain['threads']} threads)",
         f"{fenced['idle_wakeups_per_s']:.1f} ({fenced['threads']} threads)"),
        ("idle RSS", f"{plain['idle_rss_mb']:.1f} MB", f"{fenced['idle_rss_mb']:.1f} MB"),
        (f"peak RSS (after {args.messages} echoes)",
         f"{plain['peak_rss_mb']:.1f} MB", f"{fenced['peak_rss_mb']:.1f} MB"),
        (f"reply latency at {args.rate:g} msg/s, p50 / p99",
         f"{plain['latency_p50_ms']:.1f} / {plain['latency_p99_ms']:.1f} ms",
         f"{fenced['latency_p50_ms']:.1f} / {fenced['latency_p99_ms']:.1f} ms"),
    ]
    print("| what the user feels | plain telebot | fenced bot |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    sys.exit(main())
