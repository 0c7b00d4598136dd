"""The poller's own HTTP connection for ``getUpdates``: one kept-alive ``http.client`` connection, and the reading
of its answers.

:class:`LongPoll` lets a stop end a long poll in flight (:meth:`LongPoll.abort`); it is used only where it means the
same as telebot's call (:func:`telegram_fence.telegram.direct_polling_allowed`), else :func:`get_updates` goes
through telebot. An answer nesting too deep for Python's JSON reader (a hostile proxy) would stall every update
behind it: :func:`read_answer` reads it item by item, an update too deep to read becoming an
:class:`~telegram_fence.updates.UnreadableUpdate` (its ``update_id`` alone, stored as an exhaustion).
"""

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
from ..telegram import api_url, classify, from_answer, from_http_status, mask_tokens, telebot_get_updates
from ..updates import UnreadableUpdate

__all__ = ["MAX_ANSWER_BYTES", "UNREADABLE_REASON", "AnswerTooLarge", "LongPoll", "UpdateBatch", "get_updates",
           "read_answer", "unreadable_update"]

#: The largest getUpdates answer read (100 of Telegram's largest updates are far below it).
MAX_ANSWER_BYTES = 64 * 1024 * 1024


class AnswerTooLarge(ValueError):
    """An answer exceeded the size :meth:`LongPoll.get` was allowed to read."""


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

    def get(self, url: str, timeout: float, max_bytes: int | None = None) -> tuple[int, bytes, Any]:
        """``GET url``: ``(status, body, headers)`` whatever the status; ``timeout`` bounds each wait once connected.
        Raises ``OSError``, ``http.client.HTTPException`` or :class:`AnswerTooLarge` (above ``max_bytes``), the
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
            return self._get(origin, target, timeout, max_bytes)
        except _STALE:
            self.close()
            if not reused or self._aborted:
                raise
        return self._get(origin, target, timeout, max_bytes)

    def _get(self, origin: tuple[str, str, int | None], target: str, timeout: float,
             max_bytes: int | None) -> tuple[int, bytes, Any]:
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
                raise AnswerTooLarge(f"the answer is larger than {max_bytes} bytes; no Bot API answer is that large, "
                                     "so something between here and the Bot API server is broken or hostile")
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
    """Through telebot; an answer it could not read because it nests too deep is read again from its bytes."""
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


UNREADABLE_REASON = "the update nests too deep to be read as JSON; its payload was not stored"

# A JSON string (escapes included) or one bracket: what matters for finding where a value ends.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SCALAR_END = re.compile(r"[,\]} \t\n\r]")

Member = tuple[Any, int, int]  # (key, or None in an array; start of the value; end of the value)


def read_answer(body: bytes | str) -> Any:
    """``body`` as Python's JSON reader reads it, or, too deep for it, item by item: an update too deep to read is
    an :class:`~telegram_fence.updates.UnreadableUpdate` (``None`` without a readable ``update_id``). Raises
    ``ValueError`` for a body that is not JSON or too deep outside ``result``'s items."""
    try:
        return json.loads(body)
    except RecursionError:
        pass
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    try:
        return _read_by_items(text)
    except (IndexError, RecursionError):
        raise ValueError("the answer nests too deep to be read and is not a readable getUpdates answer") from None


def _read_by_items(text: str) -> dict[str, Any]:
    start = _skip(text, 0)
    if text[start] != "{":
        raise ValueError("the answer nests too deep to be read and is not a JSON object")
    members, end = _members(text, start)
    if _skip(text, end) != len(text):
        raise ValueError("extra data after the answer")
    answer: dict[str, Any] = {}
    for key, first, last in members:  # a key given twice: the last one counts, as for Python's reader
        if key == "result" and text[first] == "[":
            items, _end = _members(text, first)
            answer[key] = [_read_item(text[a:b]) for _key, a, b in items]
        else:
            answer[key] = json.loads(text[first:last])
    return answer


def _read_item(item: str) -> Any:
    try:
        return json.loads(item)
    except RecursionError:
        return unreadable_update(item)


def unreadable_update(item: str) -> UnreadableUpdate | None:
    """The :class:`~telegram_fence.updates.UnreadableUpdate` for ``item``, one update's JSON too deep to read: its
    top-level ``update_id`` read alone (``None`` without a non-negative integer one). ``ValueError`` for text
    malformed around its top level."""
    update_id = None
    start = _skip(item, 0)
    try:
        if item[start:start + 1] == "{":
            for key, first, last in _members(item, start)[0]:
                if key == "update_id":  # a key given twice: the last one counts, as for Python's reader
                    try:
                        update_id = json.loads(item[first:last])
                    except RecursionError:
                        update_id = None
    except IndexError:
        raise ValueError("the update is cut short") from None
    if type(update_id) is not int or update_id < 0:
        return None
    return UnreadableUpdate(update_id, UNREADABLE_REASON)


def _skip(text: str, index: int) -> int:
    match = _WHITESPACE.match(text, index)
    return match.end() if match else index


def _members(text: str, start: int) -> tuple[list[Member], int]:
    """The members of the object or array opening at ``start`` (nested values skipped, not read), and the index
    just after it. ``ValueError`` (``IndexError`` at the end of the text) when it is malformed."""
    closer = "}" if text[start] == "{" else "]"
    index = _skip(text, start + 1)
    members: list[Member] = []
    if text[index] == closer:
        return members, index + 1
    while True:
        key: Any = None
        if closer == "}":
            match = _STRING.match(text, index)
            if match is None:
                raise ValueError(f"expected a key at character {index}")
            key = json.loads(match.group())
            index = _skip(text, match.end())
            if text[index] != ":":
                raise ValueError(f"expected ':' at character {index}")
            index = _skip(text, index + 1)
        end = _value_end(text, index)
        members.append((key, index, end))
        index = _skip(text, end)
        if text[index] == ",":
            index = _skip(text, index + 1)
        elif text[index] == closer:
            return members, index + 1
        else:
            raise ValueError(f"expected ',' or {closer!r} at character {index}")


def _value_end(text: str, start: int) -> int:
    first = text[start]
    if first == '"':
        match = _STRING.match(text, start)
        if match is None:
            raise ValueError(f"unterminated string at character {start}")
        return match.end()
    if first not in "[{":
        match = _SCALAR_END.search(text, start)
        end = match.start() if match else len(text)
        if end == start:
            raise ValueError(f"expected a value at character {start}")
        return end
    depth = 0
    for match in _TOKEN.finditer(text, start):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
        elif token in ("]", "}"):
            depth -= 1
            if depth == 0:
                return match.end()
    raise ValueError(f"unterminated value at character {start}")
