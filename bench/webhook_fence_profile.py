"""Where a running fence's webhook dispatcher spends its time, behind waitress (issue 20; run by hand).

    python3 bench/webhook_fence_profile.py --deliveries 3000
    python3 bench/ab.py --a ../old --b . --rounds 3 --pick 'round' -- bench/webhook_fence_profile.py

One run of ``webhook_bench.py``'s fence variant (a running fence's ``webhook_app`` behind waitress, 40 kept-alive
connections from a child process, trivial handler, ``synchronous="FULL"``), instrumented: the share of its busy
stretch (its first round of the run to its last) the ``fence-dispatcher`` thread spends waiting for work
(``Mailbox.next_round``) and in its rounds (``Dispatcher.round``, with its own CPU time), the dispatcher's wake-ups,
the intake's commits, and the SQL statements the dispatcher runs per commit (an APSW ``exec_trace`` on every
connection). The timing wrappers cost a little themselves: compare runs of this script with each other, not with
``webhook_bench.py``.
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
from telegram_fence.runtime import dispatcher, mailbox

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


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=3000)
    parser.add_argument("--conns", type=int, default=40)
    args = parser.parse_args()
    waits: list[Span] = []
    rounds: list[Span] = []
    timed(mailbox.Mailbox, "next_round", waits)
    timed(dispatcher.Dispatcher, "round", rounds)
    statements: collections.Counter[str] = collections.Counter()

    def hook(conn: apsw.Connection) -> None:
        def trace(cursor: Any, sql: str, bindings: Any) -> bool:
            if threading.current_thread().name == "fence-dispatcher":
                statements[" ".join(sql.split()[:3])[:32]] += 1
            return True

        conn.exec_trace = trace

    apsw.connection_hooks.append(hook)
    fences: list[Fence] = []
    start = Fence.start

    def keep(self: Fence) -> None:
        fences.append(self)
        start(self)

    Fence.start = keep  # type: ignore[method-assign]
    directory = tempfile.mkdtemp(prefix="webhook-profile-", dir="/tmp")
    app, close = webhook_bench.make_fenced(directory)
    server, port, thread = webhook_bench.serve(app, args.conns)
    waits.clear()
    rounds.clear()
    statements.clear()
    pool = fences[0]._pool
    assert pool is not None
    before = pool.counts.get("dispatcher_wakeups", 0)
    began, cpu = time.perf_counter(), time.process_time()
    child = subprocess.run([sys.executable, webhook_bench.__file__, "--client", str(port), str(args.deliveries),
                            str(args.conns)], capture_output=True, text=True, check=True)
    ended, cpu = time.perf_counter(), time.process_time() - cpu
    commits = app.stats()["commits"]
    wakeups = pool.counts.get("dispatcher_wakeups", 0) - before
    server.close()
    thread.join(5)
    close()
    # The dispatcher's busy stretch: from its first round of the run to its last (the child's start and the waits
    # before and after the deliveries are not the run's).
    ours = [(a, b) for a, b, _ in rounds if began <= a <= ended]
    first, last = (min(a for a, _ in ours), max(b for _, b in ours)) if ours else (began, ended)
    rate = float(child.stdout.strip().splitlines()[-1])
    print(f"{rate:,.0f} deliveries/s, {cpu / args.deliveries * 1e6:.0f} us CPU per delivery, load "
          f"{os.getloadavg()[0]:.1f}; {commits} commits ({args.deliveries / max(1, commits):.1f} per commit), "
          f"dispatcher wake-ups {wakeups}")
    for label, spans in (("waiting for work", waits), ("round", rounds)):
        inside = [(max(a, first), min(b, last), c) for a, b, c in spans if b >= first and a <= last]
        if not inside:
            continue
        took = [b - a for a, b, _ in inside]
        own = statistics.median(c for *_, c in inside)
        print(f"{label:<17} {sum(took) / (last - first) * 100:5.1f}% of the busy stretch, {len(inside)} calls, p50 "
              f"{statistics.median(took) * 1e3:.2f} ms (own CPU p50 {own * 1e3:.2f} ms)")
    total = sum(statements.values())
    per = max(1, commits)
    kinds = ", ".join(f"{re.sub(r'_apsw-[0-9]+', '', k)} {v / per:.2f}" for k, v in statements.most_common(9))
    print(f"dispatcher SQL statements per commit: {total / max(1, commits):.1f} ({kinds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
