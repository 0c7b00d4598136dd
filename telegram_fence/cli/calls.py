"""``telegram-fence calls DB``: the Bot API calls a fenced bot's handlers made (the call journal), read-only,
from a SQLite file or a PostgreSQL database.

Exit status: 0 shown; 2 the database is not a current telegram_fence database (nothing is created or changed
then), cannot be opened, or has no call journal. May import the journal's listing, ``errors``, the store and
the command line's database checks and listing (layer 4).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..calls.journal import CallRow, list_calls
from ..errors import FenceError
from .args import update_id
from .bound import add_timeout, is_lock_error
from .database import read_only, shown_conninfo
from .listing import print_rows

__all__ = ["add_parser", "run"]

#: Rows shown at most (the oldest first); a journal is pruned with its updates, so it stays small.
_LIMIT = 100_000


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``calls`` subcommand on an ``argparse`` subparsers object and return its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "calls", help="the Bot API calls the bot's handlers made: sent, refused, uncertain (read-only)",
        description="List the journaled Bot API calls of a fenced bot in DB (a SQLite file, or a PostgreSQL "
        "connection string with --table), by update and position in the handler. Writes nothing.",
    )
    parser.add_argument("db", metavar="DB", help="the bot's SQLite file, or a PostgreSQL connection string")
    parser.add_argument("--update", type=update_id, default=None, metavar="ID", help="only the calls of this update")
    parser.add_argument("--uncertain", action="store_true",
                        help="only calls whose outcome is unknown (uncertain, or left in flight)")
    parser.add_argument("--table", default="fence_updates", help="the inbox table (PostgreSQL only)")
    add_timeout(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON array of objects instead of text")
    parser.set_defaults(func=run)
    return parser


def _read(db: str, table: str, update_id: int | None, uncertain: bool, timeout: float) -> list[CallRow]:
    with read_only(db, table, timeout) as conn:
        try:
            return list(list_calls(conn, update_id=update_id, uncertain=uncertain, limit=_LIMIT))
        except FenceError:
            raise
        except Exception as exc:  # a PostgreSQL table from before the call journal
            if is_lock_error(exc):
                raise  # read_only says in one line that the store did not answer in time
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise FenceError(f"{shown_conninfo(db)}: the call journal cannot be read ({type(exc).__name__}: "
                             f"{first}); start the bot with this telegram_fence once to create it") from None


def _line(row: CallRow, now: float) -> str:
    chat = "-" if row.chat_id is None else str(row.chat_id)
    status = "-" if row.status is None else str(row.status)
    age = max(0.0, now - row.changed_at)
    return (f"{row.update_id:>12}  {row.seq:>3}  {row.method:<24} {row.state:<9}  chat {chat:<14} "
            f"HTTP {status:<4} attempt {row.attempt}  {age:.0f} s ago")


def run(args: argparse.Namespace) -> int:
    """List the journaled calls; ``--json`` prints them as a JSON array. See the module docstring."""
    rows = _read(args.db, args.table, args.update, args.uncertain, args.timeout)
    return print_rows(rows, _line, as_json=args.json,
                      nothing="no journaled calls" + (" with an unknown outcome" if args.uncertain else ""))
