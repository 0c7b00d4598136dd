"""``telegram-fence webhook info|delete``: see who holds the bot's webhook; switch back to polling.

The token and the webhook's URL (it may carry a secret) are never printed, only its host. Exit status: 0 done; 1
Telegram refused the call; 2 bad input (an unknown token included); 3 Telegram could not be reached: try again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..errors import Ambiguous, FenceError, RetryAfter, TelegramError, Transient, Unauthorized
from ..ingress import webhook_guard
from ..telegram import API_URL_ENV, api_server, api_url_formats
from .database import open_current
from .updates import when

TOKEN_ENV = "TELEGRAM_BOT_TOKEN"

EXIT_REFUSED = 1  # Telegram answered the call with an error
EXIT_UNREACHABLE = 3  # Telegram could not be reached (no answer, a timeout, a 5xx): nothing is wrong with the input

_T = TypeVar("_T")


class _TelegramFailed(FenceError):
    """A Bot API call of a webhook command failed: its one line, and ``exit_code`` for the command to exit with."""

    def __init__(self, line: str, exit_code: int) -> None:
        super().__init__(line)
        self.exit_code = exit_code


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[str]:
    """telebot pointed at ``--api-url`` (else ``$TELEGRAM_API_URL``) inside the block; yields the server's host."""
    url = args.api_url or os.environ.get(API_URL_ENV) or None
    if url is None:
        yield "api.telegram.org"
        return
    api, files = api_url_formats(url)
    with api_server(api, files):
        yield urllib.parse.urlsplit(api).netloc or url


def _last_cause(description: str) -> str:
    """The innermost cause of a classified error's text (its chain is joined with `` | ``), on one short line."""
    last = description.rsplit(" | ", 1)[-1].strip()
    return " ".join(last.split())[:200]


def _ask(host: str, method: str, call: Callable[[], _T]) -> _T:
    """``call()``; its :class:`TelegramError` becomes :class:`_TelegramFailed` (one readable line, an exit status)."""
    try:
        return call()
    except Unauthorized:
        raise _TelegramFailed(f"{host} answered 401 Unauthorized to {method}: the bot token is wrong or revoked",
                              2) from None
    except RetryAfter as exc:
        raise _TelegramFailed(f"{host} asked to wait {exc.seconds:g} s before calling {method} again", 3) from None
    except (Transient, Ambiguous) as exc:
        unsure = " (the webhook may or may not have been deleted: run `telegram-fence webhook info`)" \
            if method == "deleteWebhook" and isinstance(exc, Ambiguous) else ""
        raise _TelegramFailed(f"could not reach Telegram at {host} for {method}: {_last_cause(exc.description)}"
                              f"{unsure}", EXIT_UNREACHABLE) from None
    except TelegramError as exc:
        code = f" {exc.error_code}" if exc.error_code is not None else ""
        raise _TelegramFailed(f"{host} refused {method}{code}: {_last_cause(exc.description)}", EXIT_REFUSED) from None


def _token(args: argparse.Namespace) -> str:
    token = os.environ.get(args.token_env, "")
    if not token:
        raise FenceError(f"environment variable {args.token_env} is empty or unset; put the bot token there")
    return token


def cmd_info(args: argparse.Namespace) -> int:
    """Print the webhook's host, Telegram's pending count and its last delivery error."""
    token = _token(args)
    with _server(args) as host:
        info = _ask(host, "getWebhookInfo", lambda: webhook_guard.read_info(token))
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
    print(f"last delivery error  {info.last_error_message or '-'}  ({when(info.last_error_date)})")
    if info.max_connections is not None:
        print(f"max connections      {info.max_connections}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete the webhook keeping Telegram's pending updates; print where a poller on ``DB`` (a current
    telegram_fence database, checked first: anything else is refused, unchanged) resumes."""
    token = _token(args)
    with open_current(args.db) as store:
        cursor = store.next_offset()
    with _server(args) as host:
        info = _ask(host, "getWebhookInfo", lambda: webhook_guard.read_info(token))
        if not info.url:
            print("no webhook is set; the bot can poll with getUpdates")
            return 0
        _ask(host, "deleteWebhook", lambda: webhook_guard.delete(token))
    print(f"deleted the webhook to {info.host}; {info.pending_update_count} update(s) wait at Telegram "
          f"(kept, not dropped)")
    print(f"a poller on {args.db} asks from cursor {cursor}; updates the webhook already stored are not "
          "stored twice")
    return 0
