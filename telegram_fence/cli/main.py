"""``telegram-fence`` / ``python -m telegram_fence``: the demo and operations on a fence's database.

Subcommands: ``demo``, ``status DB``, ``exhaustions DB``, ``schema DB``, ``broadcast …``, ``outbox DB``.
``DB`` is a SQLite file, or a PostgreSQL connection string (``postgresql://…`` or ``host=… dbname=…``)
with ``--table`` naming the inbox table; ``schema --postgres TABLE`` prints the PostgreSQL DDL.
Every subcommand exits 0 on success, 1 when what it checks is unhealthy, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from .. import __version__
from ..errors import FenceError
from . import broadcast, outbox

__all__ = ["main"]


def _is_conninfo(db: str) -> bool:
    """Whether ``db`` names a PostgreSQL server rather than a SQLite file."""
    return db.startswith(("postgresql://", "postgres://")) or ("=" in db and ("host=" in db or "dbname=" in db))


def _open_store(path: str, table: str = "fence_updates") -> Any:
    import os

    from ..store.sqlite import SqliteUpdateStore

    if _is_conninfo(path):
        from ..store.postgres import PostgresUpdateStore

        return PostgresUpdateStore(path, table=table, create_table=False, pool_size=2)

    if not os.path.exists(path):
        raise FenceError(f"{path} does not exist; pass the database file the bot runs with")
    return SqliteUpdateStore(path)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    argv = ["--updates", str(args.updates), "--kills", str(args.kills)]
    if args.seed is not None:
        argv += ["--seed", str(args.seed)]
    return demo_main(argv)


def _cmd_status(args: argparse.Namespace) -> int:
    store = _open_store(args.db, args.table)
    try:
        stats = store.stats()
    finally:
        store.close()
    now = time.time()
    generation = stats.get("generation") or {}
    progress = generation.get("progress_at")
    progress_age = None if progress is None else max(0.0, now - progress)
    stats["progress_age"] = progress_age
    unhealthy = []
    if args.max_progress_age is not None:
        if not generation:
            unhealthy.append("no poller has ever run on this file")
        elif generation.get("ended_at") is not None:
            unhealthy.append(f"poller generation {generation['generation']} ended: {generation.get('end_reason')}")
        elif progress_age is None:
            unhealthy.append(f"poller generation {generation['generation']} has made no progress yet")
        elif progress_age > args.max_progress_age:
            unhealthy.append(
                f"poller generation {generation['generation']} last made progress {progress_age:.0f} s ago"
            )
    stats["healthy"] = not unhealthy
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
    else:
        print(f"cursor               {stats['cursor']}")
        print(f"pending / claimed    {stats['pending']} / {stats['claimed']}")
        print(f"settled / skipped    {stats['settled']} / {stats['skipped']}")
        print(f"exhausted (unacked)  {stats['exhausted']}  (acknowledged: {stats['acknowledged']})")
        age = stats["oldest_open_age"]
        print(f"oldest open update   {'-' if age is None else f'{age:.1f} s'}")
        if generation:
            state = "ended: " + str(generation["end_reason"]) if generation.get("ended_at") else "running"
            since = "never" if progress_age is None else f"{progress_age:.1f} s ago"
            print(f"poller generation    {generation['generation']} (pid {generation['pid']}, {state}), "
                  f"last progress {since}")
        else:
            print("poller generation    none yet")
        leader = stats.get("leader")
        if leader:
            live = "holding the lock" if leader.get("live") else "lock not held: nobody polls now"
            print(f"poll leader          pid {leader['pid']} on {leader['host']}, epoch {leader['epoch']} ({live})")
        print(f"schema version       {stats['schema_version']}")
        for problem in unhealthy:
            print(f"UNHEALTHY: {problem}")
    return 1 if unhealthy else 0


def _parse_identity(text: str) -> Any:
    from ..store import Identity

    parts = text.split("/")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2]:
        raise FenceError(f"{text!r} is not an exhaustion identity; use UPDATE_ID/ATTEMPT/CLAIM_ID as listed")
    return Identity(int(parts[0]), int(parts[1]), parts[2])


def _cmd_exhaustions(args: argparse.Namespace) -> int:
    store = _open_store(args.db, args.table)
    try:
        if args.ack:
            missing = [text for text in args.ack if not store.acknowledge_exhaustion(_parse_identity(text))]
            for text in missing:
                print(f"no unacknowledged exhaustion {text}", file=sys.stderr)
            return 1 if missing else 0
        after = None
        rows = []
        while True:
            page = store.due_exhaustions(after=after, limit=100)
            if not page:
                break
            rows.extend(page)
            after = page[-1].identity
    finally:
        store.close()
    if args.json:
        print(json.dumps([
            {"identity": str(e.identity), "update_id": e.identity.update_id, "attempt": e.identity.attempt,
             "claim_id": e.identity.claim_id, "chat_id": e.chat_id, "error": e.error, "exhausted_at": e.exhausted_at,
             "update": e.update}
            for e in rows
        ], indent=2))
    else:
        for e in rows:
            last = (e.error.strip().splitlines() or [""])[-1]
            print(f"{e.identity}  chat {e.chat_id}  {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(e.exhausted_at))}Z"
                  f"  {last[:200]}")
        print(f"{len(rows)} unacknowledged exhaustion(s)")
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    if args.postgres is not None:
        from ..store.postgres import schema_sql

        print(schema_sql(args.postgres), end="")
        return 0
    if args.db is None:
        raise FenceError("pass the database file, or --postgres TABLE to print the PostgreSQL schema")
    from ..store.schema import LATEST

    store = _open_store(args.db)
    try:
        version = store.stats()["schema_version"]
    finally:
        store.close()
    print(f"{args.db}: schema version {version} (this library writes version {LATEST})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="telegram-fence", description="Durable pyTelegramBotAPI bots: operations.")
    parser.add_argument("--version", action="version", version=f"telegram_fence {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a fenced bot against the built-in fake Bot API server and crash it")
    demo.add_argument("--updates", type=int, default=300)
    demo.add_argument("--kills", type=int, default=3)
    demo.add_argument("--seed", type=int, default=None)
    demo.set_defaults(func=_cmd_demo)

    status = sub.add_parser("status", help="counts by state, cursor, poller generation and progress")
    status.add_argument("db")
    status.add_argument("--table", default="fence_updates", help="the inbox table (PostgreSQL only)")
    status.add_argument("--json", action="store_true")
    status.add_argument("--max-progress-age", type=float, default=None, metavar="SECONDS",
                        help="exit 1 unless the current poller generation made progress this recently")
    status.set_defaults(func=_cmd_status)

    exhaustions = sub.add_parser("exhaustions", help="list (or acknowledge) terminal failures")
    exhaustions.add_argument("db")
    exhaustions.add_argument("--table", default="fence_updates", help="the inbox table (PostgreSQL only)")
    exhaustions.add_argument("--json", action="store_true")
    exhaustions.add_argument("--ack", nargs="+", metavar="UPDATE_ID/ATTEMPT/CLAIM_ID",
                             help="acknowledge these exhaustions (makes them prunable)")
    exhaustions.set_defaults(func=_cmd_exhaustions)

    schema = sub.add_parser("schema", help="show the database's schema version (opening migrates it), "
                                           "or print the PostgreSQL DDL with --postgres TABLE")
    schema.add_argument("db", nargs="?")
    schema.add_argument("--postgres", metavar="TABLE", default=None,
                        help="print the PostgreSQL schema (tables, indexes, migration) for TABLE and exit")
    schema.set_defaults(func=_cmd_schema)

    for module in (broadcast, outbox):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except FenceError as exc:
        print(f"telegram-fence: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
