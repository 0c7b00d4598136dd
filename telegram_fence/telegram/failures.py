"""What a failed Bot API call means: :func:`classify` turns any exception from a call into one (token-masked)
:class:`~telegram_fence.errors.TelegramError`. The one module that reads telebot's exceptions."""

from __future__ import annotations

import errno
import http.client
import math
import socket
import ssl
from collections.abc import Iterator
from contextlib import suppress
from itertools import islice
from typing import Any

import requests
import urllib3.exceptions
from telebot import apihelper

from ..errors import (
    Ambiguous,
    Conflict,
    Fatal,
    MessageRefused,
    RecipientGone,
    RetryAfter,
    TelegramError,
    Transient,
    Unauthorized,
)
from .masking import mask_tokens

__all__ = ["call", "classify", "from_answer", "from_http_status", "is_certificate_failure", "never_left",
           "retry_after_of"]

# 400 descriptions that mean the *recipient* is the problem, not the message.
_GONE_400 = (
    "chat not found", "user not found", "peer_id_invalid", "group chat was upgraded", "chat_write_forbidden",
    "bot was kicked", "user is deactivated", "have no rights to send", "not enough rights to send",
    "need administrator rights",
)

# errno values of a connection that never got to send: refused, no route, no address.
_NOT_SENT_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ECONNREFUSED", "ENETUNREACH", "EHOSTUNREACH", "EADDRNOTAVAIL", "ENETDOWN")
    if hasattr(errno, name)
)


def retry_after_of(result_json: Any) -> float:
    """An answer's ``retry_after`` in seconds >= 0 (it may be infinite); 1.0 when missing or not a number."""
    try:
        seconds = float(result_json["parameters"]["retry_after"])
    except (KeyError, TypeError, ValueError, OverflowError):
        return 1.0
    return 1.0 if math.isnan(seconds) else max(0.0, seconds)


def from_answer(code: Any, description: Any, result_json: Any, method: str | None) -> TelegramError:
    """The error for an ``ok: false`` answer with ``error_code`` ``code``."""
    description = mask_tokens(str(description))
    text = description.lower()
    kw: dict[str, Any] = {"error_code": code, "method": method}
    if code == 429:
        return RetryAfter(retry_after_of(result_json), description, **kw)
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
    """The error for an HTTP ``status`` without a Bot API answer (``Retry-After`` read from ``headers``)."""
    if status == 408:  # the server gave up waiting for the request itself: it was not handled
        return Transient(description, error_code=status, method=method)
    if status in (401, 409, 429) or 500 <= status < 600:  # a gateway's 5xx may come after the server acted
        retry_after = None
        with suppress(AttributeError):
            retry_after = headers.get("Retry-After", 1)
        return from_answer(status, description, {"parameters": {"retry_after": retry_after}}, method)
    return Fatal(description, error_code=status, method=method)


def causes(error: BaseException, *, context: bool) -> Iterator[BaseException]:
    """``error`` and what it was raised from (every ``__cause__``; with ``context``, every ``__context__`` too)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (current.__context__ if context else None)


def _chain_text(exc: BaseException) -> str:
    """``exc`` and the exceptions it wraps as one line, each text told once: a wrapped exception whose text an
    outer one already quotes is left out, except the innermost (the root cause)."""
    chain = list(islice(causes(exc, context=True), 8))
    parts: list[str] = []
    texts: list[str] = []
    for position, item in enumerate(chain):
        text = str(item)
        innermost = position == len(chain) - 1
        if innermost or not text or not any(text in earlier for earlier in texts):
            parts.append(f"{type(item).__name__}: {text}")
            texts.append(text)
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
    """Whether ``exc`` shows no connection was made (by types and errno, never by text: it holds the URL)."""
    never = (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError, ConnectionRefusedError,
             socket.gaierror)
    return any(isinstance(item, never) or (isinstance(item, OSError) and item.errno in _NOT_SENT_ERRNOS)
               for item in _chain(exc))


def is_certificate_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or anything it was raised from) is a failed TLS certificate verification: before any
    request is sent, and repeated until the configuration changes."""
    return any(isinstance(item, ssl.SSLCertVerificationError) for item in _chain(exc))


def never_left(exc: BaseException) -> bool:
    """Whether the request that failed with ``exc`` certainly never left: :class:`Transient`, a rejected
    certificate, or no CA bundle. Never raises."""
    if is_certificate_failure(exc) or _no_ca_bundle(exc):
        return True
    return isinstance(classify(exc), Transient)


def _no_ca_bundle(exc: BaseException) -> bool:
    return type(exc) is OSError and str(exc).startswith("Could not find a suitable TLS CA certificate bundle")


def classify(exc: BaseException, method: str | None = None) -> TelegramError:
    """The token-masked :class:`TelegramError` that says what ``exc`` (anything a telebot call raises) means; never
    raises. :class:`Transient` only when the request certainly never left; a TLS error, a read timeout, a lost
    connection, a broken answer and any 5xx are :class:`Ambiguous`; a rejected certificate or anything else Fatal."""
    if isinstance(exc, TelegramError):
        return exc
    method = method or getattr(exc, "function_name", None)
    if isinstance(exc, apihelper.ApiTelegramException):
        return from_answer(exc.error_code, exc.description, exc.result_json, method)
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
    if _no_ca_bundle(exc):
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
    if isinstance(exc, (requests.exceptions.SSLError, ssl.SSLError)):
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
    if isinstance(exc, OSError):
        return Ambiguous(f"network error (the request may have been carried out): {text}", method=method)
    if isinstance(exc, http.client.HTTPException):  # a broken answer (the poller's own connection)
        return Ambiguous(f"broken answer: {text}", method=method)
    return Fatal(text, method=method)


def call(method: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` (a telebot call); a failure is raised as :func:`classify` says, chained to it."""
    try:
        return fn(*args, **kwargs)
    except TelegramError:
        raise
    except Exception as exc:
        raise classify(exc, method) from exc
