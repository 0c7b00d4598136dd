"""``telegram-fence updates|show|retry|prune|migrate``: what an operator does to a bot's database without SQL.

``updates``, ``show``, ``retry`` and ``prune`` take a SQLite file or a PostgreSQL connection string (with
``--table``), alike. Each is safe while the bot runs: reads open the file read-only (on PostgreSQL, a transaction
of SELECTs), writes are short transactions under the store's lock timeout. Every command first checks that the
file is a current telegram_fence database, or that the table and its ``_meta`` table exist (nothing is created);
only ``migrate`` (a SQLite file only) upgrades one.

Exit status: 0 done; 1 some of what was asked could not be done (an update not exhausted, not stored; the file
locked by another connection past the busy timeout);
2 bad input or not a (current) telegram_fence database.

May import anything below the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..store.operations import (
    NO_PAYLOAD,
    STATE_FILTERS,
    Tables,
    list_updates,
    prune_finished,
    retry_exhausted,
    show_update,
)
from ..store.schema import LATEST
from ..store.sqlite import SqliteUpdateStore
from .args import chat_id, duration, positive_int
from .args import update_id as update_id_type
from .bound import add_timeout
from .database import DatabaseRefused, inspect, is_conninfo, open_current, open_postgres, read_only

__all__ = ["add_parsers"]


_SQLITE_ONLY = "the bot's SQLite file (a SQLite file only: PostgreSQL is not supported here)"
_DB = "the bot's SQLite file, or a PostgreSQL connection string (with --table)"
_TABLE = "the inbox table (PostgreSQL only; default fence_updates)"


def add_parsers(sub: Any) -> None:
    """Register ``updates``, ``show``, ``retry``, ``prune`` and ``migrate`` on ``sub`` (``add_subparsers()``)."""
    updates = sub.add_parser("updates", help="list stored updates, newest first (read-only)")
    updates.add_argument("db", metavar="DB", help=_DB)
    updates.add_argument("--table", default="fence_updates", help=_TABLE)
    updates.add_argument("--state", choices=STATE_FILTERS, help="only this state (open: pending or claimed)")
    updates.add_argument("--chat", type=chat_id, metavar="ID", help="only this chat")
    updates.add_argument("--limit", type=positive_int, default=50, metavar="N", help="at most N rows (default 50)")
    updates.add_argument("--json", action="store_true", help="print a JSON list")
    add_timeout(updates)
    updates.set_defaults(func=cmd_updates)

    show = sub.add_parser("show", help="one update: raw update, attempts, last error, state, times (read-only)")
    show.add_argument("db", metavar="DB", help=_DB)
    show.add_argument("--table", default="fence_updates", help=_TABLE)
    show.add_argument("update_id", type=update_id_type, metavar="UPDATE_ID", help="the update to show")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    add_timeout(show)
    show.set_defaults(func=cmd_show)

    retry = sub.add_parser(
        "retry",
        help="put exhausted updates back to pending with a fresh attempt budget (a running bot handles them)",
        description="Put exhausted updates back to pending, due now, with a fresh attempt budget. The exhaustion "
        "counts as acknowledged: on_exhausted is not told of it (again). If the update fails again, that is a "
        "new exhaustion with a new identity, delivered as usual.",
    )
    retry.add_argument("db", metavar="DB", help=_DB)
    retry.add_argument("--table", default="fence_updates", help=_TABLE)
    retry.add_argument("update_ids", type=update_id_type, nargs="+", metavar="UPDATE_ID",
                       help="exhausted updates to retry")
    retry.set_defaults(func=cmd_retry)

    prune = sub.add_parser(
        "prune",
        help="delete settled/skipped updates and delivered captures older than a duration",
        description="Delete settled and skipped updates, and delivered outbox captures, last changed longer ago "
        "than --older-than. Never deletes a pending, claimed or exhausted update, nor an undelivered capture.",
    )
    prune.add_argument("db", metavar="DB", help=_DB)
    prune.add_argument("--table", default="fence_updates", help=_TABLE)
    prune.add_argument("--older-than", type=duration, required=True, metavar="AGE",
                       help="a number with its unit: s seconds, m minutes, h hours, d days, w weeks (e.g. 7d, 12h, "
                       "30m, 45s); a bare number is refused")
    prune.add_argument("--json", action="store_true", help="print the counts as JSON")
    prune.set_defaults(func=cmd_prune)

    migrate = sub.add_parser(
        "migrate",
        help=f"upgrade a telegram_fence database to schema version {LATEST} (the bot does it on start too)",
    )
    migrate.add_argument("db", metavar="DB", help=_SQLITE_ONLY)
    migrate.set_defaults(func=cmd_migrate)


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + "Z"


def _last_line(text: str | None, width: int = 120) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1][:width] if lines else ""


def _tables(args: argparse.Namespace) -> Tables:
    """The tables the command works on: the SQLite file's, or ``--table``'s for a connection string."""
    return Tables(args.table if is_conninfo(args.db) else None)


@contextmanager
def _store(args: argparse.Namespace) -> Iterator[Any]:
    """The store a writing command works on: the current fence file, or the PostgreSQL store on ``--table``
    (never created); closed after."""
    if not is_conninfo(args.db):
        with open_current(args.db) as store:
            yield store
        return
    with open_postgres(args.db, args.table, pool_size=1) as store:
        yield store


def cmd_updates(args: argparse.Namespace) -> int:
    """Handle ``updates``; returns the exit status."""
    with read_only(args.db, args.table, args.timeout) as conn:
        rows = list_updates(conn, now=time.time(), state=args.state, chat_id=args.chat, limit=args.limit,
                            tables=_tables(args))
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    for row in rows:
        state = row["state"]
        if row.get("acknowledged"):
            state += " (acked)"
        elif row.get("lease_lapsed"):
            state += " (lease lapsed)"
        chat = "-" if row["chat_id"] is None else row["chat_id"]
        print(f"{row['update_id']:>12}  chat {chat!s:>14}  {state:<20} attempts {row['attempts']:<3} "
              f"changed {_when(row['changed_at'])}  {_last_line(row['error'], 80)}")
    print(f"{len(rows)} update(s) shown (newest first, at most {args.limit})")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Handle ``show``; returns the exit status (1 when the update is not stored)."""
    with read_only(args.db, args.table, args.timeout) as conn:
        item = show_update(conn, args.update_id, now=time.time(), tables=_tables(args))
    if item is None:
        where = f"table {args.table}" if is_conninfo(args.db) else args.db
        print(f"telegram-fence: update {args.update_id} is not stored in {where} (never received, or pruned)",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(item, indent=2, sort_keys=True))
        return 0
    state = item["state"]
    if "acknowledged" in item:
        state += " (acknowledged)" if item["acknowledged"] else " (not acknowledged)"
    if "lease_until" in item:
        state += f", lease until {_when(item['lease_until'])}" + (" (lapsed)" if item["lease_lapsed"] else "")
    if item.get("due_at"):
        state += f", due {_when(item['due_at'])}"
    print(f"update       {item['update_id']}")
    print(f"chat         {'-' if item['chat_id'] is None else item['chat_id']}")
    print(f"state        {state}")
    print(f"attempts     {item['attempts']}" + (f" (claim {item['claim_id']})" if item["claim_id"] else ""))
    print(f"recorded     {_when(item['recorded_at'])}")
    print(f"changed      {_when(item['changed_at'])}")
    for capture in item["captures"]:
        print(f"capture      {capture['key']} {capture['state']} attempts {capture['attempts']}")
    print("last error" + ("   -" if not item["error"] else ":"))
    if item["error"]:
        for line in str(item["error"]).rstrip().splitlines():
            print(f"  {line}")
    print("update:")
    print(json.dumps(item["update"], indent=2, ensure_ascii=False))
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    """Handle ``retry``; returns the exit status (1 when an update was not exhausted)."""
    with _store(args) as store:
        results = retry_exhausted(store, args.update_ids, tables=_tables(args))
    status = 0
    for update_id, kept in results.items():
        if kept is None:
            print(f"update {update_id}: back to pending with a fresh attempt budget")
        elif kept == NO_PAYLOAD:
            print(f"telegram-fence: update {update_id}: not retried: it holds no payload to run (it could not be "
                  "read or stored when it arrived; see `telegram-fence show`), nothing changed; acknowledge it "
                  "with `telegram-fence exhaustions DB --ack ...`", file=sys.stderr)
            status = 1
        else:
            print(f"telegram-fence: update {update_id}: not retried: it is {kept}, not exhausted", file=sys.stderr)
            status = 1
    return status


def cmd_prune(args: argparse.Namespace) -> int:
    """Handle ``prune``; returns the exit status."""
    with _store(args) as store:
        counts = prune_finished(store, store.clock() - args.older_than, tables=_tables(args))
    if args.json:
        print(json.dumps(counts, sort_keys=True))
    else:
        print(f"deleted {counts['updates']} settled/skipped update(s) and {counts['captures']} delivered "
              f"capture(s) older than {args.older_than:g} s")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Handle ``migrate``: upgrade (and switch to WAL) a fence database; refuse anything else."""
    found = inspect(args.db)
    if found.version > LATEST:
        raise DatabaseRefused(
            f"{found.path}: schema version {found.version} is newer than this telegram_fence ({LATEST}); "
            "nothing to do here"
        )
    if found.version == LATEST and found.wal:
        print(f"{found.path}: already current (schema version {LATEST}); nothing changed")
        return 0
    with SqliteUpdateStore(found.path) as store:
        version = int(store.stats()["schema_version"])
    if found.version == version:
        print(f"{found.path}: already current (schema version {version}); switched it back to WAL mode")
    else:
        print(f"{found.path}: upgraded from schema version {found.version} to {version}")
    return 0
