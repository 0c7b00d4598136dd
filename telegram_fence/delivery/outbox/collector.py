"""The collector: which URLs may receive captures, one POST to it, and what its answers mean."""

from __future__ import annotations

import http.client
import ipaddress
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from ...errors import ConfigurationError
from ...retry import exponential

_ANSWER_READ = 64 * 1024  # bytes of the collector's answer read at most
_ANSWER_KEPT = 2000  # characters of it kept in the row
_MAX_RETRY_AFTER = 86400.0  # a Retry-After beyond one day is taken as one day
_USER_AGENT = "telegram-fence-outbox/1"


@dataclass(frozen=True, slots=True)
class Answer:
    """What the collector answered: status, reason, ``Retry-After`` header, and the start of the body."""

    status: int
    reason: str
    retry_after: str | None
    body: str


@dataclass(frozen=True, slots=True)
class CollectorTarget:
    """A validated collector URL, split for ``http.client``; ``safe`` is what may be logged."""

    scheme: str
    host: str
    port: int
    target: str
    safe: str


def check_collector_url(url: str, *, allow_remote: bool = False) -> CollectorTarget:
    """The collector URL split for ``http.client``: ``http(s)`` to a loopback host, or with ``allow_remote=True`` any
    host over ``https``, without credentials. Raises :class:`ConfigurationError` naming what is wrong."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"collector_url={url!r} must be an http(s) URL such as http://127.0.0.1:8080/capture")
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ConfigurationError(f"collector_url {url!r}: scheme must be http or https, not {parts.scheme!r}")
    if parts.username is not None or parts.password is not None:
        raise ConfigurationError("collector_url must not carry credentials (user:password@); pass "
                                 "headers={'Authorization': ...}")
    host = parts.hostname
    if not host:
        raise ConfigurationError(f"collector_url {url!r} has no host")
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"collector_url {url!r} has an invalid port: {exc}") from None
    if port is None:
        port = 443 if scheme == "https" else 80
    try:
        loopback = host.lower() == "localhost" or ipaddress.ip_address(host).is_loopback  # 127.0.0.0/8 or ::1
    except ValueError:
        loopback = False
    if not loopback:
        if not allow_remote:
            raise ConfigurationError(f"collector_url host {host!r} is not loopback (127.0.0.0/8, ::1, localhost); "
                                     "captures hold private messages, so a remote collector needs allow_remote=True "
                                     "and https")
        if scheme != "https":
            raise ConfigurationError(f"collector_url {parts.scheme}://{host}: a remote collector must use https, even "
                                     "with allow_remote=True")
    path = parts.path or "/"
    target = f"{path}?{parts.query}" if parts.query else path
    shown_host = f"[{host}]" if ":" in host else host
    return CollectorTarget(scheme, host, port, target, f"{scheme}://{shown_host}:{port}{path}")


def classify_status(status: int) -> str:
    """``"delivered"`` (2xx), ``"retry"`` (408, 429, 5xx) or ``"failed"`` (anything else: redirects are not
    followed)."""
    if 200 <= status < 300:
        return "delivered"
    if status in (408, 429) or 500 <= status < 600:
        return "retry"
    return "failed"


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header in seconds; ``None`` if absent or not a number of seconds (an
    HTTP date included: the backoff applies then)."""
    text = (value or "").strip()
    return float(text) if text.isdigit() else None


def retry_delay(attempt: int, *, initial: float, maximum: float, retry_after: float | None = None) -> float:
    """Seconds before the next delivery after failed attempt ``attempt`` (1-based): exponential from ``initial`` up
    to ``maximum``, or ``retry_after`` kept between ``initial`` (no hot loop) and one day."""
    if retry_after is not None:
        return min(max(retry_after, initial), _MAX_RETRY_AFTER)
    return exponential(max(attempt, 1), initial, maximum)


def post(target: CollectorTarget, payload: str, *, key: str, attempt: int, headers: Mapping[str, str],
         timeout: float) -> Answer:
    """POST one capture's ``payload`` with its ``Idempotency-Key``; raises ``OSError`` or ``HTTPException``."""
    kind = http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
    connection = kind(target.host, target.port, timeout=timeout)  # https: the default context verifies
    sent = {**headers, "Content-Type": "application/json; charset=utf-8", "Idempotency-Key": key,
            "X-Capture-Attempt": str(attempt), "User-Agent": _USER_AGENT, "Connection": "close"}
    try:
        connection.request("POST", target.target, body=payload.encode("utf-8"), headers=sent)
        response = connection.getresponse()
        body = response.read(_ANSWER_READ)
        kept = body.decode("utf-8", "replace")[:_ANSWER_KEPT]
        return Answer(response.status, response.reason, response.getheader("Retry-After"), kept)
    finally:
        connection.close()
