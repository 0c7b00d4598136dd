"""The thin layer over pyTelegramBotAPI: the only module that touches telebot's globals and exceptions.

- :func:`classify` turns any exception from a Bot API call into one :class:`~telegram_fence.errors.TelegramError`
  subclass, so policy elsewhere (poller, workers, broadcast, operator channel) is a plain ``isinstance`` test.
- :func:`mask_tokens` removes bot tokens from text; every log path and every error message built here uses it.
- :func:`api_server` points telebot at another Bot API server (the fake one in tests, a local one in production)
  and restores the previous setting afterwards; :func:`use_api_url` does it from a URL or ``$TELEGRAM_API_URL``.
- :func:`telebot_get_updates` and :func:`api_url` give the poller telebot's request path and URL; the poller's own
  connection lives in :mod:`telegram_fence.ingress.long_poll`.
- :func:`install_request_sender` puts a function between telebot and HTTP (``apihelper.CUSTOM_REQUEST_SENDER``)
  for the life of a fence: the call journal sees every Bot API call a handler makes there. :class:`Answer` is
  a recorded answer telebot reads as if it came from the server.

Everything here is safe to call from any thread, except :func:`api_server`, which changes process-wide
telebot settings and should be used once, around the whole life of the bots that need it.
"""

from __future__ import annotations

import errno
import http.client
import json
import math
import os
import re
import socket
import ssl
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import requests
import urllib3.exceptions
from telebot import apihelper

from .errors import (
    Ambiguous,
    ConfigurationError,
    Conflict,
    Fatal,
    MessageRefused,
    RecipientGone,
    RetryAfter,
    TelegramError,
    Transient,
    Unauthorized,
)

__all__ = [
    "API_URL_ENV",
    "Answer",
    "RequestSender",
    "api_server",
    "api_url",
    "api_url_formats",
    "call",
    "classify",
    "direct_polling_allowed",
    "install_request_sender",
    "is_certificate_failure",
    "mask_tokens",
    "method_of_url",
    "send_request",
    "set_api_server",
    "telebot_get_updates",
    "token_pattern",
    "use_api_url",
]

#: A bot token: the bot's numeric id, a colon, and a 30+ character secret (35 in practice).
# The trailing group swallows a second token glued to the first ("<id>:<secret><id>:<secret>"), whose
# id the greedy secret class would otherwise eat, leaving the second secret visible.
token_pattern = re.compile(r"(?<![0-9])([0-9]{3,20}):[A-Za-z0-9_-]{30,}(?::[A-Za-z0-9_-]{30,})*")

_MASK = r"\1:***"

# 400 descriptions that mean the *recipient* is the problem, not the message.
_GONE_400 = (
    "chat not found",
    "user not found",
    "peer_id_invalid",
    "group chat was upgraded",
    "chat_write_forbidden",
    "bot was kicked",
    "user is deactivated",
    "have no rights to send",
    "not enough rights to send",
    "need administrator rights",
)

# errno values of a connection that never got to send: refused, no route, no address.
_NOT_SENT_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ECONNREFUSED", "ENETUNREACH", "EHOSTUNREACH", "EADDRNOTAVAIL", "ENETDOWN")
    if hasattr(errno, name)
)


def mask_tokens(text: str, secrets: Sequence[str] = ()) -> str:
    """Return ``text`` with every bot token and every string in ``secrets`` replaced by ``***``.

    The numeric bot id before a token's colon is kept (it is public and helps tell bots apart).
    Never raises for a ``str``; empty secrets are ignored.
    """
    masked = token_pattern.sub(_MASK, text)
    for secret in secrets:
        if secret and secret in masked:
            masked = masked.replace(secret, "***")
    return masked


def _retry_after_of(result_json: Any) -> float:
    try:
        return _seconds(result_json["parameters"]["retry_after"])
    except (KeyError, TypeError):
        return 1.0


def _seconds(value: Any) -> float:
    """A ``retry_after`` as a number of seconds >= 0 (it may be infinite); 1.0 when it is not a number (NaN)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return 1.0
    return 1.0 if math.isnan(seconds) else max(0.0, seconds)


def _from_api_error(exc: apihelper.ApiTelegramException, method: str | None) -> TelegramError:
    return from_answer(exc.error_code, exc.description, exc.result_json, method)


def from_answer(code: Any, description: Any, result_json: Any, method: str | None) -> TelegramError:
    """The error for an ``ok: false`` answer with ``error_code`` ``code``."""
    description = mask_tokens(str(description))
    text = description.lower()
    kw: dict[str, Any] = {"error_code": code, "method": method}
    if code == 429:
        return RetryAfter(_retry_after_of(result_json), description, **kw)
    if code == 401:
        return Unauthorized(description, **kw)
    if code == 409:
        return Conflict(description, **kw)
    if code == 403:
        return RecipientGone(description, **kw)
    if code == 400:
        if any(marker in text for marker in _GONE_400):
            return RecipientGone(description, **kw)
        return MessageRefused(description, **kw)
    if isinstance(code, int) and 500 <= code < 600:
        # The server failed while handling the request: it may have acted before it failed.
        return Ambiguous(description, **kw)
    return Fatal(description, **kw)


def from_http_status(status: int, description: str, method: str | None, headers: Any) -> TelegramError:
    kw: dict[str, Any] = {"error_code": status, "method": method}
    if status == 429:
        seconds = 1.0
        with suppress(AttributeError):
            seconds = _seconds(headers.get("Retry-After", 1))
        return RetryAfter(seconds, description, **kw)
    if status == 401:
        return Unauthorized(description, **kw)
    if status == 409:
        return Conflict(description, **kw)
    if status == 408:  # the server gave up waiting for the request itself: it was not handled
        return Transient(description, **kw)
    if 500 <= status < 600:
        # A gateway's 502/504 (and any 5xx) may come after the server behind it acted.
        return Ambiguous(description, **kw)
    return Fatal(description, **kw)


def _chain_text(exc: BaseException) -> str:
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(parts) < 8:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return " | ".join(parts)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps: causes, contexts, urllib3's ``reason`` and exceptions passed as
    arguments (requests wraps urllib3, which wraps ``ssl`` and ``socket``). Cycle-safe and bounded."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 32:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        nested = [current.__cause__, current.__context__, getattr(current, "reason", None), *current.args[:2]]
        todo.extend(item for item in nested if isinstance(item, BaseException))


def _never_sent(exc: BaseException) -> bool:
    """Whether ``exc`` shows that no connection was made, so no byte of the request left this machine.

    Judged by the exceptions' types and errno values, never by their text (which holds the URL, and
    telebot puts the message text into the URL).
    """
    for item in _chain(exc):
        if isinstance(item, (urllib3.exceptions.NewConnectionError, ConnectionRefusedError, socket.gaierror)):
            return True
        if isinstance(item, urllib3.exceptions.ConnectTimeoutError):
            return True
        if isinstance(item, OSError) and item.errno in _NOT_SENT_ERRNOS:
            return True
    return False


def is_certificate_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or anything it was raised from) is a failed TLS certificate verification.

    Such a failure happens during the handshake, before any request is sent, and repeats until the
    configuration changes (the CA bundle, the server's certificate): retrying cannot fix it.
    """
    return any(isinstance(item, ssl.SSLCertVerificationError) for item in _chain(exc))


def classify(exc: BaseException, method: str | None = None) -> TelegramError:
    """Return the :class:`TelegramError` that says what ``exc`` means for the caller's next step.

    Accepts anything a Bot API call through telebot can raise: ``ApiTelegramException`` (Telegram
    answered ``ok: false``), ``ApiHTTPException`` / ``ApiInvalidJSONException`` (a non-JSON answer),
    ``requests`` errors, ``OSError``, the ``KeyError('ok')`` telebot raises for a JSON body without
    ``ok``, and a :class:`TelegramError` (returned as is). Never raises; unknown input is :class:`Fatal`.
    The returned error's text has every bot token masked.

    :class:`Transient` ("not sent") only for failures that certainly happened before the request
    left this machine: connection refused, name resolution, no route, a connect timeout. A TLS
    error (it may come while the answer is read), a read timeout, a dropped or reset connection, a
    broken answer and any 5xx (a gateway's 502/504 may come after the server acted) are
    :class:`Ambiguous`. A failed certificate verification is :class:`Fatal`: retrying cannot fix it.
    """
    if isinstance(exc, TelegramError):
        return exc
    method = method or getattr(exc, "function_name", None)
    if isinstance(exc, apihelper.ApiTelegramException):
        return _from_api_error(exc, method)
    if isinstance(exc, apihelper.ApiInvalidJSONException):
        # Telegram (or something in between) answered 200 with a body we cannot read: it may have acted.
        return Ambiguous("answer was not valid JSON", error_code=200, method=method)
    if isinstance(exc, apihelper.ApiHTTPException):
        result = getattr(exc, "result", None)
        status = getattr(result, "status_code", 0) or 0
        headers = getattr(result, "headers", {})
        return from_http_status(int(status), f"HTTP {status} without a JSON body", method, headers)
    text = mask_tokens(_chain_text(exc))
    if isinstance(exc, KeyError) and exc.args == ("ok",):
        return Ambiguous("answer was JSON without 'ok'", method=method)
    if type(exc) is OSError and str(exc).startswith("Could not find a suitable TLS CA certificate bundle"):
        # requests, before connecting: REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE names a path that is not there.
        return Fatal(f"the CA bundle cannot be used; fix or unset REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE: {text}",
                     method=method)
    if is_certificate_failure(exc):
        return Fatal(
            f"TLS certificate verification failed: the Bot API server's certificate is not trusted; set "
            f"REQUESTS_CA_BUNDLE (as for requests) to the CA bundle that signed it, or fix the server: {text}",
            method=method,
        )
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return Transient(f"connect timeout: {text}", method=method)
    if isinstance(exc, requests.exceptions.SSLError):
        return Ambiguous(f"TLS error (the request may have been carried out): {text}", method=method)
    if isinstance(exc, (requests.exceptions.Timeout, socket.timeout, TimeoutError)):
        return Ambiguous(f"timed out after sending: {text}", method=method)
    if isinstance(exc, requests.exceptions.ConnectionError):
        if _never_sent(exc):
            return Transient(f"connection failed: {text}", method=method)
        return Ambiguous(f"connection lost after sending: {text}", method=method)
    if isinstance(exc, requests.exceptions.ChunkedEncodingError):
        return Ambiguous(f"answer cut off: {text}", method=method)
    if isinstance(exc, (ConnectionRefusedError, socket.gaierror)) or (
        isinstance(exc, OSError) and exc.errno in _NOT_SENT_ERRNOS
    ):
        return Transient(f"connection failed: {text}", method=method)
    if isinstance(exc, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return Ambiguous(f"connection lost: {text}", method=method)
    if isinstance(exc, ssl.SSLError):
        return Ambiguous(f"TLS error (the request may have been carried out): {text}", method=method)
    if isinstance(exc, OSError):
        return Ambiguous(f"network error (the request may have been carried out): {text}", method=method)
    if isinstance(exc, http.client.HTTPException):  # a broken answer (the poller's own connection)
        return Ambiguous(f"broken answer: {text}", method=method)
    return Fatal(text, method=method)


_api_lock = threading.Lock()


@contextmanager
def api_server(api_url: str, file_url: str | None = None) -> Iterator[None]:
    """Point every telebot bot in this process at ``api_url`` (and ``file_url``) inside the block.

    ``api_url`` is a format string with ``{0}`` for the token and ``{1}`` for the method, e.g.
    ``"http://127.0.0.1:8081/bot{0}/{1}"``. The previous settings are restored on exit, also when
    the block raises. These are process-wide telebot globals: nest blocks, do not interleave them
    from several threads.
    """
    with _api_lock:
        previous = (apihelper.API_URL, apihelper.FILE_URL)
        apihelper.API_URL = api_url  # type: ignore[assignment]  # telebot declares these None
        if file_url is not None:
            apihelper.FILE_URL = file_url  # type: ignore[assignment]
    try:
        yield
    finally:
        with _api_lock:
            apihelper.API_URL, apihelper.FILE_URL = previous  # type: ignore[assignment]


def set_api_server(api_url: str | None, file_url: str | None = None) -> tuple[str | None, str | None]:
    """Set telebot's server URLs without a block; returns the previous ``(api_url, file_url)`` pair.

    Passing ``None`` restores telebot's default (api.telegram.org). Used by the fake server's
    ``install()``/``uninstall()``.
    """
    with _api_lock:
        previous = (apihelper.API_URL, apihelper.FILE_URL)
        apihelper.API_URL = api_url  # type: ignore[assignment]
        apihelper.FILE_URL = file_url  # type: ignore[assignment]
        return previous


#: The environment variable the command line and the examples read a Bot API server's URL from.
API_URL_ENV = "TELEGRAM_API_URL"


def api_url_formats(url: str) -> tuple[str, str | None]:
    """telebot's ``(API_URL, FILE_URL)`` format strings for a Bot API server given as ``url``.

    ``url`` is either telebot's own format (``http://host:port/bot{0}/{1}``: ``{0}`` the token,
    ``{1}`` the method) or a plain base URL (``http://host:port``, optionally with a path prefix),
    from which ``<base>/bot{0}/{1}`` and ``<base>/file/bot{0}/{1}`` are built. A format whose path
    does not end in ``/bot{0}/{1}`` gives no file URL (``None``: telebot's default stays). Raises
    :class:`ConfigurationError` for anything that is not an ``http(s)://host`` URL.
    """
    text = url.strip()
    parts = urllib.parse.urlsplit(text.replace("{0}", "TOKEN").replace("{1}", "METHOD"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"{url!r} is not a Bot API server URL; use http://host:port (or telebot's "
                                 "http://host:port/bot{0}/{1})")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise ConfigurationError(f"{url!r} has an invalid port") from None
    if "{0}" in text or "{1}" in text:
        if "{0}" not in text or "{1}" not in text:
            raise ConfigurationError(f"{url!r} needs both {{0}} (the token) and {{1}} (the method), or neither")
        suffix = "/bot{0}/{1}"
        file_url = text[: -len(suffix)] + "/file" + suffix if text.endswith(suffix) else None
        return text, file_url
    base = text.rstrip("/")
    return base + "/bot{0}/{1}", base + "/file/bot{0}/{1}"


def use_api_url(url: str | None = None, environ: Any = None) -> str | None:
    """Point telebot at ``url``, or at ``$TELEGRAM_API_URL`` when ``url`` is ``None``; return the API format used.

    Returns ``None`` and changes nothing when neither is given (telebot keeps api.telegram.org).
    Raises :class:`ConfigurationError` for a malformed URL (see :func:`api_url_formats`).
    Changes process-wide telebot settings: call it once, before the bots start.
    """
    if url is None:
        url = (environ if environ is not None else os.environ).get(API_URL_ENV) or None
    if url is None:
        return None
    api, file_url = api_url_formats(url)
    set_api_server(api, file_url)
    return api


def direct_polling_allowed() -> bool:
    """Whether :func:`get_updates` may use its own connection and still mean what telebot's call means.

    False when telebot is set up to send requests its own way (``apihelper.proxy``, a custom
    ``session`` or ``CUSTOM_REQUEST_SENDER``) or when the environment names a proxy: those calls
    go through telebot as before. Read when the poller starts.
    """
    if apihelper.proxy or getattr(apihelper, "session", None) is not None:
        return False
    if _foreign_sender(getattr(apihelper, "CUSTOM_REQUEST_SENDER", None)) is not None:
        return False
    return not any(scheme != "no" for scheme in urllib.request.getproxies())  # NO_PROXY alone names no proxy


def api_url(token: str, method: str) -> str:
    """The URL of ``method`` for ``token`` on the Bot API server telebot is pointed at (``apihelper.API_URL``)."""
    base = apihelper.API_URL or "https://api.telegram.org/bot{0}/{1}"
    return base.format(token, method)


def telebot_get_updates(
    token: str, offset: int, limit: int, long_poll_timeout: float, allowed_updates: Sequence[str] | None,
    read_timeout: float | None = None,
) -> Any:
    """``getUpdates`` through telebot's own request path (proxies, sessions, custom senders); raw JSON result.

    Raises the classified :class:`TelegramError` chained to telebot's exception.
    """
    try:
        return apihelper.get_updates(
            token,
            offset=offset if offset != 0 else None,
            limit=limit,
            timeout=max(long_poll_timeout + 10, read_timeout or 0),
            allowed_updates=list(allowed_updates) if allowed_updates is not None else None,
            long_polling_timeout=long_poll_timeout,
        )
    except Exception as exc:
        raise classify(exc, "getUpdates") from exc


def call(method: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` (a telebot API call) and translate any failure with :func:`classify`.

    Returns what ``fn`` returned. Raises the classified :class:`TelegramError` chained to the cause.
    """
    try:
        return fn(*args, **kwargs)
    except TelegramError:
        raise
    except Exception as exc:
        raise classify(exc, method) from exc


class Answer:
    """An HTTP answer of the Bot API as telebot reads it (``status_code``, ``reason``, ``text``, ``json()``,
    ``headers``).

    Made from a journaled answer, so a replayed call gives telebot the very bytes the server sent.
    Immutable; safe to share.
    """

    __slots__ = ("headers", "reason", "status_code", "text")

    def __init__(self, status_code: int, text: str) -> None:
        self.status_code = status_code
        self.text = text
        self.reason = http.client.responses.get(status_code, "")
        self.headers: dict[str, str] = {}

    def json(self) -> Any:
        """The body parsed as JSON; raises ``ValueError`` when it is not JSON (as ``requests`` does)."""
        return json.loads(self.text)

    @property
    def content(self) -> bytes:
        return self.text.encode("utf-8")


#: ``(http_method, url, params, files, timeout, proxies) -> answer``: how a request reaches the server.
Forward = Callable[[str, str, Any, Any, Any, Any], Any]
#: What :func:`install_request_sender` installs: ``sender(http_method, url, params, files, timeout, proxies,
#: forward)`` returns an answer (anything with ``status_code``, ``text`` and ``json()``); ``forward`` sends the
#: request the way telebot would have without it.
RequestSender = Callable[[str, str, Any, Any, Any, Any, Forward], Any]


class _Installed:
    """The function set as ``CUSTOM_REQUEST_SENDER`` while a fence runs; ``previous`` is what it replaced."""

    def __init__(self, sender: RequestSender, previous: Any) -> None:
        self.sender: RequestSender | None = sender
        self.previous = previous

    def __call__(self, method: str, url: str, params: Any = None, files: Any = None, timeout: Any = None,
                 proxies: Any = None) -> Any:
        sender = self.sender
        if sender is None:  # uninstalled while another sender wrapped this one: step aside
            return self._forward(method, url, params, files, timeout, proxies)
        return sender(method, url, params, files, timeout, proxies, self._forward)

    def _forward(self, method: str, url: str, params: Any, files: Any, timeout: Any, proxies: Any) -> Any:
        previous = self.previous
        if previous is not None:
            return previous(method, url, params=params, files=files, timeout=timeout, proxies=proxies)
        return apihelper._get_req_session().request(  # what telebot does without a custom sender
            method, url, params=params, files=files, timeout=timeout, proxies=proxies)


def _foreign_sender(sender: Any) -> Any:
    """The first request sender in the chain that is not one a fence installed (``None`` when there is none)."""
    while isinstance(sender, _Installed):
        sender = sender.previous
    return sender


def install_request_sender(sender: RequestSender) -> Callable[[], None]:
    """Route every telebot request of this process through ``sender``; return the function that undoes it.

    A sender telebot already had (the application's own ``CUSTOM_REQUEST_SENDER``) stays in the chain: it is
    what ``forward`` calls. Undoing restores the previous setting, or, when something was installed on top of
    this one since, leaves that in place and makes this one pass every request through. Telebot's
    ``RETRY_ON_ERROR`` does not apply to requests made through a custom sender. Safe from any thread.
    """
    with _api_lock:
        installed = _Installed(sender, apihelper.CUSTOM_REQUEST_SENDER)
        apihelper.CUSTOM_REQUEST_SENDER = installed  # type: ignore[assignment]  # telebot declares it None

    def undo() -> None:
        with _api_lock:
            if apihelper.CUSTOM_REQUEST_SENDER is installed:
                apihelper.CUSTOM_REQUEST_SENDER = installed.previous
            installed.sender = None

    return undo


def send_request(method: str, url: str, params: Any = None, files: Any = None, timeout: Any = None) -> Any:
    """Send a request the way telebot would without a fence: through the application's own
    ``CUSTOM_REQUEST_SENDER`` if it has one, else telebot's session; ``timeout`` defaults to telebot's.

    Returns the HTTP answer; raises what the HTTP layer raises (pass it to :func:`classify`).
    """
    if timeout is None:
        timeout = (apihelper.CONNECT_TIMEOUT, apihelper.READ_TIMEOUT)
    proxies = apihelper.proxy
    sender = _foreign_sender(apihelper.CUSTOM_REQUEST_SENDER)
    if sender is not None:
        return sender(method, url, params=params, files=files, timeout=timeout, proxies=proxies)
    return apihelper._get_req_session().request(method, url, params=params, files=files, timeout=timeout,
                                                proxies=proxies)


def method_of_url(url: str) -> str:
    """The Bot API method a telebot request URL names (its last path segment), e.g. ``sendMessage``."""
    path = urllib.parse.urlsplit(url).path
    return path.rstrip("/").rpartition("/")[2]
