"""``telegram-fence webhook info|delete``: see who holds the bot's webhook; switch back to polling.

``add_parser(subparsers)`` registers the command on the main parser. The bot token is read from the
environment variable named by ``--token-env`` (default ``TELEGRAM_BOT_TOKEN``) and never printed;
the webhook's URL is never printed either (it may carry a path secret): only its host.

Exit status: 0 done, 2 bad input (missing token, missing database) or a Bot API failure.

Imports: the standard library, ``errors``, ``store.sqlite`` and ``ingress.webhook_guard``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from ..errors import FenceError
from ..ingress import webhook_guard

__all__ = ["add_parser", "cmd_delete", "cmd_info"]

TOKEN_ENV = "TELEGRAM_BOT_TOKEN"


def _token(args: argparse.Namespace) -> str:
    token = os.environ.get(args.token_env, "")
    if not token:
        raise FenceError(f"environment variable {args.token_env} is empty or unset; put the bot token there")
    return token


def _when(stamp: int | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(stamp))


def cmd_info(args: argparse.Namespace) -> int:
    """Print the webhook's host, Telegram's pending count and its last delivery error."""
    info = webhook_guard.read_info(_token(args))
    data: dict[str, Any] = info.public()
    data["set"] = bool(info.url)
    data["tagged"] = bool(info.url) and webhook_guard.split_tag(info.url)[1] is not None
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    if not info.url:
        print("webhook              none (the bot can poll with getUpdates)")
    else:
        origin = "telegram_fence (tagged)" if data["tagged"] else "not set by telegram_fence"
        print(f"webhook host         {info.host}  [{origin}]")
    print(f"pending updates      {info.pending_update_count}")
    print(f"last delivery error  {info.last_error_message or '-'}  ({_when(info.last_error_date)})")
    if info.max_connections is not None:
        print(f"max connections      {info.max_connections}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete the webhook keeping Telegram's pending updates; print where a poller on DB resumes."""
    from ..store.sqlite import SqliteUpdateStore

    if not os.path.exists(args.db):
        raise FenceError(f"{args.db} does not exist; pass the database file the bot runs with")
    token = _token(args)
    store = SqliteUpdateStore(args.db)
    try:
        cursor = store.next_offset()
    finally:
        store.close()
    info = webhook_guard.read_info(token)
    if not info.url:
        print("no webhook is set; the bot can poll with getUpdates")
        return 0
    webhook_guard.delete(token)
    print(f"deleted the webhook to {info.host}; {info.pending_update_count} update(s) wait at Telegram "
          f"(kept, not dropped)")
    print(f"a poller on {args.db} asks from cursor {cursor}; updates the webhook already stored are not "
          "stored twice")
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``webhook info|delete`` on ``subparsers`` (from ``add_subparsers()``); return it."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "webhook", help="show who holds the bot's webhook, or delete it to poll again",
    )
    commands = parser.add_subparsers(dest="webhook_command", metavar="{info,delete}", required=True)

    def token_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--token-env", default=TOKEN_ENV, metavar="VAR",
                         help=f"environment variable holding the bot token (default {TOKEN_ENV})")

    info = commands.add_parser("info", help="the webhook's host, pending update count and last error")
    token_option(info)
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=cmd_info)

    delete = commands.add_parser("delete", help="delete the webhook without dropping pending updates")
    delete.add_argument("db", metavar="DB")
    token_option(delete)
    delete.set_defaults(func=cmd_delete)
    return parser
