"""``telegram-fence states DB``: the conversations a bot keeps (telebot states and their data, next-step and reply
handlers), read-only, from a SQLite file or a PostgreSQL database.

Exit status: 0 shown; 2 the database is not a current telegram_fence database (nothing is created or changed
then), cannot be opened, or has no conversation tables. May import the conversation's listings, ``errors``, the
store and the command line's database checks (layer 4).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from ..conversation.sql import list_states, list_steps
from ..errors import FenceError
from .args import chat_id
from .bound import add_timeout, is_lock_error
from .database import read_only, shown_conninfo

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``states`` subcommand on an ``argparse`` subparsers object and return its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "states", help="the conversations the bot keeps: states, their data, next-step handlers (read-only)",
        description="List the telebot states (with their data) and the next-step and reply handlers a fenced bot "
        "keeps in DB (a SQLite file, or a PostgreSQL connection string with --table). Writes nothing.",
    )
    parser.add_argument("db", metavar="DB", help="the bot's SQLite file, or a PostgreSQL connection string")
    parser.add_argument("--chat", type=chat_id, default=None, metavar="ID", help="only this chat")
    parser.add_argument("--table", default="fence_updates", help="the inbox table (PostgreSQL only)")
    add_timeout(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(func=run)
    return parser


def _read(db: str, table: str, chat: int | None, timeout: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with read_only(db, table, timeout) as conn:
        try:
            return list_states(conn, chat), list_steps(conn, chat)
        except FenceError:
            raise
        except Exception as exc:  # a PostgreSQL table from before conversations: no tables to read
            if is_lock_error(exc):
                raise  # read_only says in one line that the store did not answer in time
            raise FenceError(f"{shown_conninfo(db)}: the conversation tables cannot be read ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}); start the bot with this "
                             "telegram_fence once to create them") from None


def _age(at: float, now: float) -> str:
    seconds = max(0.0, now - at)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Carry out ``telegram-fence states``; return the exit status (errors are raised as :class:`FenceError`)."""
    out = out or sys.stdout
    states, steps = _read(args.db, args.table, args.chat, args.timeout)
    if args.json:
        print(json.dumps({"states": states, "handlers": steps}, sort_keys=True, ensure_ascii=False), file=out)
        return 0
    now = time.time()
    where = f" of chat {args.chat}" if args.chat is not None else ""
    print(f"states{where}: {len(states)}", file=out)
    for row in states:
        extra = "".join(f" {name}={row[name]}" for name in ("bot_id", "business_connection_id", "message_thread_id")
                        if row[name] is not None)
        data = json.dumps(row["data"], ensure_ascii=False, sort_keys=True)
        print(f"  chat {row['chat_id']} user {row['user_id']}{extra}: {row['state']!r} {data} "
              f"(update {row['update_id']}, {_age(row['changed_at'], now)})", file=out)
    print(f"handlers{where}: {len(steps)}", file=out)
    for row in steps:
        group = "chat" if row["kind"] == "next_step" else "reply to message"
        print(f"  {row['kind']} {group} {row['group']} #{row['seq']}: {row['callback']} "
              f"(update {row['update_id']}, {_age(row['registered_at'], now)})", file=out)
    return 0
