"""The webhook setting of the fake Bot API (``setWebhook``, ``deleteWebhook``, ``getWebhookInfo``), the delivery
state it shares with :mod:`.delivery`, and :class:`WebhookControls`. It delivers only to loopback hosts; another
``https://`` webhook is registered but never receives anything.
"""

from __future__ import annotations

import ipaddress
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .answers import ApiError, as_bool, as_int
from .records import UploadedFile
from .updates import Pending, UpdateQueue, parse_allowed

__all__ = ["WebhookConfig", "WebhookControls", "WebhookState", "is_loopback", "parse_set_webhook"]

_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")
_ACTIVE = "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"


@dataclass(frozen=True)
class WebhookConfig:
    """One ``setWebhook``: where to deliver, how, and (``target``) whether the fake may deliver there."""

    url: str
    secret: str | None
    max_connections: int
    allowed: frozenset[str] | None  # None: the previous setting stays
    custom_certificate: bool
    target: tuple[str, str, int, str] | None  # (scheme, host, port, path with query); None: not loopback


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_set_webhook(params: dict[str, Any]) -> WebhookConfig | None:
    """The webhook a ``setWebhook`` asks for (None: an empty ``url`` removes it); raises Telegram's 400s."""
    url = str(params.get("url") or "").strip()
    if not url:
        return None
    split = urlsplit(url)
    scheme = split.scheme.lower()
    try:
        host, port = split.hostname or "", split.port
    except ValueError:
        raise ApiError(400, "Bad Request: bad webhook: Wrong port number specified in the URL") from None
    if scheme not in ("http", "https") or not host:
        raise ApiError(400, "Bad Request: bad webhook: Failed to resolve host: Name or service not known")
    loopback = is_loopback(host)
    if scheme != "https" and not loopback:
        raise ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
    secret = params.get("secret_token")
    if secret in (None, ""):
        secret = None
    elif not isinstance(secret, str) or not _SECRET.fullmatch(secret):
        raise ApiError(400, "Bad Request: secret token contains unallowed characters")
    max_connections = as_int(params, "max_connections")
    if max_connections is None:
        max_connections = 40
    if not 1 <= max_connections <= 100:
        raise ApiError(400, "Bad Request: bad webhook: max_connections must be between 1 and 100")
    path = (split.path or "/") + (f"?{split.query}" if split.query else "")
    default_port = 443 if scheme == "https" else 80
    target = (scheme, host, port or default_port, path) if loopback else None
    return WebhookConfig(
        url=url,
        secret=secret,
        max_connections=max_connections,
        allowed=parse_allowed(params.get("allowed_updates")),
        custom_certificate=isinstance(params.get("certificate"), UploadedFile),
        target=target,
    )


class WebhookState:
    """The webhook that is set, and its deliveries. Thread-safe: every access holds ``cond`` (the fake's
    one re-entrant condition); every change wakes its waiters (the delivery threads among them).
    """

    def __init__(self, cond: threading.Condition, updates: UpdateQueue) -> None:
        self.cond = cond
        self.updates = updates
        self.config: WebhookConfig | None = None
        self.allowed_given: tuple[str, ...] | None = None
        self.in_flight: dict[int, Pending] = {}
        self.failures = 0  # consecutive failed deliveries
        self.retry_at = 0.0  # time.monotonic() before which no delivery starts (backoff)
        self.last_error_date: int | None = None
        self.last_error_message: str | None = None
        self.attempts = 0
        self.deliveries = 0
        self.on_change: Callable[[], None] = lambda: None  # set by the delivery: start threads for new work
        updates.conflict = self._conflict

    def _conflict(self) -> str | None:
        return _ACTIVE if self.config is not None else None

    def table(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        """The handlers of the webhook methods, by Bot API method name."""
        return {
            "setWebhook": self.set_webhook,
            "deleteWebhook": self.delete_webhook,
            "getWebhookInfo": self.get_webhook_info,
        }

    def set_webhook(self, params: dict[str, Any]) -> Any:
        config = parse_set_webhook(params)
        with self.cond:
            if config is not None and config.allowed is not None:
                self.updates.allowed = config.allowed
                self.allowed_given = tuple(sorted(config.allowed))
            self._replace(config, as_bool(params.get("drop_pending_updates")))
        return True

    def delete_webhook(self, params: dict[str, Any]) -> Any:
        with self.cond:
            self._replace(None, as_bool(params.get("drop_pending_updates")))
        return True

    def _replace(self, config: WebhookConfig | None, drop_pending: bool) -> None:
        if config != self.config:
            self.last_error_date = self.last_error_message = None
            self.failures, self.retry_at = 0, 0.0
        self.config = config
        if drop_pending:
            self.updates.drop_pending()
        self.cond.notify_all()
        self.on_change()

    def get_webhook_info(self, params: dict[str, Any]) -> Any:
        with self.cond:
            config = self.config
            info: dict[str, Any] = {
                "url": config.url if config else "",
                "has_custom_certificate": bool(config and config.custom_certificate),
                "pending_update_count": len(self.updates.pending),
            }
            if config is not None:
                info["max_connections"] = config.max_connections
                if self.allowed_given is not None:
                    info["allowed_updates"] = list(self.allowed_given)
            if self.last_error_date is not None:
                info["last_error_date"] = self.last_error_date
                info["last_error_message"] = self.last_error_message
            return info

    def next_job(self) -> tuple[WebhookConfig, Pending] | None:
        """The first update a delivery may start now (marked in flight), or None. Caller holds ``cond``."""
        config = self.config
        if config is None or config.target is None or len(self.in_flight) >= config.max_connections:
            return None
        if time.monotonic() < self.retry_at:
            return None
        item = self._first_free()
        if item is None:
            return None
        self.in_flight[item.update_id] = item
        return config, item

    def free_count(self, limit: int) -> int:
        """How many queued updates (up to ``limit``) wait for a delivery. Caller holds ``cond``."""
        count = 0
        allowed = self.updates.allowed
        for item in self.updates.pending:
            if count >= limit:
                break
            if item.update_id not in self.in_flight and item.kind in allowed:
                count += 1
        return count

    def _first_free(self) -> Pending | None:
        allowed = self.updates.allowed
        unwanted: list[Pending] = []
        found: Pending | None = None
        for item in self.updates.pending:
            if item.update_id in self.in_flight:
                continue
            if item.kind not in allowed:
                unwanted.append(item)  # Telegram does not send kinds outside allowed_updates
                continue
            found = item
            break
        for item in unwanted:
            self.updates.pending.remove(item)
        return found

    def finish(self, config: WebhookConfig, item: Pending, error: str | None, backoff: Callable[[int], float]) -> None:
        """Note the end of one delivery: ``error`` None for a 2xx (the update leaves the queue), else the
        message ``getWebhookInfo`` shows and a pause of ``backoff(consecutive failures)`` seconds before the
        next delivery starts.
        """
        with self.cond:
            self.in_flight.pop(item.update_id, None)
            self.attempts += 1
            if error is None:
                self.deliveries += 1
                self.failures = 0
                self.retry_at = 0.0
                if item in self.updates.pending:
                    self.updates.pending.remove(item)
            elif config is self.config:
                self.failures += 1
                self.retry_at = time.monotonic() + backoff(self.failures)
                self.last_error_date = int(time.time())
                self.last_error_message = error
            self.cond.notify_all()

    def release(self, item: Pending) -> None:
        """A delivery abandoned without an answer (the fake is stopping): the update stays queued."""
        with self.cond:
            self.in_flight.pop(item.update_id, None)
            self.cond.notify_all()

    def drained(self) -> bool:
        """True when no update is queued or in flight. Caller holds ``cond``."""
        return not self.updates.pending and not self.in_flight


class WebhookControls:
    """The webhook-watching methods of ``FakeBotAPI`` (a base class of it); state in ``self._webhook``."""

    _webhook: WebhookState

    @property
    def webhook_url(self) -> str:
        """The webhook URL set through ``setWebhook`` ("" when none)."""
        with self._webhook.cond:
            config = self._webhook.config
            return config.url if config else ""

    @property
    def webhook_attempts(self) -> int:
        """How many webhook deliveries ended so far (answered 2xx, answered otherwise, or failed to connect)."""
        with self._webhook.cond:
            return self._webhook.attempts

    @property
    def webhook_deliveries(self) -> int:
        """How many webhook deliveries were answered with a 2xx (each removed its update from the queue)."""
        with self._webhook.cond:
            return self._webhook.deliveries

    @property
    def webhook_in_flight(self) -> int:
        """How many webhook deliveries are in progress now (never above the webhook's ``max_connections``)."""
        with self._webhook.cond:
            return len(self._webhook.in_flight)

    def wait_delivered(self, timeout: float = 5.0) -> bool:
        """Block until no update is queued or in flight (all delivered, or dropped); False on timeout."""
        with self._webhook.cond:
            return bool(self._webhook.cond.wait_for(self._webhook.drained, timeout))
