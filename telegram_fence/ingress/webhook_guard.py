"""Takeover protection for the bot's webhook: who owns it, whether this process may register it, and the watch that
notices when it moved.

Telegram never returns the secret token, so the URL this library registers carries a tag derived from the secret
(``tf=``, see docs/webhook.md): the same address registered with another secret reads as someone else's. The Bot API
calls raise the classified :class:`~telegram_fence.errors.TelegramError` with the token and the secret masked."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from telebot import apihelper

from .. import telegram
from ..errors import ConfigurationError, RetryAfter, TelegramError, WebhookTaken

__all__ = [
    "TAG_PARAM", "WebhookInfo", "WebhookWatch", "check_secret",
    "decide", "delete", "is_ours", "owner_host", "read_info", "register",
    "split_tag", "tag_of", "tagged_url", "webhook_conflict",
]

log = logging.getLogger("telegram_fence.webhook.guard")

#: The query parameter that carries the secret's tag in the registered URL.
TAG_PARAM = "tf"
_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")  # what Telegram accepts as a secret_token


def check_secret(secret: str) -> str:
    """``secret`` when Telegram accepts it as a ``secret_token``; else :class:`ConfigurationError` (without it)."""
    if not isinstance(secret, str) or _SECRET.fullmatch(secret) is None:
        raise ConfigurationError(
            "secret_token must be 1-256 characters of A-Z, a-z, 0-9, _ and - (what Telegram accepts); "
            "generate one with secrets.token_urlsafe(32)"
        )
    return secret


def split_tag(url: str) -> tuple[str, str | None]:
    """``(url without the tag parameter, the tag or None)``; the other query parameters keep their order."""
    parts = urllib.parse.urlsplit(url)
    items = parts.query.split("&") if parts.query else []
    tags = [item[len(TAG_PARAM) + 1:] for item in items if item.startswith(TAG_PARAM + "=")]
    if not tags:
        return url, None
    query = "&".join(item for item in items if not item.startswith(TAG_PARAM + "="))
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment)), tags[-1]


def tag_of(secret: str, base_url: str) -> str:
    """The tag for ``base_url`` (a URL without the tag) registered with ``secret``: 16 hex digits."""
    return hmac.new(secret.encode("utf-8"), base_url.encode("utf-8"), hashlib.sha256).hexdigest()[:16]


def tagged_url(url: str, secret: str) -> str:
    """``url`` with this secret's tag as its last query parameter (an old tag is replaced).
    :class:`ConfigurationError` for a URL without an ``http``/``https`` scheme and a host."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            "the webhook url must be an absolute https:// URL with a host (Telegram calls it from outside)"
        )
    base, _ = split_tag(url)
    parts = urllib.parse.urlsplit(base)
    tag = f"{TAG_PARAM}={tag_of(secret, base)}"
    query = f"{parts.query}&{tag}" if parts.query else tag
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def owner_host(url: str) -> str:
    """The host (with its port, when the URL names one) a webhook URL points to; never its path or query.
    ``""`` for an empty URL, ``"an unreadable address"`` for one that cannot be parsed."""
    if not url:
        return ""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "an unreadable address"
    if not host:
        return "an unreadable address"
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"{host}:{port}" if port is not None else host


def is_ours(info_url: str, my_url: str, secret: str) -> bool:
    """Whether the registered ``info_url`` is ``my_url`` (tag or not) carrying ``secret``'s tag."""
    base, tag = split_tag(info_url)
    mine, _ = split_tag(my_url)
    return bool(info_url) and tag is not None and base == mine and hmac.compare_digest(tag, tag_of(secret, mine))


def decide(info_url: str, my_url: str, secret: str, takeover_from: str | None = None) -> str:
    """May this process register ``my_url`` with ``secret``, given the registered ``info_url``? Yes (why:
    ``"empty"``, ``"ours"`` or ``"takeover"``) when nothing is registered, when ``info_url`` is ``my_url`` with this
    secret's tag, or when ``takeover_from`` names its host; else raises :class:`WebhookTaken` naming that host (the
    same address with another tag, or none, is someone else's too)."""
    if not info_url:
        return "empty"
    host = owner_host(info_url)
    if is_ours(info_url, my_url, secret):
        return "ours"
    if takeover_from and host:  # a host, host:port or a URL naming it
        wanted = takeover_from.strip().lower()
        wanted = owner_host(wanted) if "://" in wanted else wanted
        try:
            bare = urllib.parse.urlsplit("//" + host).hostname
        except ValueError:
            bare = None
        if wanted in ({host.lower(), bare, f"[{bare}]"} if bare else {host.lower()}):
            return "takeover"
    same_address = split_tag(info_url)[0] == split_tag(my_url)[0]
    raise WebhookTaken(host, "this address, registered with another secret or by another program" if same_address
                       else "")


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
        return {"host": self.host, **{k: v for k, v in asdict(self).items() if k != "url"}}


def _call(method: str, fn: Any, hidden: Sequence[str], *args: Any, **kwargs: Any) -> Any:
    """``telegram.call``; its error has ``hidden`` (and bot tokens) masked and no chain (it holds request URLs)."""
    try:
        return telegram.call(method, fn, *args, **kwargs)
    except TelegramError as exc:
        text = telegram.mask_tokens(exc.description, hidden)
        if isinstance(exc, RetryAfter):
            raise RetryAfter(exc.seconds, text, error_code=exc.error_code, method=exc.method) from None
        raise type(exc)(text, error_code=exc.error_code, method=exc.method) from None


def read_info(token: str) -> WebhookInfo:
    """``getWebhookInfo`` for the bot; raises the classified :class:`TelegramError` on failure."""
    raw = _call("getWebhookInfo", apihelper.get_webhook_info, (), token)
    if not isinstance(raw, dict):
        raise TelegramError("getWebhookInfo answered without an object", method="getWebhookInfo")
    error, date, limit = raw.get("last_error_message"), raw.get("last_error_date"), raw.get("max_connections")
    return WebhookInfo(
        url=str(raw.get("url") or ""),
        pending_update_count=int(raw.get("pending_update_count") or 0),
        last_error_message=telegram.mask_tokens(str(error)) if error else None,
        last_error_date=int(date) if isinstance(date, int) else None,
        max_connections=int(limit) if isinstance(limit, int) else None,
    )


def register(token: str, url: str, secret: str, *, allowed_updates: Sequence[str] | None = None,
             drop_pending: bool = False) -> str:
    """``setWebhook`` with ``url`` tagged for ``secret`` and the secret token; returns the tagged URL. Raises the
    classified :class:`TelegramError`, its text free of the token, the secret and the tag."""
    full = tagged_url(url, check_secret(secret))
    _call("setWebhook", apihelper.set_webhook, (secret, split_tag(full)[1] or ""), token, url=full,
          allowed_updates=list(allowed_updates) if allowed_updates is not None else None,
          drop_pending_updates=bool(drop_pending), secret_token=secret)
    return full


def delete(token: str) -> None:
    """``deleteWebhook`` keeping the pending updates (a poller fetches them next)."""
    _call("deleteWebhook", apihelper.delete_webhook, (), token, drop_pending_updates=False)


def webhook_conflict(token: str) -> str | None:
    """Why ``getUpdates`` got 409 when the cause is a registered webhook (naming its host), else ``None`` (also when
    ``getWebhookInfo`` fails: logged, then treated as another poller)."""
    try:
        info = read_info(token)
    except Exception as exc:
        log.info("getWebhookInfo failed after a 409; treating it as another poller", extra={"err": exc})
        return None
    if not info.url:
        return None
    return (f"a webhook to {info.host} is set for this bot, so getUpdates cannot run (409 Conflict); "
            "serve it with Fence.run_webhook, or delete it (telegram-fence webhook delete) to poll again")


class WebhookWatch:
    """The ``fence-webhook-watch`` thread: a ``getWebhookInfo`` every ``interval`` seconds; it reports once
    (``on_moved(reason)``) and ends when the webhook is no longer ``my_url`` with ``secret`` or Telegram reports its
    deliveries answered 401 since ``registered_at`` (the secret swapped: Telegram's own error is the proof). A
    failed check is logged, never a move; a passed one calls ``on_checked``. ``my_url=None``: the first check learns the
    URL registered then as ours. All public methods are safe from any thread."""

    def __init__(self, token: str, my_url: str | None, secret: str, *, on_moved: Callable[[str], None],
                 interval: float = 60.0, first: WebhookInfo | None = None, registered_at: float | None = None,
                 on_checked: Callable[[], None] | None = None) -> None:
        self._token, self._url, self._secret = token, my_url, secret
        self._on_moved, self._on_checked = on_moved, on_checked
        self.learning = my_url is None  #: the first check learns the URL
        self._interval = max(0.01, float(interval))
        self._since = time.time() if registered_at is None else registered_at
        self._info = first
        self._check_error: str | None = None
        self._checks = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fence-webhook-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; returns at once."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread (a check in progress ends within the API call's timeout); whether it ended."""
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        if self.learning and self._check():  # learn the URL at once (a delivery just proved it points here)
            return
        while not self._stop.wait(self._interval):
            if self._check():
                return

    def _check(self) -> bool:
        """One ``getWebhookInfo``; ``True`` when it reported the end."""
        try:
            info = read_info(self._token)
        except Exception as exc:  # never a move (a bug is logged with its traceback)
            known = isinstance(exc, TelegramError)
            log.log(logging.WARNING if known else logging.ERROR, "getWebhookInfo failed; checking again later",
                    exc_info=not known, extra={"err": exc})
            with self._lock:
                self._check_error = str(exc) if known else repr(exc)
            return False
        with self._lock:
            self._info, self._check_error = info, None
            self._checks += 1
        if info.last_error_message:
            log.warning("Telegram reports a webhook delivery error", extra={
                "last_error_message": info.last_error_message, "pending_update_count": info.pending_update_count})
        if self._url is None:
            if not info.url:  # not registered (yet): nothing to learn, nothing moved
                return False
            self._url = info.url
            log.info("watching the webhook as it is registered now", extra={"host": info.host})
        if not (info.url == self._url if self.learning else is_ours(info.url, self._url, self._secret)):
            reason = (f"the bot's webhook was moved to {info.host} (another process called setWebhook)" if info.url
                      else "the bot's webhook was deleted at Telegram (by another process or by hand)")
            reason += "; no update reaches this process any more"
        elif "401" in (info.last_error_message or "") and (info.last_error_date or 0) >= int(self._since):
            reason = (f"Telegram's deliveries to the webhook at {info.host} are refused with 401: the webhook was "
                      "registered again with another secret_token (by another program, or another instance with a "
                      "different secret); no update is handled here any more. Restart with the right secret, or pass "
                      "takeover_from= to take it back")
        else:
            if self._on_checked is not None:
                try:
                    self._on_checked()
                except Exception:
                    log.error("recording the webhook check failed", exc_info=True)
            return False
        if not self._stop.is_set():
            self._on_moved(reason)
        return True

    def stats(self) -> dict[str, Any]:
        """Telegram's last answer (host, pending count, last error; never the URL) and the check state."""
        with self._lock:
            info, error, checks = self._info, self._check_error, self._checks
        return {**(info.public() if info is not None else {}), "checks": checks, "check_error": error}
