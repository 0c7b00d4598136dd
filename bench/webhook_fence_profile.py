"""Where a running fence's webhook dispatcher spends its time, behind waitress (run by hand).

    python3 bench/webhook_fence_profile.py --deliveries 3000
    python3 bench/ab.py --a ../old --b . --rounds 3 --pick 'round' -- bench/webhook_fence_profile.py

One run of ``webhook_bench.py``'s fence variant (a running fence's ``webhook_app`` behind waitress, 40 kept-alive
connections from a child process, trivial handler, ``synchronous="FULL"``), instrumented: the share of its busy
stretch (its first round of the run to its last) the ``fence-dispatcher`` thread spends waiting for work
(``Mailbox.next_round``) and in its rounds (``Dispatcher.round``, with its own CPU time), the dispatcher's wake-ups,
the intake's commits, and the SQL statements the dispatcher runs per commit and the rows they yield it (an APSW
``exec_trace`` and ``row_trace`` on every connection; each row is one more step into SQLite, so one more release of
the interpreter lock). The timing wrappers cost a little themselves: compare runs of this script with each other,
not with ``webhook_bench.py``.

Also printed: each thread group's CPU time (the scheduler's count, ``/proc/self/task/*/schedstat``) and context
switches per delivery (``waitress`` = the request threads, ``bench-waitress`` = waitress's socket loop), the
clients' reply latency (p50, p99) and their own CPU per delivery (a child process on the same cores), and the
intake alone's commit calls with ``--variant intake``. ``--variant bare|intake`` serves the bare app or the intake
alone instead of the fence; ``--handler-us N`` gives the fence a handler that keeps the interpreter busy N µs;
``--conns`` sets the connections (40 by default).

``--statements`` also times each statement the dispatcher's store connection runs (``execute``, and the savepoints
of ``with conn:``): calls, wall and the thread's own CPU per call, by kind. A statement's wall beyond its CPU is
mostly the wait to take the interpreter lock back after SQLite released it (and, for COMMIT, the fsync).

    python3 bench/webhook_fence_profile.py --variant intake
    python3 bench/webhook_fence_profile.py --conns 1 --deliveries 600 --handler-us 300
    python3 bench/webhook_fence_profile.py --statements
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import apsw

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import webhook_bench

from telegram_fence import Fence
from telegram_fence.ingress import webhook_group
from telegram_fence.runtime import dispatcher, mailbox
from telegram_fence.store.sqlite import connection

#: Per statement kind: calls, wall seconds, the calling thread's CPU seconds (``--statements``).
Timings = dict[str, list[float]]

Span = tuple[float, float, float]


def timed(cls: type, name: str, spans: list[Span]) -> None:
    """Wrap ``cls.name`` to append (start, end, thread CPU) of each call to ``spans``."""
    original: Callable[..., Any] = getattr(cls, name)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return original(self, *args, **kwargs)
        finally:
            spans.append((started, time.perf_counter(), time.thread_time() - cpu))

    setattr(cls, name, wrapper)


class TimedConnection:
    """An APSW connection whose ``execute`` and ``with`` block are timed into ``timings`` (the rest passes through)."""

    def __init__(self, conn: apsw.Connection, timings: Timings) -> None:
        self._conn = conn
        self._timings = timings

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def _timed(self, kind: str, call: Callable[[], Any]) -> Any:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return call()
        finally:
            entry = self._timings.setdefault(kind, [0.0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - started
            entry[2] += time.thread_time() - cpu

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        return self._timed(" ".join(sql.split()[:3])[:32], lambda: self._conn.execute(sql, *args, **kwargs))

    def __enter__(self) -> TimedConnection:
        self._timed("SAVEPOINT (with conn)", self._conn.__enter__)
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._timed("RELEASE (with conn)", lambda: self._conn.__exit__(*exc))


def time_statements(timings: Timings) -> None:
    """Time the statements of the ``fence-dispatcher`` thread's store connection into ``timings``."""
    original = connection.StoreBase._conn
    wrapped: dict[int, TimedConnection] = {}

    def conn(self: connection.StoreBase) -> Any:
        real = original(self)
        if threading.current_thread().name != "fence-dispatcher":
            return real
        timed_conn = wrapped.get(id(real))
        if timed_conn is None or timed_conn._conn is not real:
            timed_conn = wrapped[id(real)] = TimedConnection(real, timings)
        return timed_conn

    connection.StoreBase._conn = conn  # type: ignore[method-assign,assignment]


def thread_use() -> dict[str, collections.Counter[str]]:
    """What each live thread of this process has used, by its group (the thread's name with its number dropped:
    ``waitress``, ``fence-worker``, ``fence-dispatcher``, ...): ``cpu`` seconds on a CPU (the scheduler's count) and
    ``switches``, the times it was switched out (waiting for a lock, the interpreter lock included, or preempted);
    from /proc."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    used: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                ran = int(stat.read().split()[0])  # nanoseconds on a CPU
            with open(f"/proc/self/task/{tid}/status") as status:
                switches = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
        except OSError:
            continue
        name = re.sub(r"[-_]?[0-9]+$", "", names.get(int(tid), "(other)"))
        used[name]["cpu"] += ran / 1e9
        used[name]["switches"] += switches
    return used


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=3000)
    parser.add_argument("--conns", type=int, default=40)
    parser.add_argument("--handler-us", type=float, default=0.0,
                        help="the fence's handler keeps the interpreter busy this many microseconds (default: trivial)")
    parser.add_argument("--variant", choices=("fence", "intake", "bare"), default="fence",
                        help="what waitress serves: a fence's webhook_app (default), the intake alone, a bare app")
    parser.add_argument("--statements", action="store_true",
                        help="time each statement of the dispatcher's store connection (wall and CPU per call)")
    args = parser.parse_args()
    timings: Timings = {}
    if args.statements:
        time_statements(timings)
    waits: list[Span] = []
    rounds: list[Span] = []
    timed(mailbox.Mailbox, "next_round", waits)
    timed(dispatcher.Dispatcher, "round", rounds)
    commits: list[Span] = []
    timed(webhook_group.GroupCommit, "commit", commits)  # the intake alone's committer (not called in a fence)
    statements: collections.Counter[str] = collections.Counter()
    rows_read: collections.Counter[str] = collections.Counter()

    def hook(conn: apsw.Connection) -> None:
        def trace(cursor: Any, sql: str, bindings: Any) -> bool:
            if threading.current_thread().name in ("fence-dispatcher", "fence-webhook-commit"):
                statements[" ".join(sql.split()[:3])[:32]] += 1
            return True

        def row(cursor: Any, values: Any) -> Any:
            if threading.current_thread().name in ("fence-dispatcher", "fence-webhook-commit"):
                rows_read[" ".join(cursor.expanded_sql.split()[:3])[:32]] += 1
            return values

        conn.exec_trace = trace
        conn.row_trace = row

    apsw.connection_hooks.append(hook)
    fences: list[Fence] = []
    start = Fence.start

    def keep(self: Fence) -> None:
        fences.append(self)
        start(self)

    Fence.start = keep  # type: ignore[method-assign]
    directory = tempfile.mkdtemp(prefix="webhook-profile-", dir="/tmp")
    make: dict[str, Callable[[str], tuple[Any, Callable[[], None]]]] = {
        "fence": lambda d: webhook_bench.make_fenced(d, args.handler_us / 1e6),
        "intake": webhook_bench.make_intake, "bare": webhook_bench.make_bare,
    }
    app, close = make[args.variant](directory)
    server, port, thread = webhook_bench.serve(app, args.conns)
    waits.clear()
    rounds.clear()
    commits.clear()
    statements.clear()
    rows_read.clear()
    timings.clear()
    pool = fences[0]._pool if fences else None
    before = pool.counts.get("dispatcher_wakeups", 0) if pool is not None else 0
    began, cpu, by_thread = time.perf_counter(), time.process_time(), thread_use()
    child = subprocess.run([sys.executable, webhook_bench.__file__, "--client", str(port), str(args.deliveries),
                            str(args.conns)], capture_output=True, text=True, check=True)
    ended, cpu = time.perf_counter(), time.process_time() - cpu
    after = thread_use()
    committed = app.stats()["commits"] if hasattr(app, "stats") else 0
    wakeups = pool.counts.get("dispatcher_wakeups", 0) - before if pool is not None else 0
    server.close()
    thread.join(5)
    close()
    # The dispatcher's busy stretch: from its first round of the run to its last (the child's start and the waits
    # before and after the deliveries are not the run's).
    ours = [(a, b) for a, b, _ in rounds + commits if began <= a <= ended]
    first, last = (min(a for a, _ in ours), max(b for _, b in ours)) if ours else (began, ended)
    *said, final = child.stdout.strip().splitlines()
    rate = float(final)
    print(f"{rate:,.0f} deliveries/s, {cpu / args.deliveries * 1e6:.0f} us CPU per delivery, load "
          f"{os.getloadavg()[0]:.1f}; {committed} commits ({args.deliveries / max(1, committed):.1f} per commit), "
          f"dispatcher wake-ups {wakeups}; {said[-1] if said else ''}")
    spent = {name: after[name]["cpu"] - by_thread[name]["cpu"] for name in after}
    switched = {name: after[name]["switches"] - by_thread[name]["switches"] for name in after}
    busy = sorted((name for name in spent if spent[name] * 1e6 / args.deliveries >= 0.5), key=lambda n: -spent[n])
    print("per delivery by thread, CPU and switches: " + ", ".join(
        f"{name} {spent[name] / args.deliveries * 1e6:.0f} us {switched[name] / args.deliveries:.2f}" for name in busy))
    for label, spans in (("waiting for work", waits), ("round", rounds), ("intake commit", commits)):
        inside = [(max(a, first), min(b, last), c) for a, b, c in spans if b >= first and a <= last]
        if not inside:
            continue
        took = [b - a for a, b, _ in inside]
        own = statistics.median(c for *_, c in inside)
        print(f"{label:<17} {sum(took) / (last - first) * 100:5.1f}% of the busy stretch, {len(inside)} calls, p50 "
              f"{statistics.median(took) * 1e3:.2f} ms (own CPU p50 {own * 1e3:.2f} ms)")
    total = sum(statements.values())
    per = max(1, committed)
    kinds = ", ".join(f"{re.sub(r'_apsw-[0-9]+', '', k)} {v / per:.2f}" for k, v in statements.most_common(9))
    print(f"dispatcher SQL statements per commit: {total / max(1, committed):.1f} ({kinds})")
    # Each row a statement yields is one more step into SQLite (one more release of the interpreter lock).
    kinds = ", ".join(f"{re.sub(r'_apsw-[0-9]+', '', k)} {v / per:.2f}" for k, v in rows_read.most_common(4))
    print(f"dispatcher SQL rows read per commit: {sum(rows_read.values()) / per:.1f} ({kinds})")
    for kind, (calls, wall, used) in sorted(timings.items(), key=lambda item: -item[1][1]):
        print(f"  statement {kind:<32} {calls:6.0f} calls, wall {wall / calls * 1e3:6.3f} ms per call, "
              f"own CPU {used / calls * 1e3:6.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
