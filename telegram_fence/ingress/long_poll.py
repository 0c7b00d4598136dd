"""The poller's own HTTP connection for ``getUpdates``: one kept-alive ``http.client`` connection.

telebot sends every call through ``requests``, which costs about 0.6 ms of interpreter time per
call here (sessions, adapters, proxy lookups, header parsing) before the answer is even read; the
poller makes one call per batch of up to 100 updates, and with fast handlers that time was the
largest single cost of a fenced bot. A plain connection does the same request in about a third of that.

It is used only where it means the same as telebot's own call (see
:func:`telegram_fence.telegram.direct_polling_allowed`): no proxy, no custom request sender or
session configured in telebot. Everything else still goes through telebot.

:func:`get_updates` is the raw ``getUpdates`` call the poller makes (JSON dicts, not parsed types), over a
:class:`LongPoll` or through telebot.

A :class:`LongPoll` belongs to one thread (the poller's); it is not safe to share, except for
:meth:`LongPoll.abort`, which any thread may call to end the call in progress (a stop does not wait
out a 25 s long poll). telebot's path cannot be interrupted that way: a stop leaves its call to
run out (at most the long-poll timeout + 10 s) on a thread that records nothing afterwards.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Sequence
from contextlib import suppress
from typing import Any
from urllib.parse import urlsplit

from telebot import apihelper

from ..errors import Ambiguous, ConfigurationError
from ..telegram import api_url, classify, from_answer, from_http_status, mask_tokens, telebot_get_updates
from ..updates import UnreadableUpdate
from .answers import read_answer

__all__ = ["MAX_ANSWER_BYTES", "AnswerTooLarge", "LongPoll", "UpdateBatch", "ca_bundle", "get_updates"]

#: The largest getUpdates answer read (100 updates of Telegram's largest are far below it). A bigger one
#: comes from something broken or hostile in between; reading it whole could exhaust the memory.
MAX_ANSWER_BYTES = 64 * 1024 * 1024


class AnswerTooLarge(ValueError):
    """An answer exceeded the size :meth:`LongPoll.get` was allowed to read."""


# Errors of a kept-alive connection that the server closed while it sat idle: the request never
# reached it, so sending it again on a new connection is safe (getUpdates is idempotent anyway).
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def ca_bundle() -> str | None:
    """The CA bundle ``requests`` (and so telebot) verifies with when its session trusts the environment:
    ``REQUESTS_CA_BUNDLE``, else ``CURL_CA_BUNDLE``, else ``None`` (its default, certifi's bundle)."""
    return os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or None


def _tls_context() -> ssl.SSLContext:
    """The trust ``requests`` uses: the CA bundle the environment names (a file or a directory, in
    requests' precedence), else certifi's bundle when installed, else the system's.

    Raises :class:`~telegram_fence.errors.ConfigurationError` when the named bundle cannot be read.
    """
    bundle = ca_bundle()
    if bundle is not None:
        try:
            if os.path.isdir(bundle):
                return ssl.create_default_context(capath=bundle)
            return ssl.create_default_context(cafile=bundle)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(
                f"the CA bundle named by REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE ({mask_tokens(bundle)!r}) cannot be "
                f"used: {exc.strerror or exc}; point it at a readable PEM file or directory, or unset it"
            ) from None
    try:
        import certifi
    except ImportError:  # pragma: no cover - requests depends on certifi
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


class LongPoll:
    """``GET`` requests over one reused connection; reconnects when the address or the connection changes."""

    def __init__(self, connect_timeout: float = 15.0) -> None:
        self._connect_timeout = connect_timeout
        self._conn: http.client.HTTPConnection | None = None
        self._origin: tuple[str, str, int | None] | None = None
        self._tls: ssl.SSLContext | None = None
        # abort() may come from another thread: it shuts down the socket in use, under this lock.
        self._abort_lock = threading.Lock()
        self._aborted = False
        self._sockets: list[socket.socket] = []

    def get(self, url: str, timeout: float, max_bytes: int | None = None) -> tuple[int, bytes, Any]:
        """``GET url``; returns ``(status, body, headers)`` whatever the status.

        ``timeout`` bounds each wait for the server once connected. Raises ``OSError`` (refused,
        reset, timed out) or ``http.client.HTTPException`` (a broken answer), and
        :class:`AnswerTooLarge` when the body exceeds ``max_bytes``; the connection is closed
        then, and the next call opens a new one. A request that fails on a reused connection
        before any answer is sent once more on a new connection. After :meth:`abort` every call
        raises ``ConnectionAbortedError``.
        """
        if self._aborted:
            raise ConnectionAbortedError("the long poll was aborted: the poller is stopping")
        parts = urlsplit(url)
        target = parts.path + ("?" + parts.query if parts.query else "")
        origin = (parts.scheme, parts.hostname or "", parts.port)
        reused = self._conn is not None and origin == self._origin
        if not reused:
            self.close()
        try:
            return self._get(origin, target, timeout, max_bytes)
        except _STALE:
            self.close()
            if not reused or self._aborted:
                raise
        return self._get(origin, target, timeout, max_bytes)

    def _get(
        self, origin: tuple[str, str, int | None], target: str, timeout: float, max_bytes: int | None
    ) -> tuple[int, bytes, Any]:
        conn = self._conn or self._open(origin)
        try:
            if conn.sock is None:
                conn.connect()
                self._track(conn.sock)  # the TLS socket wraps (and replaces) the one _connect tracked
            conn.sock.settimeout(timeout)
            conn.request("GET", target, headers={"Accept": "application/json"})
            response = conn.getresponse()
            body = response.read() if max_bytes is None else response.read(max_bytes + 1)
            if max_bytes is not None and len(body) > max_bytes:
                raise AnswerTooLarge(
                    f"the answer is larger than {max_bytes} bytes; no Bot API answer is that large, so something "
                    "between here and the Bot API server is broken or hostile"
                )
        except BaseException:
            self.close()
            raise
        if response.will_close:
            self.close()
        return response.status, body, response.headers

    def _open(self, origin: tuple[str, str, int | None]) -> http.client.HTTPConnection:
        scheme, host, port = origin
        if scheme == "https":
            if self._tls is None:
                self._tls = _tls_context()
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=self._connect_timeout, context=self._tls
            )
        elif scheme == "http":
            conn = http.client.HTTPConnection(host, port, timeout=self._connect_timeout)
        else:
            raise ValueError(f"the Bot API address must be http:// or https://, not {scheme!r}")
        conn._create_connection = self._connect  # type: ignore[attr-defined]
        self._conn, self._origin = conn, origin
        return conn

    def _connect(
        self, address: tuple[str, int], timeout: Any = None, source_address: Any = None
    ) -> socket.socket:
        """Open a TCP connection to ``address`` with its socket known to :meth:`abort` before it connects."""
        host, port = address
        error: OSError | None = None
        for family, kind, proto, _, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                self._track(sock)
                if isinstance(timeout, (int, float)):
                    sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                error = exc
                sock.close()
        raise error or OSError(f"getaddrinfo returned nothing for {host}")

    def _track(self, sock: socket.socket | None) -> None:
        """Remember ``sock`` as the one :meth:`abort` shuts down; raises when an abort came first."""
        with self._abort_lock:
            if self._aborted:
                raise ConnectionAbortedError("the long poll was aborted: the poller is stopping")
            self._sockets = [sock] if sock is not None else []

    def abort(self) -> None:
        """End the call in progress, if any, and refuse every later call. Safe from any thread; never raises.

        The call in progress raises ``OSError`` (or ``http.client.HTTPException``) in its own thread:
        what it was reading is never returned, so nothing of it can be recorded or confirmed.
        """
        with self._abort_lock:
            self._aborted = True
            sockets, self._sockets = self._sockets, []
            for sock in sockets:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the connection (the next call opens a new one). Never raises."""
        conn, self._conn = self._conn, None
        with self._abort_lock:
            self._sockets = []
        if conn is not None:
            with suppress(OSError):
                conn.close()


class UpdateBatch(list):  # type: ignore[type-arg]
    """The updates of one ``getUpdates`` answer (a list of dicts), with the answer's bytes as ``body``.

    The store can take the payloads from ``body`` instead of encoding the dicts again.
    """

    def __init__(self, updates: list[dict[str, Any]], body: bytes) -> None:
        super().__init__(updates)
        self.body = body


def get_updates(
    token: str,
    offset: int,
    *,
    limit: int = 100,
    long_poll_timeout: float = 25,
    allowed_updates: Sequence[str] | None = None,
    connection: LongPoll | None = None,
    read_timeout: float | None = None,
) -> list[dict[str, Any]]:
    """One ``getUpdates`` call; returns the raw update dicts exactly as Telegram sent them.

    ``offset`` confirms every update below it (0 means "no offset yet"; -1 asks for the newest update only and
    makes Telegram forget every one before it). Each wait for the answer is bounded by
    ``max(long_poll_timeout + 10, read_timeout)`` seconds. With ``connection`` the
    call goes over it (see :mod:`telegram_fence.ingress.long_poll`; use it only where
    :func:`direct_polling_allowed`) and the list is an :class:`UpdateBatch` that keeps the
    answer's bytes; otherwise the call goes through telebot. On failure raises the
    :class:`TelegramError` from :func:`classify`, chained to the original exception.
    """
    if connection is not None:
        result = _get_updates_direct(connection, token, offset, limit, long_poll_timeout, allowed_updates,
                                     read_timeout)
    else:
        result = _telebot_get_updates(token, offset, limit, long_poll_timeout, allowed_updates, read_timeout)
    if not isinstance(result, list):
        raise Ambiguous(f"getUpdates answered {type(result).__name__}, not a list", method="getUpdates")
    return result


def _get_updates_direct(
    connection: LongPoll,
    token: str,
    offset: int,
    limit: int,
    long_poll_timeout: float,
    allowed_updates: Sequence[str] | None,
    read_timeout: float | None = None,
) -> Any:
    """:func:`get_updates` over ``connection``: the same request and the same errors as telebot's call."""
    params: dict[str, Any] = {"limit": limit, "timeout": long_poll_timeout}
    if offset != 0:
        params["offset"] = offset
    if allowed_updates is not None:
        params["allowed_updates"] = json.dumps(list(allowed_updates))
    url = api_url(token, "getUpdates") + "?" + urllib.parse.urlencode(params)
    method = "getUpdates"
    try:
        status, body, headers = connection.get(url, max(long_poll_timeout + 10, read_timeout or 0),
                                               MAX_ANSWER_BYTES)
    except Exception as exc:
        raise classify(exc, method) from exc
    try:
        answer = read_answer(body)
    except ValueError:
        if status != 200:
            raise from_http_status(status, f"HTTP {status} without a JSON body", method, headers) from None
        raise Ambiguous("answer was not valid JSON", error_code=200, method=method) from None
    result = _result_of(answer, method)
    if isinstance(result, list) and not any(isinstance(item, UnreadableUpdate) for item in result):
        return UpdateBatch(result, body)
    return result  # without the bytes: they hold what could not be read, which must not be stored


def _result_of(answer: Any, method: str) -> Any:
    """The ``result`` of a parsed answer; raises the classified error of an ``ok: false`` one."""
    if not isinstance(answer, dict) or "ok" not in answer:
        raise Ambiguous("answer was JSON without 'ok'", method=method)
    if not answer["ok"]:
        raise from_answer(answer.get("error_code"), answer.get("description", ""), answer, method)
    return answer.get("result")


def _telebot_get_updates(
    token: str, offset: int, limit: int, long_poll_timeout: float, allowed_updates: Sequence[str] | None,
    read_timeout: float | None = None,
) -> Any:
    """:func:`get_updates` through telebot. An answer telebot could not read because it nests too deep is
    read again from the bytes telebot kept (see :func:`~telegram_fence.ingress.answers.read_answer`)."""
    try:
        return telebot_get_updates(token, offset, limit, long_poll_timeout, allowed_updates, read_timeout)
    except Ambiguous as exc:
        response = getattr(exc.__cause__, "result", None)
        if not isinstance(exc.__cause__, apihelper.ApiInvalidJSONException) or response is None:
            raise
        try:
            answer = read_answer(response.content)
        except (ValueError, AttributeError, TypeError):
            raise exc from exc.__cause__
        return _result_of(answer, "getUpdates")
