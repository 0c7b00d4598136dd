"""Webhook mode of the fake Bot API: ``setWebhook``, ``deleteWebhook``, ``getWebhookInfo``, and the threads that POST
queued updates to a loopback webhook as Telegram does.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import itertools
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...retry import exponential
from .answers import ApiError, as_bool, as_number
from .updates import Pending, UpdateQueue, parse_allowed

__all__ = ["Webhook", "describe_failure"]

_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")
_ACTIVE = "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"


@dataclass(frozen=True)
class WebhookConfig:
    """One ``setWebhook``."""

    url: str
    secret: str | None
    max_connections: int
    allowed: frozenset[str] | None  # None: the previous setting stays
    target: tuple[str, str, int, str] | None  # (scheme, host, port, path with query); None: not loopback


def _is_loopback(host: str) -> bool:
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
    loopback = _is_loopback(host)
    if scheme != "https" and not loopback:
        raise ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
    secret = params.get("secret_token") or None
    if secret is not None and (not isinstance(secret, str) or not _SECRET.fullmatch(secret)):
        raise ApiError(400, "Bad Request: secret token contains unallowed characters")
    max_connections = as_number(params, "max_connections")
    max_connections = 40 if max_connections is None else max_connections
    if not 1 <= max_connections <= 100:
        raise ApiError(400, "Bad Request: bad webhook: max_connections must be between 1 and 100")
    path = (split.path or "/") + (f"?{split.query}" if split.query else "")
    target = (scheme, host, port or (443 if scheme == "https" else 80), path) if loopback else None
    return WebhookConfig(url, secret, max_connections, parse_allowed(params.get("allowed_updates")), target)


def describe_failure(exc: BaseException) -> str:
    """The ``last_error_message`` Telegram shows for a delivery that got no HTTP answer."""
    for kinds, message in ((ConnectionRefusedError, "Connection refused"), (TimeoutError, "Read timeout expired"),
                           ((ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected),
                            "Connection reset by peer")):
        if isinstance(exc, kinds):
            return message
    if isinstance(exc, http.client.HTTPException):
        return f"Wrong response from the webhook: {type(exc).__name__}"
    return f"Connection failed: {exc}"


class Webhook:
    """The webhook that is set, and its delivery threads: a pump, run between :meth:`start` and :meth:`stop`, starts a
    thread per delivery, at most ``max_connections`` at once. Every access holds ``cond`` (the fake's one re-entrant
    condition), and every change wakes its waiters; ``stopping`` is set before :meth:`stop`.
    """

    def __init__(self, cond: threading.Condition, updates: UpdateQueue, stopping: threading.Event, *,
                 retry_delay: float, max_retry_delay: float) -> None:
        self.cond = cond
        self.updates = updates
        self.stopping = stopping
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.config: WebhookConfig | None = None
        self.in_flight: dict[int, Pending] = {}
        self.failures = 0  # consecutive failed deliveries
        self.retry_at = 0.0  # time.monotonic() before which no delivery starts (backoff)
        self.last_error: tuple[int, str] | None = None  # (date, message)
        self.attempts = 0
        self.deliveries = 0
        self._pump: threading.Thread | None = None
        self._threads: list[threading.Thread] = []
        self._conns: set[http.client.HTTPConnection] = set()
        self._conn_lock = threading.Lock()
        updates.conflict = lambda: _ACTIVE if self.config is not None else None

    def table(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        """The handlers of the webhook methods, by Bot API method name."""
        return {"setWebhook": self.set_webhook, "deleteWebhook": lambda params: self.set_webhook(params, delete=True),
                "getWebhookInfo": self.get_webhook_info}

    def set_webhook(self, params: dict[str, Any], *, delete: bool = False) -> Any:
        config = None if delete else parse_set_webhook(params)
        with self.cond:
            if config is not None and config.allowed is not None:
                self.updates.allowed = config.allowed
            if config != self.config:
                self.last_error, self.failures, self.retry_at = None, 0, 0.0
            self.config = config
            if as_bool(params.get("drop_pending_updates")):
                self.updates.pending.clear()
            self.cond.notify_all()
        return True

    def get_webhook_info(self, params: dict[str, Any]) -> Any:
        with self.cond:
            config = self.config
            info: dict[str, Any] = {"url": config.url if config else "", "has_custom_certificate": False,
                                    "pending_update_count": len(self.updates.pending)}
            if config is not None:
                info["max_connections"] = config.max_connections
            if self.last_error is not None:
                info["last_error_date"], info["last_error_message"] = self.last_error
            return info

    def start(self, port: int) -> None:
        """Deliver from now on (threads named after ``port``), starting with the updates already queued."""
        with self.cond:
            self._pump = threading.Thread(target=self._run, name=f"fake-bot-api:{port}-webhook", daemon=True)
            self._pump.start()

    def stop(self) -> None:
        """Cut the deliveries in flight (their updates stay queued) and join every delivery thread."""
        with self.cond:
            pump, self._pump = self._pump, None
            self.cond.notify_all()
        with self._conn_lock:
            for conn in self._conns:
                if conn.sock is not None:
                    with contextlib.suppress(OSError):
                        conn.sock.shutdown(socket.SHUT_RDWR)
        if pump is not None:
            pump.join()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _run(self) -> None:
        """The pump: start a delivery thread for each update that may go now, until :meth:`stop`."""
        me = threading.current_thread()
        seq = itertools.count(1)
        with self.cond:
            while self._pump is me and not self.stopping.is_set():
                job = self._next_job()
                if job is None:
                    wait = self.retry_at - time.monotonic() if self.retry_at else None
                    self.cond.wait(None if wait is None or wait <= 0 else wait)
                    continue
                thread = threading.Thread(target=self._deliver, args=job, name=f"{me.name}-{next(seq)}", daemon=True)
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
                thread.start()

    def _next_job(self) -> tuple[WebhookConfig, Pending] | None:
        """The first update a delivery may start now (marked in flight), or None. Caller holds ``cond``."""
        config = self.config
        if config is None or config.target is None or len(self.in_flight) >= config.max_connections:
            return None
        if time.monotonic() < self.retry_at:
            return None
        allowed = self.updates.allowed
        for item in list(self.updates.pending):
            if item.update_id in self.in_flight:
                continue
            if item.kind not in allowed:
                self.updates.pending.remove(item)  # Telegram does not send kinds outside allowed_updates
                continue
            self.in_flight[item.update_id] = item
            return config, item
        return None

    def _deliver(self, config: WebhookConfig, item: Pending) -> None:
        assert config.target is not None
        scheme, host, port, path = config.target
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        conn = cls(host, port, timeout=10.0)
        headers = {"Content-Type": "application/json"}
        if config.secret is not None:
            headers["X-Telegram-Bot-Api-Secret-Token"] = config.secret
        error: str | None
        try:
            conn.connect()
            with self._conn_lock:
                stopping = self.stopping.is_set()  # checked under the lock stop() cuts connections with
                if not stopping:
                    self._conns.add(conn)
            if stopping:
                return self._finish(config, item, None, abandoned=True)
            conn.request("POST", path, body=item.body.encode("utf-8"), headers=headers)
            response = conn.getresponse()
            response.read()
            ok = 200 <= response.status < 300
            error = None if ok else f"Wrong response from the webhook: {response.status} {response.reason}"
        except (OSError, http.client.HTTPException) as exc:
            if self.stopping.is_set():
                return self._finish(config, item, None, abandoned=True)
            error = describe_failure(exc)
        finally:
            with self._conn_lock:
                self._conns.discard(conn)
            conn.close()
        self._finish(config, item, error)

    def _finish(self, config: WebhookConfig, item: Pending, error: str | None, *, abandoned: bool = False) -> None:
        """A 2xx (``error`` None) removes the update; a failure is shown by ``getWebhookInfo`` and pauses deliveries
        (backoff); an abandoned delivery leaves the update queued."""
        with self.cond:
            self.in_flight.pop(item.update_id, None)
            if not abandoned:
                self.attempts += 1
                if error is None:
                    self.deliveries += 1
                    self.failures, self.retry_at = 0, 0.0
                    if item in self.updates.pending:
                        self.updates.pending.remove(item)
                elif config is self.config:
                    self.failures += 1
                    self.retry_at = time.monotonic() + exponential(self.failures, self.retry_delay,
                                                                   self.max_retry_delay)
                    self.last_error = (int(time.time()), error)
            self.cond.notify_all()


