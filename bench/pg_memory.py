"""Where the memory of a fence on PostgreSQL goes: plain telebot, the fence on PostgreSQL and the fence on SQLite,
each in its own child process, alternating, medians of the rounds.

    python bench/pg_memory.py --dsn "host=127.0.0.1 port=5432 user=postgres dbname=test" --rounds 3 --n 5000
    python bench/pg_memory.py --rounds 3 --n 20000,100000 --only pg          # a backlog at "Telegram"
    python bench/pg_memory.py --rounds 3 --n 20000,100000 --only pg --backlog database
    python bench/pg_memory.py --rounds 1 --n 5000 --only pg --tracemalloc   # Python's own allocations
    python bench/pg_memory.py --rounds 1 --n 5000 --only plain,pg --smaps   # resident memory by kind
    python bench/pg_memory.py --rounds 3 --n 5000 --only plain,pg --before /tmp/tf-before   # an older checkout too
    python bench/pg_memory.py --rounds 3 --n 5000 --only plain,psycopg,pg   # the floor: what psycopg alone costs

Each child reads its ``VmRSS`` after every step (importing telebot, ``from telegram_fence import Fence``,
psycopg, the PostgreSQL store's modules (with psycopg_pool if they import it), opening the store, building the
fence (on SQLite: opening its store), running the backlog through a trivial handler), its peak (``VmHWM``) at
the end, and whether APSW and psycopg_pool were loaded; the steps are printed as increments. The ``psycopg`` child
is plain telebot that also imports psycopg and keeps one connection, on which it ran a statement, while it polls:
the part of the fence's figure that any program using psycopg pays. ``--backlog
telegram`` (the default) pushes the updates to the fake Bot API server before the child starts; ``--backlog
database`` records them in the store's table instead (the fence finds them pending: the backlog waits in the
database). ``--tracemalloc`` adds, in separate children, Python's traced peak while the fence runs and the files
allocating the most (tracemalloc's own bookkeeping inflates RSS there: those children's RSS is not reported).

The children read compiled bytecode (a temporary ``PYTHONPYCACHEPREFIX``, written by one unrecorded run of each
first), as an installed wheel has it: with ``PYTHONDONTWRITEBYTECODE=1`` and a source checkout every child would
compile telegram_fence again, and the compiler's leftovers (≈ 1 MB here) would count as the fence's. ``--source``
measures that way instead.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import uuid
from typing import Any

from bytecode import cache_dir, child_env  # bench/ is the script's path


def _status(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _smaps() -> dict[str, Any]:
    """This process's resident memory (kB) by kind, read from ``/proc/self/smaps``: the main heap, glibc's
    per-thread malloc arenas (64 MB reservations, read as one read-write mapping followed by its ``---p`` rest),
    thread stacks (an 8 MB-ish read-write mapping right above a 4 kB guard), other anonymous mappings (Python's
    object arenas among them), and files (by name); plus the count of arenas and stacks."""
    maps: list[tuple[str, int, str, int]] = []  # (perms, size kB, name, rss kB)
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and ":" in parts[3]:
                maps.append((parts[1], 0, parts[5] if len(parts) > 5 else "", 0))
            elif parts[0] == "Size:":
                maps[-1] = (maps[-1][0], int(parts[1]), maps[-1][2], 0)
            elif parts[0] == "Rss:":
                maps[-1] = (*maps[-1][:3], int(parts[1]))
    kinds: collections.Counter[str] = collections.Counter()
    arenas = stacks = 0
    for i, (perms, size, name, rss) in enumerate(maps):
        after = maps[i + 1] if i + 1 < len(maps) else ("", 0, "x", 0)
        before = maps[i - 1] if i else ("", 0, "x", 0)
        if name == "[heap]":
            kinds["heap"] += rss
        elif name == "" and perms.startswith("rw") and after[0] == "---p" and after[2] == "" \
                and size + after[1] == 65536:
            kinds["malloc arenas"] += rss
            arenas += 1
        elif name == "" and perms.startswith("rw") and before[0] == "---p" and before[1] == 4 and 4000 < size < 9000:
            kinds["thread stacks"] += rss
            stacks += 1
        elif name == "" or name.startswith("["):
            kinds["other anonymous"] += rss
        else:
            kinds[os.path.basename(name)] += rss
    return {"kinds": dict(kinds), "arenas": arenas, "stacks": stacks}


def child(mode: str, api_url: str, token: str, n: int, db: str, trace: str) -> None:
    steps: dict[str, float] = {"start": _status("VmRSS")}
    import telebot

    steps["telebot"] = _status("VmRSS")
    bot = telebot.TeleBot(token, threaded=False)
    done, count, lock = threading.Event(), [0], threading.Lock()

    @bot.message_handler(func=lambda m: True)
    def trivial(message: Any) -> None:
        with lock:
            count[0] += 1
            if count[0] >= n:
                done.set()

    from telegram_fence.telegram import set_api_server

    set_api_server(api_url)
    extra: dict[str, Any] = {}
    if mode in ("plain", "psycopg"):
        if mode == "psycopg":  # the floor: psycopg imported, one connection open and used
            import psycopg

            steps["psycopg"] = _status("VmRSS")
            conn = psycopg.connect(db)
            conn.execute("SELECT 1").fetchall()
            steps["connected"] = _status("VmRSS")

        def stopper() -> None:
            done.wait()
            if trace == "s":
                extra["smaps"] = _smaps()
                extra["threads"] = threading.active_count()
            bot.stop_polling()

        threading.Thread(target=stopper, daemon=True).start()
        bot.polling(non_stop=True, interval=0, timeout=5, long_polling_timeout=1)
    else:
        from telegram_fence import Fence

        steps["telegram_fence"] = _status("VmRSS")
        store: Any = db
        if mode == "pg":
            import psycopg

            steps["psycopg"] = _status("VmRSS")
            from telegram_fence.store.postgres import PostgresUpdateStore

            PostgresUpdateStore.__name__  # noqa: B018 (the package imports the store's modules on first use)
            steps["store modules"] = _status("VmRSS")
            store = PostgresUpdateStore(db.split("|")[0], table=db.split("|")[1])  # (complete: no DDL)
            steps["store opened"] = _status("VmRSS")
        fence = Fence(bot, store, workers=4, long_poll_timeout=1)
        steps["fence built"] = _status("VmRSS")
        if trace == "1":
            import tracemalloc

            tracemalloc.start(25)
        fence.start()
        done.wait()
        extra["threads"] = threading.active_count()
        if mode == "pg":
            extra["pool connections"] = fence.store.pool.get_stats().get("pool_size")
        if trace == "1":
            extra["traced"] = _traced()
        if trace == "s":
            extra["smaps"] = _smaps()
        fence.stop()
        fence.join(30)
    steps["ran"] = _status("VmRSS")
    if mode not in ("plain", "psycopg"):
        import telegram_fence

        extra["tree"] = os.path.dirname(os.path.dirname(telegram_fence.__file__))
    loaded = {name: name in sys.modules for name in ("apsw", "psycopg_pool")}
    print(json.dumps({"steps": steps, "hwm": _status("VmHWM"), "loaded": loaded, **extra}))


def _traced() -> dict[str, Any]:
    """tracemalloc's current and peak sizes (MB) and the 8 source lines (innermost of ours or a package's)
    holding the most now."""
    import tracemalloc

    by_line: collections.Counter[str] = collections.Counter()
    for stat in tracemalloc.take_snapshot().statistics("traceback"):
        where = "?"
        for frame in reversed(list(stat.traceback)):
            if "site-packages/" in frame.filename or "telegram_fence/" in frame.filename:
                name = frame.filename.split("site-packages/")[-1]
                where = f"{name[name.find('telegram_fence/'):] if 'telegram_fence/' in name else name}:{frame.lineno}"
                break
        by_line[where] += stat.size
    current, peak = tracemalloc.get_traced_memory()
    return {"current": current / 1e6, "peak": peak / 1e6, "top": by_line.most_common(8)}


def _update(update_id: int, chats: int) -> dict[str, Any]:
    chat = {"id": 1 + update_id % chats, "type": "private"}
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "chat": chat,
                                                "from": {"id": chat["id"], "is_bot": False, "first_name": "u"},
                                                "text": f"m{update_id}"}}


def run_one(mode: str, n: int, dsn: str, backlog: str, trace: str = "0", tree: str | None = None) -> dict[str, Any]:
    """One child's figures; ``trace``: ``"0"`` none, ``"1"`` tracemalloc, ``"s"`` the smaps breakdown."""
    from telegram_fence.testing import FakeBotAPI

    chats = 50
    with tempfile.TemporaryDirectory() as tmp, FakeBotAPI(max_long_poll=1.0) as api:
        db, table, setup = os.path.join(tmp, "bench.db"), None, None
        if mode == "pg":
            from telegram_fence.store.postgres import PostgresUpdateStore

            table = f"tf_pgmem_{uuid.uuid4().hex[:10]}"
            setup = PostgresUpdateStore(dsn, table=table)
            db = f"{dsn}|{table}"
        elif mode == "psycopg":
            db = dsn
        elif mode == "sqlite" and backlog == "database":
            from telegram_fence.store.sqlite import SqliteUpdateStore

            setup = SqliteUpdateStore(db)
        if mode not in ("plain", "psycopg") and backlog == "database":
            for first in range(1, n + 1, 1000):
                setup.record([_update(i, chats) for i in range(first, min(n, first + 999) + 1)], 0)
        else:
            api.push_messages(n, chats=list(range(1, chats + 1)), text="m{i}")
        if setup is not None:
            setup.close()
        try:
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, api.api_url, api.token, str(n), db, trace],
                check=True, capture_output=True, text=True, timeout=1800, env=_child_env(tree),
            )
        finally:
            if table is not None:
                from pg_cleanup import drop_store  # bench/ is the script's path

                drop_store(dsn, table)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


#: where the children keep their bytecode (see ``--source``); set by :func:`main`
_PYCACHE: str | None = None


def _child_env(tree: str | None) -> dict[str, str]:
    """The children's environment: telegram_fence from ``tree`` (``None``: this process's), with compiled bytecode
    kept in :data:`_PYCACHE` (as an installed package has it, whatever ``PYTHONDONTWRITEBYTECODE`` says), or as
    this process has it when ``--source`` was given."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.path.abspath(tree)
    return child_env(_PYCACHE, env)


def _increments(steps: dict[str, float]) -> dict[str, float]:
    names = list(steps)
    return {name: steps[name] - steps[before] for before, name in itertools.pairwise(names)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])  # (none under -OO)
    parser.add_argument("--dsn", default=os.environ.get("TELEGRAM_FENCE_PG_DSN"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", default="5000", help="updates per run; several, comma-separated, run one by one")
    parser.add_argument("--only", default="plain,pg,sqlite",
                        help="which children: plain, psycopg, pg, sqlite (default plain,pg,sqlite)")
    parser.add_argument("--backlog", choices=("telegram", "database"), default="telegram")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--smaps", action="store_true",
                        help="also, in separate children, resident memory by kind at the end of the backlog "
                             "(heap, malloc arenas, thread stacks, other anonymous, the largest files)")
    parser.add_argument("--source", action="store_true",
                        help="let the children compile telegram_fence from source when PYTHONDONTWRITEBYTECODE is set "
                             "(the compiler's garbage then counts; by default they get bytecode as a wheel has it)")
    parser.add_argument("--before", metavar="TREE",
                        help="also run each fence from this checkout (e.g. a git worktree of an older commit), "
                             "alternating with this one's, for before/after figures from one run")
    parser.add_argument("--child", nargs=6)
    args = parser.parse_args()
    if args.child:
        mode, api_url, token, n, db, trace = args.child
        child(mode, api_url, token, int(n), db, trace)
        return
    global _PYCACHE
    pycache = cache_dir("tf-pgmem-pyc-")
    _PYCACHE = None if args.source else pycache.name
    modes = args.only.split(",")
    if ("pg" in modes or "psycopg" in modes) and not args.dsn:
        parser.error("the pg and psycopg children need --dsn (or TELEGRAM_FENCE_PG_DSN)")
    if args.backlog == "database" and "plain" not in modes:
        modes = ["plain", *modes]  # (plain telebot's backlog always waits at "Telegram": the reference)
    # (label, mode, tree): with --before, each fence runs from that tree too, in the same rounds
    variants = [(m, m, None) for m in modes]
    if args.before:
        fences = [m for m in modes if m not in ("plain", "psycopg")]
        before = [(f"{m}@before", m, args.before) for m in fences]
        variants = [v for v in variants if v[1] not in fences] + [v for pair in zip(before, [v for v in variants
                                                                                         if v[1] in fences],
                                                                                strict=True) for v in pair]
    dsn = args.dsn or ""
    for _, mode, tree in variants:  # one unrecorded run each first: it writes the bytecode the recorded runs read
        run_one(mode, 200, dsn, "telegram", tree=tree)
    for n in (int(x) for x in args.n.split(",")):
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in variants}
        for round_ in range(args.rounds):
            for label, mode, tree in variants:
                got = run_one(mode, n, dsn, args.backlog if mode not in ("plain", "psycopg") else "telegram", tree=tree)
                runs[label].append(got)
                print(f"round {round_ + 1} {label:10s} N={n}: peak {got['hwm']:5.1f} MB "
                      + " ".join(f"{k} {v:+.1f}" for k, v in _increments(got["steps"]).items())
                      + (f" | threads {got['threads']}" if "threads" in got else "")
                      + (f", pool {got['pool connections']}" if "pool connections" in got else "")
                      + "".join(f", {name} loaded" for name, yes in got["loaded"].items() if yes), flush=True)
        print(f"medians of {args.rounds}, N={n}, backlog at {args.backlog}:")
        plain = statistics.median(r["hwm"] for r in runs["plain"]) if "plain" in runs else None
        for label, mode, _ in variants:
            hwm = statistics.median(r["hwm"] for r in runs[label])
            steps = {k: statistics.median(_increments(r["steps"])[k] for r in runs[label])
                     for k in _increments(runs[label][0]["steps"])}
            over = f" ({hwm - plain:+.1f} MB over plain telebot)" if plain is not None and mode != "plain" else ""
            print(f"  {label:10s} peak {hwm:5.1f} MB{over}; " + ", ".join(f"{k} {v:+.1f}" for k, v in steps.items()))
        if args.tracemalloc:
            for label, mode, tree in (v for v in variants if v[1] not in ("plain", "psycopg")):
                traced = run_one(mode, n, dsn, args.backlog, trace="1", tree=tree)["traced"]
                print(f"  {label:10s} tracemalloc while running: now {traced['current']:.2f} MB, "
                      f"peak {traced['peak']:.2f} MB; holding the most: "
                      + ", ".join(f"{where} {size / 1e3:.0f} kB" for where, size in traced["top"]))
        if args.smaps:
            for label, mode, tree in variants:
                got = run_one(mode, n, dsn, args.backlog if mode not in ("plain", "psycopg") else "telegram", trace="s",
                              tree=tree)
                kinds = sorted(got["smaps"]["kinds"].items(), key=lambda kv: -kv[1])
                print(f"  {label:10s} resident by kind at the end (kB; {got['smaps']['arenas']} malloc arenas, "
                      f"{got['smaps']['stacks']} thread stacks, {got['threads']} threads): "
                      + ", ".join(f"{k} {v}" for k, v in kinds[:14]), flush=True)

if __name__ == "__main__":
    main()
