"""``telegram-fence outbox DB``: the capture outbox of a bot's database, and re-queueing its failures.

Wiring (in ``telegram_fence/cli/main.py``)::

    from telegram_fence.cli import outbox as cli_outbox
    cli_outbox.add_parser(subparsers)      # registers "outbox"; sets args.func = cli_outbox.run
    ...
    return args.func(args)                 # -> exit status

The listing reads the file read-only (nothing created or changed, no write lock taken) and answers within
``--timeout`` as the other read commands do; ``--requeue-failed`` is a short write transaction.

Exit status: 0 done; 1 some keys given to ``--requeue-failed`` were not failed captures, or the file stayed locked
past ``--timeout`` (nothing shown) or, for ``--requeue-failed``, past the 5 s busy timeout; 2 the path is not a
current telegram_fence database (nothing is created or changed then) or cannot be opened.
"""

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
from .bound import add_timeout, unread_line
from .database import is_conninfo, open_current, read_only, require_current

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``outbox`` subcommand on an ``argparse`` subparsers object and return its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "outbox",
        help="show the capture outbox (counts by state, oldest pending age); re-queue failed captures",
        description=(
            "Show how many captures are pending, delivering, delivered and failed in DB, and how long "
            "the oldest undelivered one has waited. --requeue-failed puts failed captures back to pending; "
            "a running bot delivers them within its recheck interval."
        ),
    )
    parser.add_argument("db", metavar="DB", help="the bot's SQLite database file")
    parser.add_argument(
        "--requeue-failed",
        nargs="*",
        metavar="KEY",
        default=None,
        help="re-queue failed captures: all of them, or only the KEYs given",
    )
    parser.add_argument(
        "--failed", type=non_negative_int, default=10, metavar="N",
        help="list up to N failed captures (default 10; 0: none)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_timeout(parser, postgres=False)
    parser.set_defaults(func=run)
    return parser


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "none"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class _ReadOnlyFile:
    """The outbox queries' view of a read-only connection (:func:`~telegram_fence.cli.database.read_only`): its
    ``write()`` yields that connection, so a listing takes no write lock (and a write through it would fail)."""

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
    if args.failed < 0:
        print("telegram-fence outbox: --failed takes a number >= 0", file=err)
        return 2
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
    except StoreUnavailable as exc:
        if args.requeue_failed is not None:  # the write found the file locked past the busy timeout: not done
            print(f"telegram-fence outbox: {exc}", file=err)
            return 1
        print(f"telegram-fence outbox: {unread_line(exc, args.timeout, 'so nothing is shown')}", file=err)
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
    print(f"  oldest pending age: {_age(stats['oldest_pending_age'])}", file=out)
    if failed:
        print("failed captures (oldest first):", file=out)
        for row in failed:
            shown = row["last_error"] or ""
            print(f"  {row['key']}  attempts={row['attempts']}  status={row['last_status']}  {shown}", file=out)
    return status


def _requeue(store: Any, keys: list[str], err: TextIO) -> tuple[int, int]:
    """Re-queue the failed captures named by ``keys`` (all of them when empty); ``(exit status, how many)``, each
    key that is not a failed capture named on ``err``."""
    if not keys:
        return 0, requeue_failed(store)
    done = requeue_named(store, keys)
    for key in sorted(set(keys) - done):
        print(f"telegram-fence: capture {key}: not re-queued: it is not a failed capture", file=err)
    return (1 if set(keys) - done else 0), len(done)
