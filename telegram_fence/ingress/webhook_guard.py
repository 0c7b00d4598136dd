"""Takeover protection for the bot's webhook: who owns it, and whether this process may register it.

A webhook is one setting for the whole bot: a ``setWebhook`` from a stray process silently takes the
bot away from the one that had it. Telegram never returns the secret token, so the URL this library
registers carries a tag derived from the secret: ``tf=<first 16 hex digits of HMAC-SHA256(secret,
url without the tag)>`` in the query string, which routers and WSGI apps ignore. The same address
registered with another secret then reads as someone else's.

The decisions (:func:`tagged_url`, :func:`owner_host`, :func:`is_ours`, :func:`decide`,
:func:`conflict_reason`) are plain functions of values; the thin I/O below them (:func:`read_info`,
:func:`register`, :func:`delete`) calls the Bot API through telebot and raises the classified
:class:`~telegram_fence.errors.TelegramError` with the token and the secret masked.

Imports: the standard library, telebot's ``apihelper`` (only to call the three webhook methods),
``telegram`` and ``errors``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from telebot import apihelper

from .. import telegram
from ..errors import ConfigurationError, RetryAfter, TelegramError, WebhookTaken

__all__ = [
    "TAG_PARAM",
    "Decision",
    "WebhookInfo",
    "check_secret",
    "conflict_reason",
    "decide",
    "delete",
    "is_ours",
    "moved_reason",
    "owner_host",
    "read_info",
    "register",
    "split_tag",
    "tag_of",
    "tagged_url",
    "webhook_conflict",
]

log = logging.getLogger("telegram_fence.webhook.guard")

#: The query parameter that carries the secret's tag in the registered URL.
TAG_PARAM = "tf"

# What Telegram accepts as a secret_token: 1-256 characters A-Z, a-z, 0-9, _ and -.
_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")


def check_secret(secret: str) -> str:
    """Return ``secret`` when Telegram accepts it as a ``secret_token``; else :class:`ConfigurationError`.

    The message never contains the secret itself.
    """
    if not isinstance(secret, str) or _SECRET.fullmatch(secret) is None:
        raise ConfigurationError(
            "secret_token must be 1-256 characters of A-Z, a-z, 0-9, _ and - (what Telegram accepts); "
            "generate one with secrets.token_urlsafe(32)"
        )
    return secret


# --- decisions (plain functions of values) ---------------------------------------------------------


def split_tag(url: str) -> tuple[str, str | None]:
    """``(url without the tag parameter, the tag or None)``; the other query parameters keep their order."""
    parts = urllib.parse.urlsplit(url)
    if not parts.query:
        return url, None
    kept: list[str] = []
    tag: str | None = None
    for item in parts.query.split("&"):  # textually, so the other parameters keep their exact encoding
        if item.startswith(TAG_PARAM + "="):
            tag = item[len(TAG_PARAM) + 1:]
        else:
            kept.append(item)
    if tag is None:
        return url, None
    query = "&".join(kept)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment)), tag


def tag_of(secret: str, base_url: str) -> str:
    """The tag for ``base_url`` (a URL without the tag) registered with ``secret``: 16 hex digits."""
    digest = hmac.new(secret.encode("utf-8"), base_url.encode("utf-8"), hashlib.sha256).hexdigest()
    return digest[:16]


def tagged_url(url: str, secret: str) -> str:
    """``url`` with this secret's tag as its last query parameter (an old tag is replaced).

    Raises :class:`ConfigurationError` for a URL without an ``http``/``https`` scheme and a host.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            "the webhook url must be an absolute https:// URL with a host (Telegram calls it from outside)"
        )
    base, _ = split_tag(url)
    tag = tag_of(secret, base)
    parts = urllib.parse.urlsplit(base)
    query = f"{parts.query}&{TAG_PARAM}={tag}" if parts.query else f"{TAG_PARAM}={tag}"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def owner_host(url: str) -> str:
    """The host (with its port, when the URL names one) a webhook URL points to; never its path or query.

    ``""`` for an empty URL, ``"an unreadable address"`` for one that cannot be parsed.
    """
    if not url:
        return ""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return "an unreadable address"
    if not host:
        return "an unreadable address"
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"{host}:{port}" if port is not None else host


def is_ours(info_url: str, my_url: str, secret: str) -> bool:
    """Whether the registered ``info_url`` is ``my_url`` (tag or not) carrying ``secret``'s tag."""
    if not info_url:
        return False
    base, tag = split_tag(info_url)
    mine, _ = split_tag(my_url)
    return tag is not None and base == mine and hmac.compare_digest(tag, tag_of(secret, mine))


def _names_host(takeover_from: str | None, host: str) -> bool:
    """Whether ``takeover_from`` (a host, ``host:port`` or a URL) names ``host``."""
    if not takeover_from or not host:
        return False
    wanted = takeover_from.strip().lower()
    if "://" in wanted:  # a URL was passed: compare its host
        wanted = owner_host(wanted)
    names = {host.lower()}
    try:
        bare = urllib.parse.urlsplit("//" + host).hostname
    except ValueError:
        bare = None
    if bare:
        names.update((bare, f"[{bare}]"))
    return wanted in names


@dataclass(frozen=True, slots=True)
class Decision:
    """Why registering the webhook is allowed: ``"empty"``, ``"ours"`` or ``"takeover"``; and the
    host it pointed to before (``""`` when empty)."""

    reason: str
    previous_host: str


def decide(info_url: str, my_url: str, secret: str, takeover_from: str | None = None) -> Decision:
    """May this process register ``my_url`` with ``secret``, given the registered ``info_url``?

    Allowed when nothing is registered, when ``info_url`` is ``my_url`` with this secret's tag, or
    when ``takeover_from`` names the host ``info_url`` points to (``host`` or ``host:port``).
    Otherwise raises :class:`WebhookTaken` naming that host (the same address with another secret,
    or without a tag, is someone else's too). Never raises for other reasons.
    """
    if not info_url:
        return Decision("empty", "")
    host = owner_host(info_url)
    if is_ours(info_url, my_url, secret):
        return Decision("ours", host)
    if _names_host(takeover_from, host):
        return Decision("takeover", host)
    same_address = split_tag(info_url)[0] == split_tag(my_url)[0]
    detail = "this address, registered with another secret or by another program" if same_address else ""
    raise WebhookTaken(host, detail)


def conflict_reason(info_url: str) -> str | None:
    """Why ``getUpdates`` answers 409 when a webhook is registered (naming its host), else ``None``."""
    if not info_url:
        return None
    host = owner_host(info_url)
    return (
        f"a webhook to {host} is set for this bot, so getUpdates cannot run (409 Conflict); serve it with "
        "Fence.run_webhook, or delete it (telegram-fence webhook delete) to poll again"
    )


def moved_reason(info_url: str) -> str:
    """Why a process serving the webhook no longer receives updates, given what is registered now."""
    if not info_url:
        return ("the bot's webhook was deleted at Telegram (by another process or by hand); no update reaches "
                "this process any more")
    return (
        f"the bot's webhook was moved to {owner_host(info_url)} (another process called setWebhook); no update "
        "reaches this process any more"
    )


# --- thin I/O --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WebhookInfo:
    """What ``getWebhookInfo`` said. ``url`` is private (it carries the tag): show :attr:`host`."""

    url: str
    pending_update_count: int
    last_error_message: str | None
    last_error_date: int | None
    max_connections: int | None

    @property
    def host(self) -> str:
        return owner_host(self.url)

    def public(self) -> dict[str, Any]:
        """The fields safe to log or show (no URL, no query)."""
        return {
            "host": self.host,
            "pending_update_count": self.pending_update_count,
            "last_error_message": self.last_error_message,
            "last_error_date": self.last_error_date,
            "max_connections": self.max_connections,
        }


def _masked(exc: TelegramError, hidden: Sequence[str]) -> TelegramError:
    """The same kind of error with ``hidden`` strings (and bot tokens) removed from its text."""
    text = telegram.mask_tokens(exc.description, hidden)
    if isinstance(exc, RetryAfter):
        return RetryAfter(exc.seconds, text, error_code=exc.error_code, method=exc.method)
    return type(exc)(text, error_code=exc.error_code, method=exc.method)


def _call(method: str, fn: Any, hidden: Sequence[str], *args: Any, **kwargs: Any) -> Any:
    try:
        return telegram.call(method, fn, *args, **kwargs)
    except TelegramError as exc:
        # The chain holds request URLs with the token and, for setWebhook, the secret: drop it.
        raise _masked(exc, hidden) from None


def read_info(token: str) -> WebhookInfo:
    """``getWebhookInfo`` for the bot; raises the classified :class:`TelegramError` on failure."""
    raw = _call("getWebhookInfo", apihelper.get_webhook_info, (), token)
    if not isinstance(raw, dict):
        raise TelegramError("getWebhookInfo answered without an object", method="getWebhookInfo")
    error = raw.get("last_error_message")
    date = raw.get("last_error_date")
    limit = raw.get("max_connections")
    return WebhookInfo(
        url=str(raw.get("url") or ""),
        pending_update_count=int(raw.get("pending_update_count") or 0),
        last_error_message=telegram.mask_tokens(str(error)) if error else None,
        last_error_date=int(date) if isinstance(date, int) else None,
        max_connections=int(limit) if isinstance(limit, int) else None,
    )


def register(
    token: str,
    url: str,
    secret: str,
    *,
    allowed_updates: Sequence[str] | None = None,
    drop_pending: bool = False,
    max_connections: int | None = None,
) -> str:
    """``setWebhook`` with ``url`` tagged for ``secret`` and the secret token; returns the tagged URL.

    Raises the classified :class:`TelegramError`, its text free of the token, the secret and the tag.
    """
    check_secret(secret)
    full = tagged_url(url, secret)
    _call(
        "setWebhook", apihelper.set_webhook, (secret, split_tag(full)[1] or ""), token,
        url=full,
        max_connections=max_connections,
        allowed_updates=list(allowed_updates) if allowed_updates is not None else None,
        drop_pending_updates=bool(drop_pending),
        secret_token=secret,
    )
    return full


def delete(token: str) -> None:
    """``deleteWebhook`` keeping the pending updates (a poller fetches them next)."""
    _call("deleteWebhook", apihelper.delete_webhook, (), token, drop_pending_updates=False)


def webhook_conflict(token: str) -> str | None:
    """Why ``getUpdates`` got 409 when the cause is a registered webhook (naming its host), else ``None``.

    Reads ``getWebhookInfo``; when that fails the 409 is treated as another poller (``None``, logged). The poller
    imports it on that rare path only, so a polling bot does not load this module at start.
    """
    try:
        info = read_info(token)
    except Exception as exc:
        log.info("getWebhookInfo failed after a 409; treating it as another poller", extra={"err": exc})
        return None
    return conflict_reason(info.url)
