"""Where the running fence's wall time goes, phase by phase, with a trivial handler against the fake Bot API server.

    python bench/fence_phases.py                       # 100,000 updates over 50 chats, 3 runs, SQLite
    python bench/fence_phases.py --n 50000 --runs 5 --switch-interval 0.0005
    python bench/fence_phases.py --store postgres --dsn "host=127.0.0.1 user=postgres dbname=test" --n 10000

Runs the same fenced bot as ``bench/throughput.py`` (each run in a child process of its own) and times, on each
thread, the calls that make up the path of an update: on ``fence-dispatcher`` the round (record, settle, claim,
commit: ``Dispatcher.round``), the handlers run inline (``Inline.run``, split into telebot's own work:
``Update.de_json`` and ``process_new_updates``, and the rest, the fence's per-update frame), the waits for the
poller (``Mailbox.next_round``, ``FetchSignal.wait``); on ``fence-poller`` the ``getUpdates`` call (wall
and CPU) and the wait for its batch to be recorded. Prints µs per update, medians over the runs.

The per-update split (``--per-update``) wraps two telebot functions called once per update: each wrapper adds
≈ 0.3 µs per update to the phase it sits in, so the run itself is slower; without it only per-round calls are
wrapped and the run keeps its speed. A private benchmark of internals: it wraps underscored names.

``--store postgres`` runs the fenced bot on ``PostgresUpdateStore`` (a new table per run, dropped afterwards) and
times as well the conversations' read of a round's chats (``Conversations.claimed``) on ``fence-dispatcher`` and,
on ``fence-poller``, its reads of the store (``backlog``, ``next_offset``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PHASES = collections.defaultdict(float)  # (thread, phase) -> seconds


def _timed(fn: Callable[..., Any], phase: str, cpu_phase: str | None = None) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            name = threading.current_thread().name
            PHASES[(name, phase)] += time.perf_counter() - started
            if cpu_phase is not None:
                PHASES[(name, cpu_phase)] += time.thread_time() - cpu

    return timed


def _wrap(owner: Any, name: str, phase: str, cpu_phase: str | None = None) -> None:
    raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    if isinstance(raw, staticmethod):
        setattr(owner, name, staticmethod(_timed(raw.__func__, phase, cpu_phase)))
    elif isinstance(raw, classmethod):
        setattr(owner, name, classmethod(_timed(raw.__func__, phase, cpu_phase)))
    else:
        setattr(owner, name, _timed(raw, phase, cpu_phase))


THREADS: dict[str, float] = {}  # "thread | CPU" etc. -> per update, read from /proc before the fence stops


def _snapshot_threads_before_stop(n: int) -> None:
    """Read each thread's CPU time and context switches from ``/proc`` when the fence is told to stop (its threads
    are gone after ``join``): ``THREADS`` gets µs of CPU and switches per update, by thread name."""
    from telegram_fence import Fence

    stop = Fence.stop
    tick = os.sysconf("SC_CLK_TCK")

    def stopped(self: Any, *args: Any, **kwargs: Any) -> Any:
        for thread in threading.enumerate():
            name = "fence-worker" if thread.name.startswith("fence-worker") else thread.name
            try:
                with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/self/task/{thread.native_id}/status") as f:
                    status = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
            except OSError:
                continue
            cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
            for key, value in ((f"{name} | thread CPU (/proc, since start)", cpu * 1e6 / n),
                               (f"{name} | of which system (/proc)", int(fields[12]) / tick * 1e6 / n),
                               (f"{name} | voluntary switches per 100 updates",
                                int(status["voluntary_ctxt_switches"]) * 100 / n),
                               (f"{name} | involuntary switches per 100 updates",
                                int(status["nonvoluntary_ctxt_switches"]) * 100 / n)):
                THREADS[key] = THREADS.get(key, 0.0) + value
        return stop(self, *args, **kwargs)

    Fence.stop = stopped  # type: ignore[method-assign]


def _wrap_postgres() -> None:
    """The conversations' read and the store reads of the poller (``--store postgres``)."""
    from telegram_fence.conversation import extension
    from telegram_fence.store.postgres import recording, support

    _wrap(extension.Conversations, "claimed", "conversations' read of a round's chats")
    _wrap(support.StoreSupport, "backlog", "store.backlog()", "store.backlog() (CPU)")
    _wrap(recording.Recording, "next_offset", "store.next_offset()", "store.next_offset() (CPU)")


def child(api_url: str, token: str, n: int, db: str, per_update: bool, switch: float | None) -> None:
    import telebot
    import throughput

    from telegram_fence.ingress import poller
    from telegram_fence.runtime import dispatcher, inline, mailbox, rounds

    if switch is not None:
        sys.setswitchinterval(switch)
    _wrap(dispatcher.Dispatcher, "round", "round (record, settle, claim, commit)", "round (CPU)")
    _wrap(rounds.FetchSignal, "wait", "wait: the poller's next getUpdates sent")
    _wrap(mailbox.Mailbox, "next_round", "wait: next round's work (a batch)", "wait: next round's work (CPU)")
    _wrap(inline.Inline, "run", "handlers inline (all)", "handlers inline (CPU)")
    _snapshot_threads_before_stop(n)
    _wrap(poller, "get_updates", "getUpdates (wall)", "getUpdates (CPU)")
    _wrap(poller.Poller, "_record", "wait: batch recorded")
    if db.startswith("postgres:"):
        _wrap_postgres()
    if per_update:
        _wrap(telebot.types.Update, "de_json", "  of which telebot Update.de_json")
        _wrap(telebot.TeleBot, "process_new_updates", "  of which telebot process_new_updates")
    rate = subprocess_free_run(throughput, api_url, token, n, db)
    phases = {f"{thread} | {phase}": seconds * 1e6 / n for (thread, phase), seconds in PHASES.items()
              if not thread.startswith("fence-worker")}
    phases.update(THREADS)
    print(json.dumps({"wall_us": 1e6 / rate, "rate": rate, "phases": phases}))


def subprocess_free_run(throughput: Any, api_url: str, token: str, n: int, db: str) -> float:
    """Run ``bench/throughput.py``'s fenced child in this process; return its rate (updates/s)."""
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        throughput.child("fence", "trivial", api_url, token, n, 4, db)
    return float(json.loads(printed.getvalue().strip().splitlines()[-1])["rate"])


def one_run(n: int, per_update: bool, switch: float | None, dsn: str | None = None) -> dict[str, Any]:
    from telegram_fence.testing import FakeBotAPI

    with tempfile.TemporaryDirectory() as tmp, FakeBotAPI(max_long_poll=1.0) as api, _table(dsn) as table:
        api.push_messages(n, chats=list(range(1, 51)), text="m{i}")
        db = os.path.join(tmp, "b.db") if table is None else f"postgres:{dsn}|{table}"
        command = [sys.executable, __file__, "--child", api.api_url, api.token, str(n), db]
        if per_update:
            command.append("--per-update")
        if switch is not None:
            command += ["--switch-interval", str(switch)]
        out = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"the bot exited {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def _table(dsn: str | None) -> Iterator[str | None]:
    """A fresh PostgreSQL table for one run, dropped afterwards (``None`` without ``dsn``: SQLite)."""
    if dsn is None:
        yield None
        return
    import uuid

    import psycopg

    from telegram_fence.store.postgres import PostgresUpdateStore, table_names

    table = f"tf_phases_{uuid.uuid4().hex[:10]}"
    PostgresUpdateStore(dsn, table=table).close()
    try:
        yield table
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in table_names(table):
                conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(f"DROP FUNCTION IF EXISTS {table}_calls_prune()")  # the call journal's trigger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-update", action="store_true", help="also split telebot's per-update work out")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval in the bot's process (default: the interpreter's, 5 ms)")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                        help="the fenced bot's store (default sqlite)")
    parser.add_argument("--dsn", default=os.environ.get("TELEGRAM_FENCE_PG_DSN"),
                        help="PostgreSQL connection string for --store postgres (default: $TELEGRAM_FENCE_PG_DSN)")
    parser.add_argument("--child", nargs=4, metavar="ARG")
    args = parser.parse_args()
    if args.child:
        api_url, token, n, db = args.child
        child(api_url, token, int(n), db, args.per_update, args.switch_interval)
        return
    if args.store == "postgres" and not args.dsn:
        parser.error("--store postgres needs --dsn (or TELEGRAM_FENCE_PG_DSN)")
    dsn = args.dsn if args.store == "postgres" else None
    runs = [one_run(args.n, args.per_update, args.switch_interval, dsn) for _ in range(args.runs)]
    print(f"N={args.n} runs={args.runs} store={args.store} per_update={args.per_update} "
          f"switch_interval={args.switch_interval}")
    print(f"{'wall per update':58s} {statistics.median(r['wall_us'] for r in runs):7.2f} µs   "
          f"({statistics.median(r['rate'] for r in runs):,.0f} updates/s)")
    for key in sorted(runs[0]["phases"]):
        values = [r["phases"].get(key, 0.0) for r in runs]
        print(f"{key:58s} {statistics.median(values):7.2f} µs")


if __name__ == "__main__":
    main()
