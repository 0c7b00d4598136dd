"""The poller's own HTTP connection for ``getUpdates``: one kept-alive ``http.client`` connection, and the reading
of its answers.

:class:`LongPoll` lets a stop end a long poll in flight (:meth:`LongPoll.abort`); it is used only where it means the
same as telebot's call (:func:`telegram_fence.telegram.direct_polling_allowed`), else :func:`get_updates` goes
through telebot. An answer nesting too deep for Python's JSON reader (a hostile proxy) would stall every update
behind it: :func:`read_answer` reads it with what nests too deep cut out, an update that held such a value becoming
an :class:`~telegram_fence.updates.UnreadableUpdate` (its ``update_id`` alone, stored as an exhaustion)."""

from __future__ import annotations

import http.client
import json
import os
import re
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
from ..telegram import api_url, classify, from_answer, from_http_status, mask_tokens
from ..updates import UnreadableUpdate

__all__ = ["MAX_ANSWER_BYTES", "UNREADABLE_REASON", "LongPoll", "UpdateBatch", "get_updates",
           "read_answer", "unreadable_update"]

#: The largest getUpdates answer read (100 of Telegram's largest updates are far below it).
MAX_ANSWER_BYTES = 64 * 1024 * 1024


# A kept-alive connection the server closed while idle: the request never reached it, so it is sent again.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def _tls_context() -> ssl.SSLContext:
    """The trust ``requests`` uses: ``REQUESTS_CA_BUNDLE``, else ``CURL_CA_BUNDLE`` (a file or a directory), else
    certifi's bundle. :class:`~telegram_fence.errors.ConfigurationError` when the named bundle cannot be read."""
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        try:
            if os.path.isdir(bundle):
                return ssl.create_default_context(capath=bundle)
            return ssl.create_default_context(cafile=bundle)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"the CA bundle named by REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE "
                                     f"({mask_tokens(bundle)!r}) cannot be used: {exc.strerror or exc}; point it at a "
                                     "readable PEM file or directory, or unset it") from None
    import certifi  # requests depends on it

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

    def get(self, url: str, timeout: float) -> tuple[int, bytes, Any]:
        """``GET url``: ``(status, body, headers)`` whatever the status; ``timeout`` bounds each wait once connected.
        Raises ``OSError``, ``http.client.HTTPException`` or ``ValueError`` (above :data:`MAX_ANSWER_BYTES`), the
        connection closed then; ``ConnectionAbortedError`` after :meth:`abort`."""
        if self._aborted:
            raise ConnectionAbortedError("the long poll was aborted: the poller is stopping")
        parts = urlsplit(url)
        target = parts.path + ("?" + parts.query if parts.query else "")
        origin = (parts.scheme, parts.hostname or "", parts.port)
        reused = self._conn is not None and origin == self._origin
        if not reused:
            self.close()
        try:
            return self._get(origin, target, timeout)
        except _STALE:
            self.close()
            if not reused or self._aborted:
                raise
        return self._get(origin, target, timeout)

    def _get(self, origin: tuple[str, str, int | None], target: str, timeout: float) -> tuple[int, bytes, Any]:
        conn = self._conn or self._open(origin)
        try:
            if conn.sock is None:
                conn.connect()
                self._track(conn.sock)  # the TLS socket wraps (and replaces) the one _connect tracked
            conn.sock.settimeout(timeout)
            conn.request("GET", target, headers={"Accept": "application/json"})
            response = conn.getresponse()
            body = response.read(MAX_ANSWER_BYTES + 1)
            if len(body) > MAX_ANSWER_BYTES:
                raise ValueError(f"the answer is larger than {MAX_ANSWER_BYTES} bytes; no Bot API answer is that "
                                 "large, so something between here and the Bot API server is broken or hostile")
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
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, port, timeout=self._connect_timeout,
                                                                           context=self._tls)
        elif scheme == "http":
            conn = http.client.HTTPConnection(host, port, timeout=self._connect_timeout)
        else:
            raise ValueError(f"the Bot API address must be http:// or https://, not {scheme!r}")
        conn._create_connection = self._connect  # type: ignore[attr-defined]
        self._conn, self._origin = conn, origin
        return conn

    def _connect(self, address: tuple[str, int], timeout: Any = None, source_address: Any = None) -> socket.socket:
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
        """End the call in progress (it raises in its thread: nothing it read is returned) and refuse every later
        call. Safe from any thread; never raises."""
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
    """The updates of one ``getUpdates`` answer, with the answer's bytes as ``body`` (the store reads the payloads
    there instead of encoding the dicts again)."""

    def __init__(self, updates: list[dict[str, Any]], body: bytes) -> None:
        super().__init__(updates)
        self.body = body


def get_updates(token: str, offset: int, *, limit: int = 100, long_poll_timeout: float = 25,
                allowed_updates: Sequence[str] | None = None, connection: LongPoll | None = None,
                read_timeout: float | None = None) -> list[dict[str, Any]]:
    """One ``getUpdates`` call: the raw update dicts as Telegram sent them (an :class:`UpdateBatch` over
    ``connection``, else through telebot). ``offset`` confirms every update below it (0: none yet; -1: only the
    newest is answered, every one before it forgotten). Each wait is bounded by ``max(long_poll_timeout + 10,
    read_timeout)`` s. Raises the classified :class:`TelegramError`, chained to the original exception."""
    method = "getUpdates"
    if connection is None:
        result = _telebot_get_updates(token, offset, limit, long_poll_timeout, allowed_updates, read_timeout)
    else:  # the same request and the same errors as telebot's call
        params: dict[str, Any] = {"limit": limit, "timeout": long_poll_timeout}
        if offset != 0:
            params["offset"] = offset
        if allowed_updates is not None:
            params["allowed_updates"] = json.dumps(list(allowed_updates))
        url = api_url(token, method) + "?" + urllib.parse.urlencode(params)
        try:
            status, body, headers = connection.get(url, max(long_poll_timeout + 10, read_timeout or 0))
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
            return UpdateBatch(result, body)  # (not when it holds what could not be read: that is never stored)
    if not isinstance(result, list):
        raise Ambiguous(f"getUpdates answered {type(result).__name__}, not a list", method=method)
    return result


def _result_of(answer: Any, method: str) -> Any:
    if not isinstance(answer, dict) or "ok" not in answer:
        raise Ambiguous("answer was JSON without 'ok'", method=method)
    if not answer["ok"]:
        raise from_answer(answer.get("error_code"), answer.get("description", ""), answer, method)
    return answer.get("result")


def _telebot_get_updates(token: str, offset: int, limit: int, long_poll_timeout: float,
                         allowed_updates: Sequence[str] | None, read_timeout: float | None) -> Any:
    """Through telebot's own request path; an answer it could not read because it nests too deep is read again
    from its bytes."""
    try:
        return apihelper.get_updates(
            token, offset=offset if offset != 0 else None, limit=limit,
            timeout=max(long_poll_timeout + 10, read_timeout or 0), long_polling_timeout=long_poll_timeout,
            allowed_updates=list(allowed_updates) if allowed_updates is not None else None)
    except Exception as raw:
        error = classify(raw, "getUpdates")
        response = getattr(raw, "result", None)
        if not isinstance(raw, apihelper.ApiInvalidJSONException) or response is None:
            raise error from raw
        try:
            answer = read_answer(response.content)
        except (ValueError, AttributeError, TypeError):
            raise error from raw
        return _result_of(answer, "getUpdates")


UNREADABLE_REASON = "the update nests too deep to be read as JSON; its payload was not stored"

# A JSON string (escapes included) or one bracket: what matters for finding where a value ends.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_MAX_DEPTH = 500  # values nested deeper are cut out: far beyond any update, within Python's reader
_DEEP = f"(too deep {os.urandom(8).hex()})"  # what stands for a value cut out (random: no real text holds it)


def read_answer(body: bytes | str) -> Any:
    """``body`` as Python's JSON reader reads it, or, too deep for it, with each update too deep to read an
    :class:`~telegram_fence.updates.UnreadableUpdate` (``None`` without a readable ``update_id``). Raises
    ``ValueError`` for a body that is not JSON, or too deep outside ``result``'s items."""
    try:
        return json.loads(body)
    except RecursionError:
        pass
    answer = _read_flat(body.decode("utf-8") if isinstance(body, bytes) else body)
    if not isinstance(answer, dict):
        raise ValueError("the answer nests too deep to be read and is not a JSON object")
    items = answer.get("result") if isinstance(answer.get("result"), list) else None
    if _DEEP in json.dumps({key: value for key, value in answer.items() if key != "result" or items is None}):
        raise ValueError("the answer nests too deep to be read outside its updates")
    if items is not None:
        answer["result"] = [_unreadable(item) if _DEEP in json.dumps(item) else item for item in items]
    return answer


def unreadable_update(item: str) -> UnreadableUpdate | None:
    """The :class:`~telegram_fence.updates.UnreadableUpdate` for ``item``, one update's JSON too deep to read: its
    top-level ``update_id`` read alone (``None`` without a non-negative integer one). ``ValueError`` for text that is
    not JSON around what nests too deep."""
    return _unreadable(_read_flat(item))


def _unreadable(value: Any) -> UnreadableUpdate | None:
    update_id = value.get("update_id") if isinstance(value, dict) else None
    return UnreadableUpdate(update_id, UNREADABLE_REASON) if type(update_id) is int and update_id >= 0 else None


def _read_flat(text: str) -> Any:
    """``text`` read with every value nested deeper than :data:`_MAX_DEPTH` read as the string :data:`_DEEP`;
    ``ValueError`` when it is not JSON (a bracket never closed)."""
    parts: list[str] = []
    depth = kept = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth == _MAX_DEPTH + 1:
                parts.append(text[kept:match.start()])
        elif token in ("]", "}"):
            if depth == _MAX_DEPTH + 1:
                parts.append(json.dumps(_DEEP))
                kept = match.end()
            depth -= 1
    if depth > 0:
        raise ValueError("the JSON text is cut short")
    return json.loads("".join(parts) + text[kept:])
