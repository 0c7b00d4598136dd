"""``telegram-fence`` / ``python -m telegram_fence``: the demo and operations on a fence's database.

Subcommands: ``demo``, ``status DB``, ``states DB``, ``calls DB``, ``steps DB``, ``exhaustions DB``, ``schema DB``,
``updates DB``, ``show DB ID``, ``retry DB ID``, ``prune DB``, ``migrate DB``, ``broadcast …``, ``outbox DB``,
``webhook info|delete``.
For ``status``, ``exhaustions``, ``calls``, ``steps`` and ``states``, ``DB`` may also be a PostgreSQL connection string
(``postgresql://…`` or ``host=… dbname=…``) with ``--table`` naming the inbox table (a server or database that
cannot be reached is one line at once, see :func:`~telegram_fence.cli.database.open_postgres`);
``schema --postgres TABLE`` prints the PostgreSQL DDL.
Every subcommand exits 0 on success, 1 when what it checks is unhealthy (or part of what it was asked could
not be done: a write that found the file locked by another connection past the busy timeout included), 2 on bad
input (one line on stderr). A database command never creates or changes a file that is
not a current telegram_fence database (see :mod:`telegram_fence.cli.database`). Output cut short by a closed pipe
(``| head``) ends the command quietly with status 141, as a process killed by SIGPIPE would.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import apsw

from .._version import __version__
from ..errors import FenceError, StoreUnavailable
from . import broadcast, calls, outbox, states, steps, updates, webhook
from .args import MAX_ID, Parser, non_negative_int, positive_float, positive_int
from .bound import READ_TIMEOUT, Budget, add_timeout, unread_line
from .database import is_conninfo, open_current, open_postgres

__all__ = ["main"]


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away
#: ``status --timeout`` (and the other read commands') by default
STATUS_TIMEOUT = READ_TIMEOUT


def _is_conninfo(db: str) -> bool:
    """Whether ``db`` names a PostgreSQL server rather than a SQLite file."""
    return is_conninfo(db)


@contextmanager
def _opened(db: str, table: str, budget: Budget) -> Iterator[Any]:
    """The store a read command works on: the PostgreSQL ``table`` for a connection string (never created,
    connected to within ``budget``), else the SQLite file after :func:`~telegram_fence.cli.database.open_current`
    checked it (waiting for a lock at most what is left of ``budget``). Within the block the store's reads answer
    by the end of ``budget`` (``store.bounded``), else raise :class:`StoreUnavailable`. Closed after."""
    if not _is_conninfo(db):
        with open_current(db, budget.left()) as store, store.bounded(budget.left()):
            yield store
        return
    with open_postgres(db, table, pool_size=2, timeout=budget.left()) as store, store.bounded(budget.left()):
        yield store


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    argv = ["--updates", str(args.updates), "--kills", str(args.kills)]
    if args.seed is not None:
        argv += ["--seed", str(args.seed)]
    if args.api_url is not None:
        argv += ["--api-url", args.api_url, "--db", args.db]
    return demo_main(argv)


def _door(generation: dict[str, Any]) -> str:
    """``"webhook"`` or ``"poller"``: which door the generation belongs to (its progress: deliveries and checks
    of the webhook, or getUpdates answers)."""
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


def _cmd_status(args: argparse.Namespace) -> int:
    try:
        with _opened(args.db, args.table, Budget(args.timeout)) as store:  # every read answers by --timeout
            stats = store.stats()
    except StoreUnavailable as exc:
        print(f"telegram-fence: {unread_line(exc, args.timeout, 'so its health is unknown')}", file=sys.stderr)
        return 1
    now = time.time()
    generation = stats.get("generation") or {}
    progress = generation.get("progress_at")
    progress_age = None if progress is None else max(0.0, now - progress)
    stats["progress_age"] = progress_age
    if not generation:
        stats["poller"] = "none"
    elif generation.get("ended_at") is not None:
        stats["poller"] = "stopped"
    else:
        stats["poller"] = "running"
    stats["door"] = generation.get("door", "poll") if generation else None
    unhealthy = _health(generation, progress_age, args.max_progress_age)
    stats["healthy"] = not unhealthy
    stats["unhealthy"] = unhealthy
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
            state = f"stopped ({generation['end_reason']})" if generation.get("ended_at") is not None else "running"
            since = "never" if progress_age is None else f"{progress_age:.1f} s ago"
            label = f"{_door(generation)} generation".ljust(20)
            print(f"{label} {generation['generation']} (pid {generation['pid']}, {state}), "
                  f"last progress {since}")
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


def _parse_identity(text: str) -> Any:
    from ..store import Identity

    parts = text.split("/")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2]:
        raise FenceError(f"{text!r} is not an exhaustion identity; use UPDATE_ID/ATTEMPT/CLAIM_ID as listed")
    if int(parts[0]) > MAX_ID or int(parts[1]) > MAX_ID:
        raise FenceError(f"{text!r} is not an exhaustion identity: its numbers must be at most {MAX_ID}")
    return Identity(int(parts[0]), int(parts[1]), parts[2])


def _cmd_exhaustions(args: argparse.Namespace) -> int:
    identities = [_parse_identity(text) for text in args.ack or ()]  # all checked before anything is opened
    with _opened(args.db, args.table, Budget(args.timeout)) as store:
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
        while True:
            page = store.due_exhaustions(after=after, limit=100)
            if not page:
                break
            rows.extend(page)
            after = page[-1].identity
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
    """The file's schema version: 0 current, 1 older (migrate it), 2 newer or not a fence database;
    with ``--postgres TABLE`` the PostgreSQL DDL for that table."""
    if args.postgres is not None:
        from ..store.postgres import schema_sql

        print(schema_sql(args.postgres), end="")
        return 0
    if args.db is None:
        raise FenceError("pass the database file, or --postgres TABLE to print the PostgreSQL schema")
    from ..store.schema import LATEST
    from .database import DatabaseRefused, inspect

    found = inspect(args.db)
    print(f"{found.path}: schema version {found.version} (this telegram_fence writes version {LATEST})")
    if found.version > LATEST:
        raise DatabaseRefused(f"{found.path}: schema version {found.version} is newer than this telegram_fence "
                              f"({LATEST}); use the telegram_fence that wrote it")
    if found.version < LATEST:
        print(f"older: run `telegram-fence migrate {found.path}` (or start the bot with this version)",
              file=sys.stderr)
        return 1
    return 0


_DB_OR_DSN = ("the bot's SQLite file, or a PostgreSQL connection string (postgresql://... or 'host=... dbname=...'; "
              "with --table)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="telegram-fence", description="Durable pyTelegramBotAPI bots: operations.")
    parser.add_argument("--version", action="version", version=f"telegram_fence {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo", help="run a fenced bot against the built-in fake Bot API server and crash it",
        description="Without --api-url: the crash drill against the built-in fake Bot API server. With --api-url: "
        "the demo bot alone against that server (token from $TELEGRAM_BOT_TOKEN) until Ctrl-C.",
    )
    demo.add_argument("--updates", type=positive_int, default=300, metavar="N", help="messages to push (default 300)")
    demo.add_argument("--kills", type=non_negative_int, default=3, metavar="K", help="SIGKILLs (default 3)")
    demo.add_argument("--seed", type=int, default=None,
                      help="the random moments of the kills (default: new ones each run)")
    demo.add_argument("--api-url", default=None, metavar="URL",
                      help="run the demo bot against this Bot API server instead (http://host:port)")
    demo.add_argument("--db", default="demo.db", help="the demo bot's database with --api-url (default demo.db)")
    demo.set_defaults(func=_cmd_demo)

    status = sub.add_parser("status", help="counts by state, cursor, poller generation and progress (read-only)")
    status.add_argument("db", metavar="DB", help=_DB_OR_DSN)
    status.add_argument("--table", default="fence_updates", help="the inbox table (PostgreSQL only)")
    status.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    status.add_argument("--max-progress-age", type=positive_float, default=None, metavar="SECONDS",
                        help="exit 1 unless the running poller or webhook made progress this recently (a poll "
                        "answered; for a webhook a delivery committed or a check of the webhook; use more than "
                        "the long-poll timeout and the webhook check interval, e.g. 90)")
    add_timeout(status)
    status.set_defaults(func=_cmd_status)

    exhaustions = sub.add_parser("exhaustions", help="list (or acknowledge) terminal failures")
    exhaustions.add_argument("db", metavar="DB", help=_DB_OR_DSN)
    exhaustions.add_argument("--table", default="fence_updates", help="the inbox table (PostgreSQL only)")
    exhaustions.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    exhaustions.add_argument("--ack", nargs="+", metavar="UPDATE_ID/ATTEMPT/CLAIM_ID",
                             help="acknowledge these exhaustions (makes them prunable)")
    add_timeout(exhaustions)
    exhaustions.set_defaults(func=_cmd_exhaustions)

    schema = sub.add_parser("schema", help="show the database's schema version (read-only), "
                                           "or print the PostgreSQL DDL with --postgres TABLE")
    schema.add_argument("db", nargs="?", metavar="DB", help="the bot's SQLite file (a SQLite file only)")
    schema.add_argument("--postgres", metavar="TABLE", default=None,
                        help="print the PostgreSQL schema (tables, indexes, migration) for TABLE and exit")
    schema.set_defaults(func=_cmd_schema)

    updates.add_parsers(sub)
    for module in (broadcast, calls, outbox, states, steps, webhook):
        module.add_parser(sub)
    return parser


def _quiet_broken_pipe() -> int:
    """The reader of stdout went away: point stdout at /dev/null so the exit flush cannot fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (e.g. captured in a test)
        pass
    return EXIT_BROKEN_PIPE


@contextmanager
def _escaping_output() -> Iterator[None]:
    """Within the block, stdout and stderr write what UTF-8 cannot encode (a lone surrogate a user sent, half an
    emoji) as its escape, ``\\ud83d``, instead of failing: text stays readable and ``--json`` stays valid JSON
    that decodes back to what was stored. Each stream's own setting comes back after."""
    streams = [(stream, stream.errors) for stream in (sys.stdout, sys.stderr)
               if isinstance(stream, io.TextIOWrapper) and stream.errors != "backslashreplace"]
    for stream, _errors in streams:
        stream.reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        for stream, errors in streams:
            if not stream.closed:
                stream.reconfigure(errors=errors)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (parse errors exit 2 through ``SystemExit``). What a user sent
    is printed escaped where UTF-8 cannot carry it (see :func:`_escaping_output`)."""
    with _escaping_output():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args: argparse.Namespace | None = None
    try:
        args = parser.parse_args(argv)
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except StoreUnavailable as exc:
        timeout = getattr(args, "timeout", None)
        if timeout is None or getattr(args, "ack", None):  # a write (retry, prune, --ack, ...) found the file locked
            print(f"telegram-fence: {exc}", file=sys.stderr)  # (past its busy timeout): not done, try again later
            return 1
        print(f"telegram-fence: {unread_line(exc, timeout, 'so nothing is shown')}", file=sys.stderr)
        return 1
    except FenceError as exc:
        print(f"telegram-fence: {exc}", file=sys.stderr)
        return 2
    except (apsw.Error, OSError) as exc:  # the file or the disk, not the input: still one line, named
        print(f"telegram-fence: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except OverflowError as exc:  # a number the parsers let through that SQLite cannot bind: bad input
        print(f"telegram-fence: a number is too large for the database (at most {MAX_ID}): {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
