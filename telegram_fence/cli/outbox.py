"""``telegram-fence outbox DB``: the capture outbox of a bot's database, and re-queueing its failures.

Wiring (in ``telegram_fence/cli/main.py``)::

    from telegram_fence.cli import outbox as cli_outbox
    cli_outbox.add_parser(subparsers)      # registers "outbox"; sets args.func = cli_outbox.run
    ...
    return args.func(args)                 # -> exit status

Exit status: 0 done; 1 some keys given to ``--requeue-failed`` were not failed captures;
2 the path is not a current telegram_fence database (nothing is created or changed then) or cannot be opened.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from ..delivery.outbox.queries import STATES, failed_captures, outbox_stats, requeue_failed, requeue_named
from ..errors import FenceError
from .args import non_negative_int
from .database import open_current

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


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Carry out ``telegram-fence outbox``; return the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    if args.failed < 0:
        print("telegram-fence outbox: --failed takes a number >= 0", file=err)
        return 2
    status = 0
    try:
        with open_current(args.db) as store:
            requeued = None
            if args.requeue_failed:
                done = requeue_named(store, args.requeue_failed)
                requeued = len(done)
                for key in sorted(set(args.requeue_failed) - done):
                    print(f"telegram-fence: capture {key}: not re-queued: it is not a failed capture", file=err)
                    status = 1
            elif args.requeue_failed is not None:
                requeued = requeue_failed(store)
            stats = outbox_stats(store)
            failed = failed_captures(store, args.failed) if args.failed else []
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
