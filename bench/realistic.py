"""The work bots actually do: plain telebot as users run it against the fenced bot on SQLite and PostgreSQL.

    python bench/realistic.py                                  # every workload and bot, 3 rounds (about 15 minutes)
    python bench/realistic.py --quick --rounds 1               # a smaller form of each workload (about 2 minutes)
    python bench/realistic.py --workloads busy,backlog --bots plain,sqlite
    python bench/realistic.py --tree start=../start            # also the fence of another checkout, same run
    python bench/realistic.py --tree start=../start --only-trees  # only that checkout's fence (and plain)
    python bench/realistic.py --json figures.json              # the raw results too (bench/charts.py reads them)

The fake Bot API server (``telegram_fence.testing.FakeBotAPI``) runs in this process; each bot runs in a child
process of its own and talks to it over real HTTP. The bots:

- ``plain``: ``telebot.TeleBot(token)`` (threaded, telebot's default 2 worker threads) and
  ``bot.infinity_polling()``, as users run it;
- ``sqlite``: the same bot under ``Fence(bot, "bot.db").run()``, default settings;
- ``postgres``: ``Fence(bot, PostgresUpdateStore(dsn, table=...)).run()`` on the server named by ``--dsn``
  (default ``TELEGRAM_FENCE_PG_DSN``; a new table per run, dropped afterwards).

``--tree NAME=PATH`` (repeatable) adds the fenced bots once more, importing ``telegram_fence`` from that checkout
(labelled ``sqlite@NAME``, ``postgres@NAME``), so a before/after comparison is one run on one machine state.

The workloads (``--quick`` shortens each; the handler waits stay):

- ``busy``: a busy group bot. 100 updates/s over 50 group chats for 20 s; 9 in 10 are chatter no handler matches,
  1 in 10 is ``/ask`` and its handler replies with one ``sendMessage``, which the fake answers in 100 ms. Figure:
  the delay from the update being offered to ``getUpdates`` to its reply reaching the server, p50 / p99.
- ``backlog``: 3,000 updates waiting at start (as after downtime), 1 in 10 ``/ask`` (``sendMessage`` answered in
  20 ms). Figure: drain rate, updates over the time from the first ``getUpdates`` to the last reply.
- ``slow``: slow upstream, as a bot that asks a language model. 40 users each write every 5 s, in turn (8
  updates/s in all), for 20 s; every handler waits 2 s (``time.sleep``, as for the model's answer), then replies, so
  16 handlers are in flight at once. A user writes again after reading the last reply, as people talk to such a
  bot; chats picked at random instead would put a chat's second message behind its first, and chat order makes that
  wait part of the figure for any executor. Figure: reply delay p50 / p99.
- ``inflight``: 40 updates in 40 chats waiting at start; every handler waits 2 s, then replies. Figure: the
  bot's peak RSS with its handlers in flight, and how many were in flight at most (here ``plain`` is
  ``TeleBot(token, num_threads=40)``, so that it too runs 40 at once).

Each round runs every workload on every bot, the bots' order rotated per round; the summary gives the median over
the rounds of each figure, and each fenced bot's figure beside plain telebot's. Every run also reports the child's
peak RSS (``VmHWM``) and CPU seconds. The children read compiled bytecode (one unrecorded warm-up run per bot
writes it), as an installed package has it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

WORKLOADS = ("busy", "backlog", "slow", "inflight")
KINDS = ("plain", "sqlite", "postgres")


@dataclass(frozen=True)
class Workload:
    """One workload's shape. ``rate``/``seconds``: the stream pushed to a running bot (``backlog``: all at start)."""

    name: str
    chats: int
    rate: float = 0.0
    seconds: float = 0.0
    backlog: int = 0
    reply_every: int = 1  # 1 in ``reply_every`` updates is /ask; the rest match no handler
    reply_latency: float = 0.0  # seconds the fake takes to answer sendMessage
    handler_wait: float = 0.0  # seconds every /ask handler sleeps before replying

    @property
    def count(self) -> int:
        return self.backlog or round(self.rate * self.seconds)


def workloads(quick: bool) -> dict[str, Workload]:
    """The four workloads, full or ``--quick``."""
    if quick:
        return {
            "busy": Workload("busy", 50, rate=100, seconds=3, reply_every=10, reply_latency=0.1),
            "backlog": Workload("backlog", 50, backlog=500, reply_every=10, reply_latency=0.02),
            "slow": Workload("slow", 40, rate=8, seconds=5, handler_wait=1.0),
            "inflight": Workload("inflight", 40, backlog=40, handler_wait=1.0),
        }
    return {
        "busy": Workload("busy", 50, rate=100, seconds=20, reply_every=10, reply_latency=0.1),
        "backlog": Workload("backlog", 50, backlog=3000, reply_every=10, reply_latency=0.02),
        "slow": Workload("slow", 40, rate=8, seconds=20, handler_wait=2.0),
        "inflight": Workload("inflight", 40, backlog=40, handler_wait=2.0),
    }


@dataclass(frozen=True)
class Bot:
    """A bot to run: its kind and the checkout whose ``telegram_fence`` it imports."""

    kind: str
    tree: Path
    tree_name: str = ""

    @property
    def label(self) -> str:
        return self.kind + (f"@{self.tree_name}" if self.tree_name else "")


# --- the child: one bot ---------------------------------------------------------------------------


def child(kind: str, api_url: str, token: str, workload: str, handler_wait: float, store: str) -> int:
    """Run one bot until SIGTERM. ``/ask N`` is answered ``re N`` (after ``handler_wait`` seconds); other text is
    matched by no handler. Prints ``inflight N`` each time more handlers than before are running at once."""
    import telebot
    from telebot import apihelper

    apihelper.API_URL = api_url
    bot = telebot.TeleBot(token, num_threads=40) if (kind == "plain" and workload == "inflight") else (
        telebot.TeleBot(token))
    lock = threading.Lock()
    running = [0, 0]  # now, most

    @bot.message_handler(commands=["ask"])
    def ask(message: Any) -> None:
        with lock:
            running[0] += 1
            if running[0] > running[1]:
                running[1] = running[0]
                print(f"inflight {running[1]}", flush=True)
        try:
            if handler_wait:
                time.sleep(handler_wait)
            bot.send_message(message.chat.id, "re " + message.text.split()[1])
        finally:
            with lock:
                running[0] -= 1

    if kind == "plain":
        bot.infinity_polling()
        return 0
    from telegram_fence import Fence

    if kind == "postgres":
        dsn, _, table = store.rpartition("|")
        from telegram_fence.store.postgres import PostgresUpdateStore

        return Fence(bot, PostgresUpdateStore(dsn, table=table)).run()
    return Fence(bot, store).run()


# --- the parent: the fake server, the pushes, the figures -------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _drop_tables(dsn: str, prefix: str) -> None:
    """Drop every table and function whose name starts with ``prefix`` (whatever a tree's store made)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE %s",
            (prefix + "%",))]
        for name in tables:
            conn.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')
        functions = [r[0] for r in conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND p.proname LIKE %s", (prefix + "%",))]
        for signature in functions:
            conn.execute(f"DROP FUNCTION IF EXISTS {signature} CASCADE")


@dataclass
class Run:
    """What one run of one bot on one workload measured."""

    bot: str
    workload: str
    ok: bool = True
    error: str = ""
    figures: dict[str, float] = field(default_factory=dict)


def _texts(work: Workload, seed: int) -> list[tuple[int, str]]:
    """The (chat, text) of each update, every ``reply_every``-th one /ask: chats in turn for ``slow`` and
    ``inflight`` (each user waits for the reply), else picked at random (seeded)."""
    pick = random.Random(seed)
    chats = [-1001000000000 - c for c in range(work.chats)] if work.name == "busy" else list(
        range(10_001, 10_001 + work.chats))
    out = []
    for i in range(work.count):
        chat = chats[i % work.chats] if work.name in ("slow", "inflight") else pick.choice(chats)
        out.append((chat, f"/ask {i}" if i % work.reply_every == 0 else f"chatter {i} about nothing"))
    return out


def run_one(bot: Bot, work: Workload, dsn: str | None, workdir: str, seed: int) -> Run:
    """Run ``bot`` on ``work`` once in a child process; never raises for the bot's failure (``ok`` is False)."""
    from telegram_fence.testing import FakeBotAPI

    result = Run(bot.label, work.name)
    texts = _texts(work, seed)
    asks = {text.split()[1] for _, text in texts if text.startswith("/ask")}
    store = os.path.join(workdir, f"{bot.kind}-{uuid.uuid4().hex[:8]}.db")
    prefix = ""
    if bot.kind == "postgres":
        if not dsn:
            raise SystemExit("the postgres bot needs --dsn or TELEGRAM_FENCE_PG_DSN")
        prefix = f"tf_real_{uuid.uuid4().hex[:10]}"
        store = f"{dsn}|{prefix}"
    env = {**os.environ, "PYTHONPATH": str(bot.tree)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = os.path.join(workdir, "pyc-" + bot.tree_name)
    out_path = os.path.join(workdir, "child.out")
    err_path = os.path.join(workdir, "child.err")
    latency = {"sendMessage": work.reply_latency} if work.reply_latency else {}
    with FakeBotAPI(latency=latency) as api, open(out_path, "w") as out, open(err_path, "w") as err:
        pushed: dict[str, float] = {}
        if work.backlog:
            for chat, text in texts:
                pushed[text.split()[1]] = time.time()
                api.push_message(chat, text)
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", bot.kind, api.api_url, api.token, work.name,
             str(work.handler_wait), store],
            cwd=str(bot.tree), env=env, stdout=out, stderr=err,
        )
        try:
            _drive(api, proc, work, texts, pushed, asks, result)
            if result.ok:
                result.figures["rss_mb"] = _status_kb(proc.pid, "VmHWM") / 1024
                result.figures["cpu_s"] = _cpu_seconds(proc.pid)
        except Exception as exc:  # the bot failed or was too slow: reported, the run goes on
            result.ok, result.error = False, f"{type(exc).__name__}: {exc}"
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if prefix and dsn:
                _drop_tables(dsn, prefix)
    if not result.ok:
        result.error += "\n" + Path(err_path).read_text()[-1500:]
    inflight = [int(line.split()[1]) for line in Path(out_path).read_text().splitlines() if line.startswith("inflight")]
    if inflight:
        result.figures["inflight"] = max(inflight)
    return result


def _drive(api: Any, proc: subprocess.Popen[bytes], work: Workload, texts: list[tuple[int, str]],
           pushed: dict[str, float], asks: set[str], result: Run) -> None:
    """Push the workload's updates (unless waiting at start), wait for every reply, fill ``result.figures``."""
    timeout = 120 + work.count * max(work.handler_wait, 0.05)

    def replies() -> dict[str, float]:
        return {c.params.get("text", "")[3:]: c.time for c in api.calls_to("sendMessage")
                if str(c.params.get("text", "")).startswith("re ")}

    def alive() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"the bot exited with {proc.returncode}")

    if not work.backlog:
        # the bot is up and idle in a long poll once it answered a first /ask
        api.push_message(texts[0][0], "/ask warm")
        if not api.wait_for(lambda: "warm" in replies() or proc.poll() is not None, timeout=120):
            raise RuntimeError("the bot never answered its first message")
        alive()
        api.wait_for(lambda: api.polling, timeout=30)
        tick = threading.Event()
        start = time.monotonic()
        for i, (chat, text) in enumerate(texts):
            tick.wait(max(0.0, start + i / work.rate - time.monotonic()))
            pushed[text.split()[1]] = time.time()
            api.push_message(chat, text)
    done = api.wait_for(lambda: asks <= replies().keys() or proc.poll() is not None, timeout=timeout)
    alive()
    if not done:
        raise RuntimeError(f"only {len(asks & replies().keys())} of {len(asks)} replies within {timeout:.0f} s")
    arrived = replies()
    if work.name == "backlog":
        first = min(c.time for c in api.calls_to("getUpdates"))
        result.figures["rate"] = work.count / (max(arrived[a] for a in asks) - first)
    else:
        delays = [(arrived[a] - pushed[a]) * 1000 for a in asks]
        result.figures["p50_ms"] = statistics.median(delays)
        result.figures["p99_ms"] = _percentile(delays, 0.99)
        result.figures["max_ms"] = max(delays)


# --- the report ------------------------------------------------------------------------------------


def _line(run: Run) -> str:
    if not run.ok:
        return f"{run.workload:8s} {run.bot:18s} FAILED: {run.error.splitlines()[0]}"
    f = run.figures
    head = {
        "busy": lambda: f"reply delay p50 {f['p50_ms']:7.1f} ms  p99 {f['p99_ms']:7.1f} ms",
        "slow": lambda: f"reply delay p50 {f['p50_ms']:7.0f} ms  p99 {f['p99_ms']:7.0f} ms",
        "backlog": lambda: f"drain {f['rate']:7.0f} updates/s",
        "inflight": lambda: f"{f.get('inflight', 0):3.0f} handlers in flight at most",
    }[run.workload]()
    return f"{run.workload:8s} {run.bot:18s} {head}  | peak RSS {f['rss_mb']:5.1f} MB, CPU {f['cpu_s']:5.2f} s"


def summary(runs: list[Run], bots: list[Bot], names: list[str]) -> list[str]:
    """The median of each figure per workload and bot, with the fenced bots beside plain telebot."""
    out = []
    for name in names:
        out.append(f"== {name}: medians over rounds")
        med: dict[str, dict[str, float]] = {}
        for bot in bots:
            ok = [r for r in runs if r.workload == name and r.bot == bot.label and r.ok]
            failed = sum(1 for r in runs if r.workload == name and r.bot == bot.label and not r.ok)
            if not ok:
                out.append(f"{name:8s} {bot.label:18s} no run finished ({failed} failed)")
                continue
            keys = ok[0].figures.keys()
            med[bot.label] = {k: statistics.median(r.figures[k] for r in ok if k in r.figures) for k in keys}
            f = med[bot.label]
            plain = med.get("plain")
            extra = f" ({failed} failed)" if failed else ""
            rss = f"peak RSS {f['rss_mb']:.1f} MB" + (
                f" ({f['rss_mb'] - plain['rss_mb']:+.1f} MB)" if plain and bot.kind != "plain" else "")
            if name in ("busy", "slow"):
                vs = (f" (plain {f['p50_ms'] - plain['p50_ms']:+.1f} / {f['p99_ms'] - plain['p99_ms']:+.1f} ms)"
                      if plain and bot.kind != "plain" else "")
                out.append(f"{name:8s} {bot.label:18s} reply delay p50 {f['p50_ms']:.1f} ms, p99 {f['p99_ms']:.1f} ms"
                           f"{vs}; {rss}; CPU {f['cpu_s']:.2f} s{extra}")
            elif name == "backlog":
                vs = f" ({f['rate'] / plain['rate']:.2f}x plain)" if plain and bot.kind != "plain" else ""
                out.append(f"{name:8s} {bot.label:18s} drain {f['rate']:.0f} updates/s{vs}; {rss}; "
                           f"CPU {f['cpu_s']:.2f} s{extra}")
            else:
                out.append(f"{name:8s} {bot.label:18s} {f.get('inflight', 0):.0f} handlers in flight; {rss}{extra}")
    return out


def _load() -> str:
    """The machine's 1, 5 and 15 minute load averages: how much else ran beside the bots."""
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, api_url, token, workload, wait, store = sys.argv[2:8]
        return child(kind, api_url, token, workload, float(wait), store)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a shorter form of each workload")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--bots", default=None,
                        help="comma-separated, of plain, sqlite, postgres (default: all; postgres only with a DSN)")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                        help="also run the fenced bots with telegram_fence imported from this checkout")
    parser.add_argument("--only-trees", action="store_true",
                        help="run the fenced bots only from the --tree checkouts, not from this one")
    parser.add_argument("--dsn", default=os.environ.get("TELEGRAM_FENCE_PG_DSN"),
                        help="PostgreSQL connection string (default: $TELEGRAM_FENCE_PG_DSN)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write every run's figures here")
    parser.add_argument("--no-warmup", action="store_true", help="skip the unrecorded warm-up run of each bot")
    args = parser.parse_args()
    names = [n for n in args.workloads.split(",") if n]
    for name in names:
        if name not in WORKLOADS:
            parser.error(f"unknown workload {name!r}")
    kinds = args.bots.split(",") if args.bots else [k for k in KINDS if k != "postgres" or args.dsn]
    for kind in kinds:
        if kind not in KINDS:
            parser.error(f"unknown bot {kind!r}")
    if "postgres" in kinds and not args.dsn:
        parser.error("the postgres bot needs --dsn (or TELEGRAM_FENCE_PG_DSN)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    bots = [Bot(kind, ROOT) for kind in kinds if kind == "plain" or not args.only_trees]
    for spec in args.tree:
        tree_name, sep, path = spec.partition("=")
        if not sep or not tree_name or not (Path(path) / "telegram_fence").is_dir():
            parser.error(f"--tree wants NAME=PATH of a checkout with telegram_fence/, got {spec!r}")
        bots += [Bot(kind, Path(path).resolve(), tree_name) for kind in kinds if kind != "plain"]
    shapes = workloads(args.quick)
    print(f"# {len(bots)} bots, workloads {', '.join(names)}, {args.rounds} rounds{' (quick)' if args.quick else ''}; "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average {_load()}", flush=True)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="tf-realistic-") as workdir:
        if not args.no_warmup:  # writes the bytecode the recorded runs read
            warm = Workload("backlog", 5, backlog=20, reply_every=2)
            for bot in bots:
                done = run_one(bot, warm, args.dsn, workdir, 0)
                if not done.ok:
                    print(f"warm-up of {bot.label} failed: {done.error}", file=sys.stderr)
        for number in range(args.rounds):
            for name in names:
                shift = number % len(bots)
                for bot in bots[shift:] + bots[:shift]:
                    run = run_one(bot, shapes[name], args.dsn, workdir, seed=number)
                    runs.append(run)
                    print(f"round {number + 1} {_line(run)}", flush=True)
                    if not run.ok:
                        print(run.error, file=sys.stderr)
    print(f"# load average at the end {_load()}")
    for line in summary(runs, bots, names):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"quick": args.quick, "rounds": args.rounds,
             "workloads": {name: dataclasses.asdict(shapes[name]) for name in names},
             "runs": [{"bot": r.bot, "workload": r.workload, "ok": r.ok, **r.figures} for r in runs]}, indent=1))
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
