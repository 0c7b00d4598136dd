"""The fence's store against the durable queues a bot author would pick instead, in one run, alternating.

Run by hand (never from the test suite); the peers come with the ``bench`` extra::

    pip install -e ".[bench]"
    python3 bench/peers.py                                  # SQLite peers only
    python3 bench/peers.py --jobs 2000 --rounds 5 \\
        --postgres "host=127.0.0.1 port=5432 user=postgres dbname=test"

Every round runs each contestant once, in an order rotated by one each round (so no contestant always goes
first on a cold cache or last on a hot machine), on a fresh file, table or schema; the table prints the
median of the rounds and the spread (min to max). The same ~300-byte update payload everywhere.

SQLite (one thread, a file each in a temp dir; the durability level each peer sets by default is printed):

- ``enqueue``: one job per transaction: ``SqliteUpdateStore.record([update], offset)`` (one update per
  batch, at the default ``synchronous=FULL`` — what a webhook delivery costs alone — and at ``NORMAL``, the
  level litequeue sets), litequeue ``put``, persist-queue
  ``SQLiteAckQueue.put``, huey ``SqliteStorage.enqueue`` (``fsync=True``: huey's default turns syncs off);
- ``consume``: take one, finish it, repeat: fence ``exchange`` of one → ``settle_many`` (``work_synchronous``
  NORMAL), litequeue ``pop`` → ``done``, persist-queue ``get`` → ``ack``, huey ``dequeue`` (which deletes:
  at most once, no acknowledgement, so it does less work than the others).

PostgreSQL (``--postgres``; procrastinate on the same server, each run in a schema of its own):

- ``enqueue``: ``PostgresUpdateStore.record([update], offset)`` vs procrastinate's ``defer`` (sync connector);
- ``consume cN``: N claimers on one store until no job is left pending (a claimer that gets ``None`` asks the
  table; while it still holds a job nobody claimed the claimer tries again, and those empty claims are counted;
  jobs other claimers hold and have not settled yet are not due), vs procrastinate's worker with
  ``concurrency=N`` running a no-op task until its queue is empty.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from telegram_fence.store.sqlite import SqliteUpdateStore

LEASE = 60.0
TEXT = "hello " * 30  # ≈ 300 bytes of payload with the update's envelope


def update(update_id: int) -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {"message_id": update_id, "date": 1_700_000_000,
                    "chat": {"id": update_id, "type": "private"}, "text": TEXT[:180]},
    }


Result = tuple[float, str]  # (jobs per second, a note printed beside it)


# --- SQLite contestants ---------------------------------------------------------------------------------------


def fence_sqlite_enqueue(folder: str, jobs: int, synchronous: str = "FULL") -> Result:
    with SqliteUpdateStore(os.path.join(folder, "fence.db"), synchronous=synchronous) as store:
        began = time.perf_counter()
        for i in range(1, jobs + 1):
            store.record([update(i)], i + 1)
        return jobs / (time.perf_counter() - began), f"WAL, synchronous={synchronous}"


def fence_sqlite_enqueue_normal(folder: str, jobs: int) -> Result:
    return fence_sqlite_enqueue(folder, jobs, "NORMAL")


def fence_sqlite_consume(folder: str, jobs: int) -> Result:
    with SqliteUpdateStore(os.path.join(folder, "fence.db")) as store:
        store.record([update(i) for i in range(1, jobs + 1)], jobs + 1)
        began = time.perf_counter()
        done = 0
        while True:
            claim = next(iter(store.exchange((), LEASE, 1)[1]), None)
            if claim is None:
                break
            store.settle_many([claim.identity])
            done += 1
        assert done == jobs, done
        return jobs / (time.perf_counter() - began), "WAL, synchronous=NORMAL (work)"


def litequeue_enqueue(folder: str, jobs: int) -> Result:
    import json

    from litequeue import LiteQueue

    q = LiteQueue(os.path.join(folder, "lite.db"))
    began = time.perf_counter()
    for i in range(1, jobs + 1):
        q.put(json.dumps(update(i)))
    rate = jobs / (time.perf_counter() - began)
    q.close()
    return rate, "WAL, synchronous=NORMAL"


def litequeue_consume(folder: str, jobs: int) -> Result:
    import json

    from litequeue import LiteQueue

    q = LiteQueue(os.path.join(folder, "lite.db"))
    with q.transaction():
        for i in range(1, jobs + 1):
            q.put(json.dumps(update(i)))
    began = time.perf_counter()
    done = 0
    while True:
        message = q.pop()
        if message is None:
            break
        q.done(message.message_id)
        done += 1
    rate = jobs / (time.perf_counter() - began)
    q.close()
    assert done == jobs, done
    return rate, "WAL, synchronous=NORMAL"


def persistqueue_enqueue(folder: str, jobs: int) -> Result:
    from persistqueue import SQLiteAckQueue

    q = SQLiteAckQueue(os.path.join(folder, "pq"), multithreading=True)
    began = time.perf_counter()
    for i in range(1, jobs + 1):
        q.put(update(i))
    return jobs / (time.perf_counter() - began), "WAL, sqlite3's default synchronous"


def persistqueue_consume(folder: str, jobs: int) -> Result:
    from persistqueue import SQLiteAckQueue

    q = SQLiteAckQueue(os.path.join(folder, "pq"), multithreading=True)
    for i in range(1, jobs + 1):
        q.put(update(i))
    began = time.perf_counter()
    done = 0
    while q.size:
        item = q.get(block=False)
        q.ack(item)
        done += 1
    rate = jobs / (time.perf_counter() - began)
    assert done == jobs, done
    return rate, "WAL, sqlite3's default synchronous"


def huey_enqueue(folder: str, jobs: int) -> Result:
    import json

    from huey.storage import SqliteStorage

    storage = SqliteStorage(filename=os.path.join(folder, "huey.db"), fsync=True)
    began = time.perf_counter()
    for i in range(1, jobs + 1):
        storage.enqueue(json.dumps(update(i)).encode())
    rate = jobs / (time.perf_counter() - began)
    storage.close()
    return rate, "WAL, fsync=True (synchronous=FULL)"


def huey_consume(folder: str, jobs: int) -> Result:
    import json

    from huey.storage import SqliteStorage

    storage = SqliteStorage(filename=os.path.join(folder, "huey.db"), fsync=True)
    with storage.db(commit=True) as cursor:
        cursor.executemany("INSERT INTO task (queue, data, priority) VALUES (?, ?, ?)",
                           [(storage.name, json.dumps(update(i)).encode(), 0) for i in range(1, jobs + 1)])
    began = time.perf_counter()
    done = 0
    while storage.dequeue() is not None:
        done += 1
    rate = jobs / (time.perf_counter() - began)
    storage.close()
    assert done == jobs, done
    return rate, "WAL, fsync=True; dequeue deletes (no ack)"


SQLITE: dict[str, dict[str, Callable[[str, int], Result]]] = {
    "enqueue": {"telegram_fence": fence_sqlite_enqueue, "telegram_fence NORMAL": fence_sqlite_enqueue_normal,
                "litequeue": litequeue_enqueue,
                "persist-queue": persistqueue_enqueue, "huey": huey_enqueue},
    "consume": {"telegram_fence": fence_sqlite_consume, "litequeue": litequeue_consume,
                "persist-queue": persistqueue_consume, "huey": huey_consume},
}


# --- PostgreSQL contestants -----------------------------------------------------------------------------------


@contextlib.contextmanager
def fence_pg(dsn: str) -> Iterator[Any]:
    from pg_cleanup import drop_store  # bench/ is the script's path

    from telegram_fence.store.postgres import PostgresUpdateStore

    table = f"bench_{uuid.uuid4().hex[:10]}"
    store = PostgresUpdateStore(dsn, table=table, pool_size=10)
    try:
        yield store
    finally:
        store.close()
        drop_store(dsn, table)


def fence_pg_enqueue(dsn: str, jobs: int) -> Result:
    with fence_pg(dsn) as store:
        began = time.perf_counter()
        for i in range(1, jobs + 1):
            store.record([update(i)], i + 1)
        return jobs / (time.perf_counter() - began), "synchronous_commit=on"


def pending(store: Any) -> bool:
    """Whether the table holds a job nobody has claimed (asked after an empty claim: a job claimed by another
    claimer and not yet settled is not due, and every job of this run has a chat of its own, so a pending one
    is claimable). Jobs only ever go from pending to claimed here, so one pending now was pending when the
    claim came back empty."""
    with store.read() as conn:
        return bool(conn.execute(f"SELECT EXISTS (SELECT 1 FROM {store.table} WHERE state = 0)").fetchone()[0])


def fence_pg_consume(dsn: str, jobs: int, claimers: int) -> Result:
    with fence_pg(dsn) as store:
        for first in range(1, jobs + 1, 100):
            store.record([update(i) for i in range(first, min(first + 100, jobs + 1))], min(first + 100, jobs + 1))
        done = [0] * claimers
        empty = [0] * claimers
        barrier = threading.Barrier(claimers + 1)

        def claimer(k: int) -> None:
            barrier.wait()
            while True:
                claim = next(iter(store.exchange((), LEASE, 1)[1]), None)
                if claim is None:
                    if not pending(store):
                        return  # nothing left to claim: the other claimers settle what they hold
                    empty[k] += 1  # nothing claimed while the table still held a due, unclaimed job: try again
                    continue
                store.settle_many([claim.identity])
                done[k] += 1

        threads = [threading.Thread(target=claimer, args=(k,), name=f"bench-claimer-{k}") for k in range(claimers)]
        for t in threads:
            t.start()
        barrier.wait()
        began = time.perf_counter()
        for t in threads:
            t.join()
        rate = jobs / (time.perf_counter() - began)
        assert sum(done) == jobs, sum(done)
        return rate, f"{sum(empty)} empty claims while work was due"


@contextlib.contextmanager
def procrastinate_app(dsn: str, *, sync: bool) -> Iterator[tuple[Any, Any]]:
    import logging

    import procrastinate
    import psycopg

    logging.getLogger("procrastinate").setLevel(logging.ERROR)  # its "App is instantiated in __main__" notice
    schema = f"bench_pc_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    options = f"-c search_path={schema}"
    connector: Any = (procrastinate.SyncPsycopgConnector(conninfo=dsn, kwargs={"options": options}) if sync
                      else procrastinate.PsycopgConnector(conninfo=dsn, kwargs={"options": options}))
    app = procrastinate.App(connector=connector)

    @app.task(name="noop", queue="bench")
    def noop(n: int) -> None:
        return None

    try:
        with app.open():
            app.schema_manager.apply_schema()
        yield app, noop
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def procrastinate_enqueue(dsn: str, jobs: int) -> Result:
    with procrastinate_app(dsn, sync=True) as (app, noop), app.open():
        began = time.perf_counter()
        for i in range(1, jobs + 1):
            noop.defer(n=i)
        return jobs / (time.perf_counter() - began), "defer, sync connector"


def procrastinate_consume(dsn: str, jobs: int, concurrency: int) -> Result:
    with procrastinate_app(dsn, sync=False) as (app, noop):
        with app.open():
            for i in range(1, jobs + 1):
                noop.defer(n=i)
        began = time.perf_counter()
        app.run_worker(queues=["bench"], wait=False, concurrency=concurrency, install_signal_handlers=False,
                       delete_jobs="never")
        return jobs / (time.perf_counter() - began), f"worker, concurrency={concurrency}"


def pg_scenarios(dsn: str) -> dict[str, dict[str, Callable[[int], Result]]]:
    out: dict[str, dict[str, Callable[[int], Result]]] = {
        "enqueue": {"telegram_fence": lambda n: fence_pg_enqueue(dsn, n),
                    "procrastinate": lambda n: procrastinate_enqueue(dsn, n)},
    }
    for c in (1, 8):
        out[f"consume c{c}"] = {
            "telegram_fence": lambda n, c=c: fence_pg_consume(dsn, n, c),  # type: ignore[misc]
            "procrastinate": lambda n, c=c: procrastinate_consume(dsn, n, c),  # type: ignore[misc]
        }
    return out


# --- the run --------------------------------------------------------------------------------------------------


def rotate(names: list[str], k: int) -> list[str]:
    k %= len(names)
    return names[k:] + names[:k]


def run_rounds(label: str, contestants: dict[str, Callable[[int], Result]], jobs: int, rounds: int) -> None:
    rates: dict[str, list[float]] = {name: [] for name in contestants}
    notes: dict[str, str] = {}
    names = list(contestants)
    for r in range(rounds):
        for name in rotate(names, r):
            rate, note = contestants[name](jobs)
            rates[name].append(rate)
            notes[name] = note
    fence = statistics.median(rates["telegram_fence"])
    for name in names:
        median = statistics.median(rates[name])
        ratio = "" if name == "telegram_fence" else f"  fence is {fence / median:.2f}x"
        print(f"| {label} | {name} | {median:,.0f}/s | {min(rates[name]):,.0f}-{max(rates[name]):,.0f} |"
              f" {notes[name]} |{ratio}")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per contestant per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is shown (default 3)")
    parser.add_argument("--postgres", metavar="DSN", help="also compare against procrastinate on this server")
    parser.add_argument("--dir", help="where the SQLite files go (default: a new temp dir)")
    parser.add_argument("--only-postgres", action="store_true", help="skip the SQLite peers (needs --postgres)")
    args = parser.parse_args()
    if args.only_postgres and not args.postgres:
        parser.error("--only-postgres needs --postgres DSN")
    if args.jobs < 1 or args.rounds < 1:
        parser.error("--jobs and --rounds must be at least 1")
    print(f"# python {platform.python_version()}, {os.cpu_count()} cores, {args.jobs} jobs, {args.rounds} rounds")
    print("| scenario | contestant | median | min-max | durability / note |")
    print("|---|---|---|---|---|")
    for label, contestants in ({} if args.only_postgres else SQLITE).items():
        def fresh(fn: Callable[[str, int], Result]) -> Callable[[int], Result]:
            def run(n: int) -> Result:
                folder = tempfile.mkdtemp(prefix="tf-peers-", dir=args.dir)
                try:
                    return fn(folder, n)
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
            return run

        run_rounds(f"sqlite {label}", {name: fresh(fn) for name, fn in contestants.items()}, args.jobs, args.rounds)
    if args.postgres:
        for label, pg_contestants in pg_scenarios(args.postgres).items():
            run_rounds(f"postgres {label}", pg_contestants, args.jobs, args.rounds)


if __name__ == "__main__":
    main()
