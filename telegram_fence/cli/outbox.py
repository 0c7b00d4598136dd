"""``telegram-fence outbox DB``: the capture outbox of a bot's database, and re-queueing its failures.

The listing reads the file read-only within ``--timeout``; ``--requeue-failed`` is a short write transaction.
Exit status: 0 done; 1 some keys given to ``--requeue-failed`` were not failed captures, or the file stayed locked
(nothing shown or changed); 2 the path is not a current telegram_fence database or cannot be opened."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from ..delivery.outbox.queries import STATES, failed_captures, outbox_stats, requeue_failed, requeue_named
from ..errors import FenceError, StoreUnavailable
from .args import non_negative_int
from .database import add_timeout, is_conninfo, open_current, read_only, require_current, unread_line

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``outbox`` subcommand on ``subparsers``; return its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "outbox", help="show the capture outbox (counts by state, oldest pending age); re-queue failed captures",
        description="Show how many captures are pending, delivering, delivered and failed in DB, and how long the "
        "oldest undelivered one has waited. --requeue-failed puts failed captures back to pending; a running bot "
        "delivers them within its recheck interval.")
    parser.add_argument("db", metavar="DB", help="the bot's SQLite database file")
    parser.add_argument("--requeue-failed", nargs="*", metavar="KEY", default=None,
                        help="re-queue failed captures: all of them, or only the KEYs given")
    parser.add_argument("--failed", type=non_negative_int, default=10, metavar="N",
                        help="list up to N failed captures (default 10; 0: none)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_timeout(parser, postgres=False)
    parser.set_defaults(func=run)
    return parser


class _ReadOnlyFile:
    """A read-only connection as the outbox queries' store: ``write()`` yields it, so a listing takes no write lock."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @contextmanager
    def write(self, *, durable: bool = False) -> Iterator[Any]:
        yield self._conn

    @property
    def clock(self) -> Callable[[], float]:
        return time.time


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Carry out ``telegram-fence outbox``; return the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    status = 0
    requeued = None
    try:
        if args.requeue_failed is None:  # a listing only: read-only, within --timeout
            if is_conninfo(args.db):
                require_current(args.db)  # refuses a connection string: this command takes a SQLite file
            with read_only(args.db, "fence_updates", args.timeout) as conn:
                view = _ReadOnlyFile(conn)
                stats = outbox_stats(view)
                failed = failed_captures(view, args.failed) if args.failed else []
        else:
            with open_current(args.db) as store:
                status, requeued = _requeue(store, args.requeue_failed, err)
                stats = outbox_stats(store)
                failed = failed_captures(store, args.failed) if args.failed else []
    except StoreUnavailable as exc:  # locked past --timeout, or (a write) past the busy timeout: nothing done
        shown = exc if args.requeue_failed is not None else unread_line(exc, args.timeout, "so nothing is shown")
        print(f"telegram-fence outbox: {shown}", file=err)
        return 1
    except FenceError as exc:
        print(f"telegram-fence outbox: {exc}", file=err)
        return 2
    if args.json:
        print(json.dumps({**stats, "requeued": requeued, "failed_captures": failed}, sort_keys=True), file=out)
        return status
    if requeued is not None:
        asked = "" if not args.requeue_failed else f" of {len(set(args.requeue_failed))} named"
        print(f"re-queued {requeued}{asked} failed capture(s)", file=out)
    print(f"outbox of {args.db}", file=out)
    for state in STATES:
        print(f"  {state:<11} {stats[state]:>8}", file=out)
    age = stats["oldest_pending_age"]
    print(f"  oldest pending age: {'none' if age is None else f'{age:.1f} s'}", file=out)
    if failed:
        print("failed captures (oldest first):", file=out)
        for row in failed:
            shown = row["last_error"] or ""
            print(f"  {row['key']}  attempts={row['attempts']}  status={row['last_status']}  {shown}", file=out)
    return status


def _requeue(store: Any, keys: list[str], err: TextIO) -> tuple[int, int]:
    """Re-queue the failed captures ``keys`` (all when empty); ``(exit status, how many)``, naming the others."""
    if not keys:
        return 0, requeue_failed(store)
    done = requeue_named(store, keys)
    for key in sorted(set(keys) - done):
        print(f"telegram-fence: capture {key}: not re-queued: it is not a failed capture", file=err)
    return (1 if set(keys) - done else 0), len(done)
