"""``telegram-fence status|exhaustions|schema|updates|show|retry|prune|migrate``: an operator's view of a bot's inbox
and what they do to it without SQL, safe while the bot runs (reads answer within ``--timeout``, writes are short
transactions); only ``migrate`` upgrades a schema."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from ..errors import FenceError
from ..store import Identity
from ..store.operations import NO_PAYLOAD, Tables, list_updates, prune_finished, retry_exhausted, show_update
from ..store.schema import LATEST
from ..store.sqlite import SqliteUpdateStore
from .args import MAX_ID
from .database import is_conninfo, left, open_current, open_postgres, read_only, require_current


def when(seconds: float | None) -> str:
    """A moment as UTC ``YYYY-MM-DD HH:MM:SSZ``, or ``-``."""
    return "-" if seconds is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(seconds))


def _last_line(text: str | None, width: int = 120) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1][:width] if lines else ""


def _tables(args: argparse.Namespace) -> Tables:
    return Tables(args.table if is_conninfo(args.db) else None)


@contextmanager
def _store(args: argparse.Namespace, timeout: float | None = None) -> Iterator[Any]:
    """The current fence file's store, or the PostgreSQL store on ``--table`` (never created); closed after. With
    ``timeout``, opening and every read end within it, else :class:`StoreUnavailable`."""
    deadline = time.monotonic() + (5.0 if timeout is None else timeout)
    opened: Any
    if is_conninfo(args.db):
        opened = open_postgres(args.db, args.table, pool_size=1 if timeout is None else 2, timeout=left(deadline))
    else:
        opened = open_current(args.db, left(deadline))
    with opened as store, nullcontext() if timeout is None else store.bounded(left(deadline)):
        yield store


def _door(generation: dict[str, Any]) -> str:
    return "webhook" if generation.get("door") == "webhook" else "poller"


def _health(generation: dict[str, Any] | None, progress_age: float | None, max_age: float | None) -> list[str]:
    """Why the door in use is unhealthy under ``--max-progress-age`` (empty: healthy, or no check asked)."""
    if max_age is None:
        return []
    if not generation:
        return ["no poller or webhook has ever run on this file"]
    number = generation["generation"]
    door = _door(generation)
    if generation.get("ended_at") is not None:
        return [f"{door} generation {number} stopped: {generation.get('end_reason')}"]
    if progress_age is None:
        return [f"{door} generation {number} has made no progress yet"]
    if progress_age > max_age:
        what = "a delivery or a webhook check" if door == "webhook" else "progress"
        return [f"{door} generation {number} last made {what} {progress_age:.0f} s ago (limit {max_age:g} s)"]
    return []


def cmd_status(args: argparse.Namespace) -> int:
    """Counts by state, cursor, door generation and progress; 1 when unhealthy or unread within ``--timeout``."""
    with _store(args, args.timeout) as store:  # not read in time: StoreUnavailable, exit 1 (main)
        stats = store.stats()
    generation = stats.get("generation") or {}
    progress = generation.get("progress_at")
    progress_age = None if progress is None else max(0.0, time.time() - progress)
    stopped = generation.get("ended_at") is not None
    unhealthy = _health(generation, progress_age, args.max_progress_age)
    stats.update(progress_age=progress_age, poller="none" if not generation else "stopped" if stopped else "running",
                 door=generation.get("door", "poll") if generation else None, healthy=not unhealthy,
                 unhealthy=unhealthy)
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 1 if unhealthy else 0
    age = stats["oldest_open_age"]
    print(f"cursor               {stats['cursor']}")
    print(f"pending / claimed    {stats['pending']} / {stats['claimed']}")
    print(f"settled / skipped    {stats['settled']} / {stats['skipped']}")
    print(f"exhausted (unacked)  {stats['exhausted']}  (acknowledged: {stats['acknowledged']})")
    print(f"oldest open update   {'-' if age is None else f'{age:.1f} s'}")
    if generation:
        state = f"stopped ({generation['end_reason']})" if stopped else "running"
        since = "never" if progress_age is None else f"{progress_age:.1f} s ago"
        print(f"{_door(generation) + ' generation':<20} {generation['generation']} (pid {generation['pid']}, "
              f"{state}), last progress {since}")
    else:
        print("poller generation    none yet")
    leader = stats.get("leader")
    if leader:
        live = "holding the lock" if leader.get("live") else "lock not held: nobody polls now"
        print(f"poll leader          pid {leader['pid']} on {leader['host']}, epoch {leader['epoch']} ({live})")
    if stats.get("backend") == "postgres":
        print(f"store                PostgreSQL, table {args.table} (its DDL: telegram-fence schema "
              f"--postgres {args.table})")
    else:
        print(f"schema version       {stats['schema_version']}")
    for problem in unhealthy:
        print(f"UNHEALTHY: {problem}")
    return 1 if unhealthy else 0


def _parse_identity(text: str) -> Identity:
    parts = text.split("/")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2]:
        raise FenceError(f"{text!r} is not an exhaustion identity; use UPDATE_ID/ATTEMPT/CLAIM_ID as listed")
    if int(parts[0]) > MAX_ID or int(parts[1]) > MAX_ID:
        raise FenceError(f"{text!r} is not an exhaustion identity: its numbers must be at most {MAX_ID}")
    return Identity(int(parts[0]), int(parts[1]), parts[2])


def cmd_exhaustions(args: argparse.Namespace) -> int:
    """List the unacknowledged exhaustions, or acknowledge those ``--ack`` names (1 when one was not there)."""
    identities = [_parse_identity(text) for text in args.ack or ()]  # all checked before anything is opened
    with _store(args, args.timeout) as store:
        if args.ack:
            missing = []
            for identity in identities:
                if store.acknowledge_exhaustion(identity):
                    print(f"acknowledged exhaustion {identity} (prunable now)")
                else:
                    missing.append(str(identity))
            for text in missing:
                print(f"telegram-fence: no unacknowledged exhaustion {text}", file=sys.stderr)
            return 1 if missing else 0
        after = None
        rows = []
        while page := store.due_exhaustions(after=after, limit=100):
            rows.extend(page)
            after = page[-1].identity
    if args.json:
        print(json.dumps([
            {"identity": str(e.identity), "update_id": e.identity.update_id, "attempt": e.identity.attempt,
             "claim_id": e.identity.claim_id, "chat_id": e.chat_id, "error": e.error, "exhausted_at": e.exhausted_at,
             "update": e.update}
            for e in rows
        ], indent=2))
        return 0
    for e in rows:
        print(f"{e.identity}  chat {e.chat_id}  {when(e.exhausted_at)}  {_last_line(e.error, 200)}")
    print(f"{len(rows)} unacknowledged exhaustion(s)")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    """The file's schema version: 0 current, 1 older (migrate it), 2 newer or not a fence database; with
    ``--postgres TABLE`` the PostgreSQL DDL for that table."""
    if args.postgres is not None:
        from ..store.postgres import schema_sql

        print(schema_sql(args.postgres), end="")
        return 0
    if args.db is None:
        raise FenceError("pass the database file, or --postgres TABLE to print the PostgreSQL schema")
    found = require_current(args.db, older=True)  # a newer one is refused: exit 2
    print(f"{found.path}: schema version {found.version} (this telegram_fence writes version {LATEST})")
    if found.version < LATEST:
        print(f"older: run `telegram-fence migrate {found.path}` (or start the bot with this version)",
              file=sys.stderr)
        return 1
    return 0


def cmd_updates(args: argparse.Namespace) -> int:
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
              f"changed {when(row['changed_at'])}  {_last_line(row['error'], 80)}")
    print(f"{len(rows)} update(s) shown (newest first, at most {args.limit})")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
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
        state += f", lease until {when(item['lease_until'])}" + (" (lapsed)" if item["lease_lapsed"] else "")
    if item.get("due_at"):
        state += f", due {when(item['due_at'])}"
    print(f"update       {item['update_id']}")
    print(f"chat         {'-' if item['chat_id'] is None else item['chat_id']}")
    print(f"state        {state}")
    print(f"attempts     {item['attempts']}" + (f" (claim {item['claim_id']})" if item["claim_id"] else ""))
    print(f"recorded     {when(item['recorded_at'])}")
    print(f"changed      {when(item['changed_at'])}")
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
    with _store(args) as store:
        counts = prune_finished(store, store.clock() - args.older_than, tables=_tables(args))
    if args.json:
        print(json.dumps(counts, sort_keys=True))
    else:
        print(f"deleted {counts['updates']} settled/skipped update(s) and {counts['captures']} delivered "
              f"capture(s) older than {args.older_than:g} s")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    found = require_current(args.db, older=True)
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
