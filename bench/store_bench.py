"""Throughput of SqliteUpdateStore: recording, fenced claim → transaction cycles, and the batch forms.

Run by hand (never from the test suite)::

    python3 bench/store_bench.py                   # 20,000 updates per scenario, files in a temp dir
    python3 bench/store_bench.py --updates 50000 --dir /var/tmp --repeat 3

Scenarios (each on a fresh file holding ``--updates`` pending updates, one chat per update):

- ``record``: ``record()`` of batches of 100 updates, at ``synchronous`` FULL and NORMAL.
- ``fenced``: per update, ``exchange()`` of one then ``transaction(complete=True)`` with one INSERT into a
  domain table: the write and the settlement commit together. 1 and 4 threads sharing one store,
  ``work_synchronous`` FULL and NORMAL.
- ``batch``: ``exchange(limit=100)`` then ``settle_many()`` of the whole batch (no domain write).

The best of ``--repeat`` runs is printed (the machine's noise only ever slows a run down).

With ``--postgres DSN`` the same kinds of figures for ``PostgresUpdateStore`` (each run on a new table,
dropped afterwards; server time, no ``clock=``)::

    python3 bench/store_bench.py --postgres "host=127.0.0.1 user=postgres dbname=test" --updates 5000

- ``fenced``: ``exchange()`` of one then ``transaction(complete=True)`` with one INSERT, 1 and 8 threads of
  one process (one store, its pool), and 3 processes of 4 threads each (a store each: three "hosts");
  each 1- and 8-thread run is paired with a plain queue written by hand on bare psycopg (claim the oldest
  pending row ``FOR UPDATE SKIP LOCKED``, then lock-and-check, INSERT, settle in one transaction: no
  per-chat order) and with the least a commit can do (one 1-row UPDATE); the ratios fence / plain queue
  and 8 threads / 1 thread are printed per run and as medians;
- ``batch``: ``exchange(limit=100)`` then ``settle_many()``, 1 and 8 threads.

A PostgreSQL claimer that gets nothing (``None``, ``[]``) while updates are still pending tries again: a
loop stops only when no update is left pending, so every thread works until the backlog is empty, and
those empty answers are counted and printed beside the rate (an empty claim while work is due is the
defect the multi-host store must not have; a figure that stopped at the first one measured one thread).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import apsw

from telegram_fence.store.sqlite import SqliteUpdateStore

LEASE = 60.0
BATCH = 100
DOMAIN = "CREATE TABLE handled(update_id INTEGER NOT NULL UNIQUE, claim_id TEXT NOT NULL)"
INSERT = "INSERT INTO handled(update_id, claim_id) VALUES (?, ?)"


def updates(first: int, count: int) -> list[dict[str, Any]]:
    return [
        {
            "update_id": i,
            "message": {"message_id": i, "date": 1_700_000_000, "chat": {"id": i, "type": "private"}, "text": "hello"},
        }
        for i in range(first, first + count)
    ]


class Scenario:
    """One measured run: a fresh store file, a setup, and the timed part."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.number = 0

    def store(self, **options: Any) -> SqliteUpdateStore:
        self.number += 1
        return SqliteUpdateStore(os.path.join(self.directory, f"bench-{self.number}.db"), **options)

    def filled(self, count: int, **options: Any) -> SqliteUpdateStore:
        store = self.store(synchronous="NORMAL", **options)
        with store.write() as conn:
            conn.execute(DOMAIN)
        for first in range(1, count + 1, BATCH):
            store.record(updates(first, min(BATCH, count + 1 - first)), first + BATCH)
        return store


def run_threads(count: int, work: Callable[[], int]) -> tuple[int, float]:
    """Run ``work`` in ``count`` named threads; return the summed results and the wall time."""
    results = [0] * count
    errors: list[BaseException] = []
    barrier = threading.Barrier(count + 1)

    def runner(index: int) -> None:
        barrier.wait()
        try:
            results[index] = work()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=runner, args=(i,), name=f"bench-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(results), elapsed


def bench_record(s: Scenario, count: int, sync: str) -> float:
    store = s.store(synchronous=sync)
    batches = [updates(first, BATCH) for first in range(1, count + 1, BATCH)]
    start = time.perf_counter()
    for index, batch in enumerate(batches):
        store.record(batch, (index + 1) * BATCH + 1)
    elapsed = time.perf_counter() - start
    store.close()
    return len(batches) / elapsed


def bench_fenced(s: Scenario, count: int, threads: int, sync: str) -> float:
    store = s.filled(count, work_synchronous=sync)

    def work() -> int:
        done = 0
        while True:
            claim = next(iter(store.exchange((), LEASE, 1)[1]), None)
            if claim is None:
                return done
            with store.transaction(claim.identity, complete=True) as conn:
                conn.execute(INSERT, (claim.update_id, claim.identity.claim_id))
            done += 1

    done, elapsed = run_threads(threads, work)
    check(store, count, done, domain=True)
    store.close()
    return done / elapsed


def bench_batch(s: Scenario, count: int, threads: int, sync: str) -> float:
    store = s.filled(count, work_synchronous=sync)

    def work() -> int:
        done = 0
        while True:
            claims = store.exchange((), LEASE, BATCH)[1]
            if not claims:
                return done
            done += store.settle_many([c.identity for c in claims])

    done, elapsed = run_threads(threads, work)
    check(store, count, done, domain=False)
    store.close()
    return done / elapsed


def check(store: SqliteUpdateStore, count: int, done: int, *, domain: bool) -> None:
    """Refuse a figure from a run that did not handle every update exactly once."""
    stats = store.stats()
    if done != count or stats["settled"] != count:
        raise SystemExit(f"benchmark run is wrong: {done} handled, {stats['settled']} settled of {count}")
    if domain:
        with store.read() as conn:
            (handled,) = conn.execute("SELECT count(DISTINCT update_id) FROM handled").fetchone()
        if handled != count:
            raise SystemExit(f"benchmark run is wrong: {handled} domain rows for {count} updates")


def best(repeat: int, measure: Callable[[], float]) -> float:
    return max(measure() for _ in range(repeat))


# --- PostgreSQL -------------------------------------------------------------------------------------

PG_INSERT = "INSERT INTO {table}_handled (update_id, claim_id) VALUES (%s, %s)"


def pg_filled(dsn: str, count: int) -> Any:
    """A new table holding ``count`` pending updates (one chat each) and its domain table."""
    import uuid

    from telegram_fence.store.postgres import PostgresUpdateStore

    table = f"tf_bench_{uuid.uuid4().hex[:10]}"
    store = PostgresUpdateStore(dsn, table=table, pool_size=12)
    with store.write() as conn:
        conn.execute(f"CREATE TABLE {table}_handled (update_id bigint NOT NULL UNIQUE, claim_id text NOT NULL)")
    for first in range(1, count + 1, BATCH):
        store.record(updates(first, min(BATCH, count + 1 - first)), first + BATCH)
    return store


def pg_drop(dsn: str, store: Any) -> None:
    from pg_cleanup import drop_store  # bench/ is the script's path

    store.close()
    drop_store(dsn, store.table, f"{store.table}_handled")


class PgTally:
    """Empty claims of one PostgreSQL run, counted by every thread (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.empty = 0

    def count_empty(self) -> None:
        with self._lock:
            self.empty += 1


def pg_pending(store: Any) -> bool:
    """Whether any update of the store is still pending (not claimed, not finished)."""
    return bool(store.stats()["pending"])


def pg_fenced_work(store: Any, tally: PgTally) -> int:
    """Claim and commit until nothing is pending; an empty claim while work is pending is counted, then retried."""
    insert = PG_INSERT.format(table=store.table)
    done = 0
    while True:
        claim = next(iter(store.exchange((), LEASE, 1)[1]), None)
        if claim is None:
            if not pg_pending(store):
                return done
            tally.count_empty()
            continue
        with store.transaction(claim.identity, complete=True) as conn:
            conn.execute(insert, (claim.update_id, claim.identity.claim_id))
        done += 1


def pg_bare_work(dsn: str, table: str) -> int:
    """The same cycle written by hand on bare psycopg (one connection, no library): claim the oldest pending row
    (``FOR UPDATE SKIP LOCKED``, autocommit; its payload returned and decoded, as the fence's claim does), then one
    transaction that locks and checks the claim, inserts the domain row and settles it. A plain queue: it keeps
    no per-chat order (two claimers may hold two updates of one chat at once). What the fence's cycle is measured
    against."""
    import json
    import secrets

    import psycopg

    insert = PG_INSERT.format(table=table)
    claim = (
        f"UPDATE {table} SET state = 1, attempt = attempt + 1, claim_id = %s, "
        "due_at = extract(epoch from statement_timestamp()) + 60 "
        f"WHERE update_id = (SELECT update_id FROM {table} WHERE state = 0 ORDER BY update_id LIMIT 1 "
        "FOR UPDATE SKIP LOCKED) RETURNING update_id, attempt, claim_id, payload"
    )
    check = (f"SELECT 1 FROM {table} WHERE update_id = %s AND attempt = %s AND claim_id = %s AND state = 1 "
             "AND due_at > extract(epoch from statement_timestamp()) FOR NO KEY UPDATE")
    settle = (f"UPDATE {table} SET state = 2, changed_at = extract(epoch from statement_timestamp()) "
              "WHERE update_id = %s AND attempt = %s AND claim_id = %s AND state = 1")
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            got = conn.execute(claim, (secrets.token_hex(12),)).fetchone()
            if got is None:
                if not conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table} WHERE state = 0)").fetchone()[0]:
                    return done
                continue
            json.loads(got[3])
            row = got[:3]
            with conn.transaction():
                if conn.execute(check, row).fetchone() is None:
                    continue
                conn.execute(insert, (row[0], row[2]))
                conn.execute(settle, row)
            done += 1


def machine_busy() -> float:
    """Seconds of CPU every process of this machine used so far (user, system, irq, softirq; Linux's
    ``/proc/stat``), 0.0 where it cannot be read."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")


def pg_run_threads(threads: int, work: Callable[[], int]) -> tuple[int, float, tuple[float, float]]:
    """:func:`run_threads`, also returning the CPU per cycle in microseconds: this process's (every thread, the
    client's whole cost) and the whole machine's (the client, the server's processes, the kernel, and whatever
    else runs: on a quiet machine the server's share is the difference)."""
    import resource

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    client, machine = cpu(), machine_busy()
    done, elapsed = run_threads(threads, work)
    per = 1e6 / max(done, 1)
    return done, elapsed, ((cpu() - client) * per, (machine_busy() - machine) * per)


def pg_minimum_work(dsn: str, table: str, ids: Any) -> int:
    """The least a cycle of two commits can do on bare psycopg (one connection): per update, ONE autocommit
    ``UPDATE`` of its row by primary key (a HOT update: no index changes), one round trip, one commit waiting for
    its flush. Not a queue (each thread takes the next id from ``ids``, shared): the ceiling of how 8 Python
    threads scale on this machine and server when each step does almost nothing."""
    import psycopg

    bump = f"UPDATE {table} SET attempt = attempt + 1 WHERE update_id = %s"
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for update_id in ids:
            conn.execute(bump, (update_id,))
            done += 1
    return done


def pg_bench_minimum(dsn: str, count: int, threads: int) -> tuple[float, int, tuple[float, float]]:
    """Statements per second of :func:`pg_minimum_work` in ``threads`` threads (``count`` in all)."""
    import itertools

    store = pg_filled(dsn, count)
    try:
        ids = itertools.islice(itertools.count(1), count)  # (next() on it is atomic under the GIL)
        done, elapsed, cpu = pg_run_threads(threads, lambda: pg_minimum_work(dsn, store.table, ids))
        if done != count:
            raise SystemExit(f"benchmark run is wrong: {done} updates of {count}")
    finally:
        pg_drop(dsn, store)
    return done / elapsed, 0, cpu


def pg_bench_bare(dsn: str, count: int, threads: int) -> tuple[float, int, tuple[float, float]]:
    """Cycles per second of :func:`pg_bare_work` in ``threads`` threads (a connection each)."""
    store = pg_filled(dsn, count)
    try:
        done, elapsed, cpu = pg_run_threads(threads, lambda: pg_bare_work(dsn, store.table))
        pg_check(store, count, done, domain=True)
    finally:
        pg_drop(dsn, store)
    return done / elapsed, 0, cpu


def pg_check(store: Any, count: int, done: int, *, domain: bool) -> None:
    stats = store.stats()
    if done != count or stats["settled"] != count:
        raise SystemExit(f"benchmark run is wrong: {done} handled, {stats['settled']} settled of {count}")
    if domain:
        with store.write() as conn:
            rows = conn.execute(f"SELECT count(DISTINCT update_id) FROM {store.table}_handled").fetchone()[0]
        if rows != count:
            raise SystemExit(f"benchmark run is wrong: {rows} domain rows for {count} updates")


def pg_bench_fenced(dsn: str, count: int, threads: int) -> tuple[float, int, tuple[float, float]]:
    """Cycles per second, the empty claims made while updates were pending, the CPU per cycle."""
    store = pg_filled(dsn, count)
    tally = PgTally()
    try:
        done, elapsed, cpu = pg_run_threads(threads, lambda: pg_fenced_work(store, tally))
        pg_check(store, count, done, domain=True)
    finally:
        pg_drop(dsn, store)
    return done / elapsed, tally.empty, cpu


def pg_bench_batch(dsn: str, count: int, threads: int) -> tuple[float, int]:
    """Updates per second and the empty claims made while updates were pending."""
    store = pg_filled(dsn, count)
    tally = PgTally()

    def work() -> int:
        done = 0
        while True:
            claims = store.exchange((), LEASE, BATCH)[1]
            if not claims:
                if not pg_pending(store):
                    return done
                tally.count_empty()
                continue
            done += store.settle_many([c.identity for c in claims])

    try:
        done, elapsed = run_threads(threads, work)
        pg_check(store, count, done, domain=False)
    finally:
        pg_drop(dsn, store)
    return done / elapsed, tally.empty


def pg_bench_processes(dsn: str, count: int, processes: int, threads: int) -> tuple[float, int]:
    """``processes`` child processes (a store each) of ``threads`` threads, started together."""
    import subprocess

    store = pg_filled(dsn, count)
    try:
        children = [
            subprocess.Popen([sys.executable, __file__, "--pg-worker", dsn, store.table, str(threads)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(processes)
        ]
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise SystemExit("a benchmark child did not start")
        start = time.perf_counter()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        answers = [child.communicate(timeout=600)[0].split() for child in children]
        elapsed = time.perf_counter() - start
        done = sum(int(answer[0]) for answer in answers)
        empty = sum(int(answer[1]) for answer in answers)
        pg_check(store, count, done, domain=True)
    finally:
        pg_drop(dsn, store)
    return done / elapsed, empty


def pg_worker(dsn: str, table: str, threads: int) -> None:
    """A child of :func:`pg_bench_processes`: says ``ready``, waits for ``go``, prints how many it handled
    and its empty claims."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    store = PostgresUpdateStore(dsn, table=table, create_table=False, pool_size=threads + 2)
    print("ready", flush=True)
    sys.stdin.readline()
    tally = PgTally()
    done, _elapsed = run_threads(threads, lambda: pg_fenced_work(store, tally))
    store.close()
    print(done, tally.empty, flush=True)


def main_postgres(dsn: str, n: int, r: int, only: str = "all") -> None:
    import psycopg

    with psycopg.connect(dsn) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
    print(f"python {platform.python_version()}, psycopg {psycopg.__version__}, PostgreSQL {server}, "
          f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}")
    print(f"{n} updates per run, median of {r} (the 1- and 8-thread runs alternate); empty = claims that came "
          "back empty while updates were pending\n")
    print(f"{'PostgreSQL scenario':<62}{'per second':>14}{'empty':>9}{'client CPU':>12}{'machine CPU':>13}")
    Runs = dict[int, list[tuple[float, int, tuple[float, float]]]]
    fenced: Runs = {1: [], 8: []}
    bare: Runs = {1: [], 8: []}
    least: Runs = {1: [], 8: []}
    batch: dict[int, list[tuple[float, int]]] = {1: [], 8: []}
    for _ in range(r):
        for threads in (1, 8):
            fenced[threads].append(pg_bench_fenced(dsn, n, threads))
            bare[threads].append(pg_bench_bare(dsn, n, threads))
            least[threads].append(pg_bench_minimum(dsn, n, threads))
    contestants = (("claim one -> transaction(complete=True)", "cycles", fenced),
                   ("  a plain queue cycle by hand on bare psycopg", "cycles", bare),
                   ("  the least: one 1-row UPDATE + commit, bare psycopg", "stmts", least))
    for threads in (1, 8):
        for label, unit, runs in contestants:
            rate, empty, (client, machine) = median_run(runs[threads])
            print(f"{f'{label}, {threads} thr':<62}{rate:>9,.0f} {unit:<6}{empty:>7}{client:>9,.0f} us"
                  f"{machine:>10,.0f} us", flush=True)
    for threads in (1, 8):
        ratios = sorted(f[0] / b[0] for f, b in zip(fenced[threads], bare[threads], strict=True))
        print(f"fence / a plain queue by hand, {threads} thr: median {ratios[len(ratios) // 2]:.2f} "
              f"(runs: {', '.join(f'{x:.2f}' for x in ratios)})")
    cpus = os.cpu_count() or 1
    for name, rates in (("fence", fenced), ("plain queue by hand", bare), ("the least by hand", least)):
        scaling = sorted(e[0] / o[0] for o, e in zip(rates[1], rates[8], strict=True))
        runs = ", ".join(f"{x:.2f}" for x in scaling)
        # The most 8 threads could do if every CPU of the machine were busy with them at the 8-thread runs' CPU cost
        # per cycle, over the 1-thread rate: no lock or wait can lift the ratio above it.
        ceilings = sorted(cpus * 1e6 / e[2][1] / o[0] for o, e in zip(rates[1], rates[8], strict=True) if e[2][1] > 0)
        ceiling = f"; all {cpus} CPUs busy at that cost: {ceilings[len(ceilings) // 2]:.2f}" if ceilings else ""
        print(f"{name} 8 thr / 1 thr: median {scaling[len(scaling) // 2]:.2f} (runs: {runs}){ceiling}")
    if only == "fenced":
        return
    rate, empty = median_run([pg_bench_processes(dsn, n, 3, 4) for _ in range(r)])
    print(f"{'claim one -> transaction(complete=True), 3 processes x 4 thr':<62}{rate:>9,.0f} cycles{empty:>9}",
          flush=True)
    for _ in range(r):
        for threads in (1, 8):
            batch[threads].append(pg_bench_batch(dsn, n, threads))
    for threads in (1, 8):
        rate, empty = median_run(batch[threads])
        print(f"{f'exchange({BATCH}) + settle_many, {threads} thr':<62}{rate:>9,.0f} updates{empty:>8}",
              flush=True)


def median_run(runs: list[Any]) -> Any:
    """The run with the median rate (its empty claims and CPU figures with it)."""
    return sorted(runs)[len(runs) // 2]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--pg-worker"]:
        pg_worker(argv[1], argv[2], int(argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=20_000, help="updates per scenario (default 20000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is printed (default 3)")
    parser.add_argument("--dir", default=None, help="where the database files go (default: a new temp dir)")
    parser.add_argument("--postgres", metavar="DSN", default=None,
                        help="measure PostgresUpdateStore on this server instead of SQLite")
    parser.add_argument("--only", choices=("all", "fenced"), default="all",
                        help="with --postgres: 'fenced' runs only the 1- and 8-thread claim cycles")
    args = parser.parse_args(argv)
    if args.updates < BATCH or args.updates % BATCH:
        parser.error(f"--updates must be a positive multiple of {BATCH}")
    if args.postgres:
        main_postgres(args.postgres, args.updates, args.repeat, args.only)
        return 0

    directory = tempfile.mkdtemp(prefix="tf-store-bench-", dir=args.dir)
    try:
        s = Scenario(directory)
        n, r = args.updates, args.repeat
        print(
            f"python {platform.python_version()}, apsw {apsw.apsw_version()}, SQLite {apsw.sqlite_lib_version()}, "
            f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}; files in {directory}"
        )
        print(f"{n} updates per run, best of {r}\n")
        print(f"{'scenario':<62}{'per second':>14}")
        for sync in ("FULL", "NORMAL"):
            rate = best(r, lambda sync=sync: bench_record(s, n, sync))
            label = f"record, batches of {BATCH}, synchronous={sync}"
            print(f"{label:<62}{rate:>9,.0f} tx  ({rate * BATCH:,.0f} updates/s)")
        for sync in ("NORMAL", "FULL"):
            for threads in (1, 4):
                rate = best(r, lambda sync=sync, threads=threads: bench_fenced(s, n, threads, sync))
                label = f"claim one -> transaction(complete=True), {threads} thr, work={sync}"
                print(f"{label:<62}{rate:>9,.0f} cycles")
        for sync in ("NORMAL", "FULL"):
            for threads in (1, 4):
                rate = best(r, lambda sync=sync, threads=threads: bench_batch(s, n, threads, sync))
                label = f"exchange({BATCH}) + settle_many, {threads} thr, work={sync}"
                print(f"{label:<62}{rate:>9,.0f} updates")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
