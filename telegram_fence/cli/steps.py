"""``telegram-fence steps DB``: the durable steps a fenced bot's handlers recorded, read-only, from a SQLite file or a
PostgreSQL database.

Exit status: 0 shown; 2 the database is not a current telegram_fence database (nothing is created or changed
then), cannot be opened, or has no steps table. May import the steps' rows, ``errors`` and the command line's
database checks and listing (layer 4).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import FenceError
from ..steps.core import StepRow, list_steps
from .args import update_id
from .bound import add_timeout, is_lock_error
from .database import read_only, shown_conninfo
from .listing import print_rows

__all__ = ["add_parser", "run"]

#: Rows shown at most (the oldest update first); steps are pruned with their updates, so they stay few.
_LIMIT = 100_000
#: Characters of a recorded result shown on a text line (``--json`` prints it whole).
_SHOWN = 60


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``steps`` subcommand on an ``argparse`` subparsers object and return its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "steps", help="the durable steps the bot's handlers recorded: done, failed, uncertain (read-only)",
        description="List the durable steps of a fenced bot in DB (a SQLite file, or a PostgreSQL connection "
        "string with --table), by update and step name. Writes nothing.",
    )
    parser.add_argument("db", metavar="DB", help="the bot's SQLite file, or a PostgreSQL connection string")
    parser.add_argument("--update", type=update_id, default=None, metavar="ID", help="only the steps of this update")
    parser.add_argument("--uncertain", action="store_true",
                        help="only steps whose outcome is unknown (uncertain, or an intent left by a process "
                        "that died while the step ran, or running now)")
    parser.add_argument("--table", default="fence_updates", help="the inbox table (PostgreSQL only)")
    add_timeout(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON array of objects instead of text")
    parser.set_defaults(func=run)
    return parser


def _read(db: str, table: str, update: int | None, uncertain: bool, timeout: float) -> list[StepRow]:
    with read_only(db, table, timeout) as conn:
        try:
            return list(list_steps(conn, update_id=update, uncertain=uncertain, limit=_LIMIT))
        except FenceError:
            raise
        except Exception as exc:  # a store from before durable steps
            if is_lock_error(exc):
                raise  # read_only says in one line that the store did not answer in time
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise FenceError(f"{shown_conninfo(db)}: the durable steps cannot be read ({type(exc).__name__}: "
                             f"{first}); start the bot with this telegram_fence once to create their table") from None


def _line(row: StepRow, now: float) -> str:
    age = max(0.0, now - row.changed_at)
    result = "-" if row.result is None else row.result
    if len(result) > _SHOWN:
        result = result[: _SHOWN - 1] + "…"
    return (f"{row.update_id:>12}  {row.name:<24} {row.state:<9}  attempt {row.attempt}  runs {row.runs}  "
            f"{age:.0f} s ago  {result}")


def run(args: argparse.Namespace) -> int:
    """List the recorded steps; ``--json`` prints them as a JSON array. See the module docstring."""
    rows = _read(args.db, args.table, args.update, args.uncertain, args.timeout)
    return print_rows(rows, _line, as_json=args.json,
                      nothing="no durable steps" + (" with an unknown outcome" if args.uncertain else ""))
