"""A real HTTP fake of the Telegram Bot API, for tests, benchmarks and the demo.

:class:`FakeBotAPI` listens on ``127.0.0.1`` and answers the way Telegram does: ``getUpdates`` with offset
confirmation and long polling, ``409 Conflict`` for a second poller or a set webhook, the send methods with
Telegram's own refusals (too long, bad entities, chat not found, blocked, deactivated, bad token), and
scriptable faults (errors, dropped connections, delays, non-JSON answers, a rate limiter). The real telebot
client talks to it over HTTP once :meth:`FakeBotAPI.install` pointed telebot at it::

    with FakeBotAPI() as api:
        bot = telebot.TeleBot(api.token, threaded=False)
        api.push_message(42, "/start")
        ...
        assert api.wait_sent(1)

Where the fake picks one of Telegram's behaviours: a second *concurrent* ``getUpdates`` gets the 409, unless
the client of the running one has hung up (a killed or timed-out bot), in which case the new one takes over,
so a restarted bot is not locked out by its dead predecessor. Every public method is safe to call from any
thread while the server runs.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import select
import socket
import string
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..errors import ConfigurationError
from ..telegram import set_api_server

__all__ = ["Call", "FakeBotAPI", "Sent", "UploadedFile"]

#: Update types Telegram sends when ``allowed_updates`` is empty or was never given.
_DEFAULT_ALLOWED = frozenset(
    {
        "message",
        "edited_message",
        "channel_post",
        "edited_channel_post",
        "business_connection",
        "business_message",
        "edited_business_message",
        "deleted_business_messages",
        "inline_query",
        "chosen_inline_result",
        "callback_query",
        "shipping_query",
        "pre_checkout_query",
        "purchased_paid_media",
        "poll",
        "poll_answer",
        "my_chat_member",
        "chat_join_request",
        "chat_boost",
        "removed_chat_boost",
    }
)

#: Methods the rate limiter counts (messages that reach a chat).
_SEND_METHODS = frozenset(
    {"sendmessage", "sendphoto", "senddocument", "editmessagetext", "copymessage", "forwardmessage"}
)

#: The methods the fake answers, in Telegram's spelling (requests match them case-insensitively).
_METHOD_NAMES = (
    "getUpdates",
    "getMe",
    "sendMessage",
    "sendPhoto",
    "sendDocument",
    "editMessageText",
    "answerCallbackQuery",
    "sendChatAction",
    "getFile",
    "setWebhook",
    "deleteWebhook",
    "getWebhookInfo",
    "setMyCommands",
    "getMyCommands",
    "deleteMessage",
    "logOut",
    "close",
)

_MAX_TEXT = 4096
_MAX_CAPTION = 1024

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}

_TOKEN_ALPHABET = string.ascii_letters + string.digits + "_-"


@dataclass(frozen=True)
class UploadedFile:
    """A file part of a multipart request, as the fake server received it."""

    field: str
    filename: str | None
    content: bytes
    content_type: str | None = None


@dataclass(frozen=True)
class Call:
    """One HTTP request the fake server received (any method, also refused or faulted ones).

    ``params`` merges the query string and the body; uploaded files appear as :class:`UploadedFile`.
    ``time`` is ``time.time()`` when the request arrived.
    """

    method: str
    params: dict[str, Any]
    time: float


@dataclass(frozen=True)
class Sent:
    """A message the fake server accepted (sent or edited): what a user would see."""

    chat_id: int
    text: str | None
    message_id: int
    method: str
    params: dict[str, Any] = field(repr=False)


class _ApiError(Exception):
    """A Telegram-shaped refusal: answered as ``{"ok": false, ...}`` with ``status``."""

    def __init__(self, status: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after


@dataclass
class _Fault:
    kind: str  # "fail" | "drop" | "delay" | "malformed"
    times: int | None
    status: int = 0
    description: str = ""
    retry_after: int | None = None
    seconds: float = 0.0
    body: bytes = b""
    html: bool = False
    executed: bool = False


@dataclass
class _StoredFile:
    file_id: str
    file_unique_id: str
    file_path: str
    content: bytes | None  # None: on disk (local mode)


@dataclass
class _Pending:
    update_id: int
    kind: str
    body: str  # the update serialised once, at push time


# --------------------------------------------------------------------------------------------------
# Markup checks: enough of Telegram's parsers to refuse what Telegram refuses.
# --------------------------------------------------------------------------------------------------


def _byte_offset(text: str, index: int) -> int:
    return len(text[:index].encode("utf-8"))


def _entity_error(detail: str) -> _ApiError:
    return _ApiError(400, f"Bad Request: can't parse entities: {detail}")


def _plain_markdown(text: str) -> str:
    """Legacy ``Markdown``: return the visible text or raise the 400 Telegram sends for bad markup."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "_*`[":
            out.append(text[i + 1])
            i += 2
            continue
        if c in "*_":
            end = text.find(c, i + 1)
            if end < 0:
                raise _entity_error(f"Can't find end of the entity starting at byte offset {_byte_offset(text, i)}")
            out.append(text[i + 1 : end])
            i = end + 1
            continue
        if c == "`":
            fence = "```" if text.startswith("```", i) else "`"
            end = text.find(fence, i + len(fence))
            if end < 0:
                raise _entity_error(f"Can't find end of the entity starting at byte offset {_byte_offset(text, i)}")
            out.append(text[i + len(fence) : end])
            i = end + len(fence)
            continue
        if c == "[":
            close = text.find("]", i + 1)
            if close < 0 or not text.startswith("(", close + 1) or text.find(")", close + 2) < 0:
                raise _entity_error(f"Can't find end of the entity starting at byte offset {_byte_offset(text, i)}")
            out.append(text[i + 1 : close])
            i = text.find(")", close + 2) + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


_V2_RESERVED = set("_*[]()~`>#+-=|{}.!")
_V2_NAMES = {
    "*": "Bold",
    "_": "Italic",
    "__": "Underline",
    "~": "Strikethrough",
    "||": "Spoiler",
    "[": "TextUrl",
}


def _plain_markdown_v2(text: str) -> str:
    """``MarkdownV2``: return the visible text or raise the 400 Telegram sends for bad markup."""
    out: list[str] = []
    stack: list[tuple[str, int]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 < n and 0 < ord(text[i + 1]) < 127:
                out.append(text[i + 1])
                i += 2
                continue
            raise _entity_error("Character '\\' is reserved and must be escaped with the preceding '\\'")
        if c == "`":
            fence = "```" if text.startswith("```", i) else "`"
            j = i + len(fence)
            while j < n and not text.startswith(fence, j):
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise _entity_error(
                    f"Can't find end of {'Pre' if fence == '```' else 'Code'} entity at byte offset "
                    f"{_byte_offset(text, i)}"
                )
            out.append(text[i + len(fence) : j].replace("\\`", "`").replace("\\\\", "\\"))
            i = j + len(fence)
            continue
        if c == "]":
            if not stack or stack[-1][0] != "[":
                raise _entity_error("Character ']' is reserved and must be escaped with the preceding '\\'")
            stack.pop()
            if not text.startswith("(", i + 1):
                raise _entity_error(f"Can't find end of TextUrl entity at byte offset {_byte_offset(text, i)}")
            end = text.find(")", i + 2)
            if end < 0:
                raise _entity_error(f"Can't find end of a URL at byte offset {_byte_offset(text, i + 1)}")
            i = end + 1
            continue
        if c == ">" and (i == 0 or text[i - 1] == "\n"):
            i += 1
            continue
        marker: str | None = None
        if c == "_":
            marker = "__" if text.startswith("__", i) else "_"
        elif c in "*~[":
            marker = c
        elif c == "|" and text.startswith("||", i):
            marker = "||"
        if marker is not None:
            if marker != "[" and stack and stack[-1][0] == marker:
                stack.pop()
            elif marker != "[" and any(m == marker for m, _ in stack):
                top, at = stack[-1]
                raise _entity_error(f"Can't find end of {_V2_NAMES[top]} entity at byte offset {at}")
            else:
                stack.append((marker, _byte_offset(text, i)))
            i += len(marker)
            continue
        if c in _V2_RESERVED:
            raise _entity_error(f"Character '{c}' is reserved and must be escaped with the preceding '\\'")
        out.append(c)
        i += 1
    if stack:
        top, at = stack[-1]
        raise _entity_error(f"Can't find end of {_V2_NAMES[top]} entity at byte offset {at}")
    return "".join(out)


_HTML_TAGS = frozenset(
    {
        "b",
        "strong",
        "i",
        "em",
        "u",
        "ins",
        "s",
        "strike",
        "del",
        "span",
        "tg-spoiler",
        "a",
        "code",
        "pre",
        "blockquote",
        "tg-emoji",
    }
)
_HTML_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}


def _plain_html(text: str) -> str:
    """``HTML``: return the visible text or raise the 400 Telegram sends for bad markup."""
    out: list[str] = []
    stack: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "<":
            end = text.find(">", i + 1)
            if end < 0:
                raise _entity_error(f"Unclosed start tag at byte offset {_byte_offset(text, i)}")
            inner = text[i + 1 : end].strip()
            if inner.startswith("/"):
                name = inner[1:].strip().lower()
                if not stack:
                    raise _entity_error(f"Unexpected end tag at byte offset {_byte_offset(text, i)}")
                if name != stack[-1]:
                    raise _entity_error(
                        f'Unmatched end tag at byte offset {_byte_offset(text, i)}, expected "</{stack[-1]}>", '
                        f'found "</{name}>"'
                    )
                stack.pop()
            else:
                name = inner.split(None, 1)[0].lower() if inner else ""
                if name not in _HTML_TAGS:
                    raise _entity_error(f'Unsupported start tag "{name}" at byte offset {_byte_offset(text, i)}')
                stack.append(name)
            i = end + 1
            continue
        if c == "&":
            end = text.find(";", i + 1, i + 12)
            name = text[i + 1 : end] if end > 0 else ""
            if name in _HTML_ENTITIES:
                out.append(_HTML_ENTITIES[name])
                i = end + 1
                continue
        out.append(c)
        i += 1
    if stack:
        raise _entity_error(f'Can\'t find end tag corresponding to start tag "{stack[-1]}"')
    return "".join(out)


def _visible_text(text: str, parse_mode: str | None) -> str:
    """The text a user would see; raises the Telegram 400 for markup it cannot parse."""
    mode = (parse_mode or "").strip().lower()
    if not mode:
        return text
    if mode == "markdown":
        return _plain_markdown(text)
    if mode == "markdownv2":
        return _plain_markdown_v2(text)
    if mode == "html":
        return _plain_html(text)
    raise _ApiError(400, f"Bad Request: unsupported parse_mode {parse_mode!r}")


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


# --------------------------------------------------------------------------------------------------
# HTTP plumbing
# --------------------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose connection threads are named, tracked and joined by the fake."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], fake: FakeBotAPI) -> None:
        self.fake = fake
        self._conn_seq = itertools.count(1)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"fake-bot-api:{self.server_address[1]}-conn-{next(self._conn_seq)}",
            daemon=True,
        )
        self.fake._track_connection(request, thread)
        thread.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.fake._untrack_connection(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients vanish mid-request in fault tests (timeouts, drops): not worth a traceback on stderr.
        pass


class _Drop(Exception):
    """Close the connection without an answer."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server
    server_version = "FakeBotAPI"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _serve(self) -> None:
        fake = self.server.fake
        fake._mark_busy(self.connection, True)
        try:
            body = self._read_body()
            status, payload, ctype, headers = fake._dispatch(self.path, self.headers, body, self.connection)
        except (_Drop, OSError):
            # A scripted drop, or the client went away while we read or waited.
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        except Exception as exc:
            # A bug in the fake (or a request it cannot parse): answer 500 and keep it for the test to see.
            fake._internal_error(exc)
            self.close_connection = True
            status, payload, ctype, headers = _error_response(
                _ApiError(500, f"Internal Server Error: FakeBotAPI failed: {exc!r}")
            )
        finally:
            fake._mark_busy(self.connection, False)
        if fake._stopping.is_set():
            self.close_connection = True
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}", f"Content-Type: {ctype}"]
        head.append(f"Content-Length: {len(payload)}")
        head.extend(f"{k}: {v}" for k, v in headers)
        if self.close_connection:
            head.append("Connection: close")
        try:
            self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
        except OSError:
            self.close_connection = True


def _parse_body(content_type: str, body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    ctype = content_type.split(";", 1)[0].strip().lower()
    if ctype == "application/json":
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise _ApiError(400, "Bad Request: can't parse JSON body") from exc
        if not isinstance(data, dict):
            raise _ApiError(400, "Bad Request: JSON body must be an object")
        return data
    if ctype == "application/x-www-form-urlencoded":
        return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    if ctype == "multipart/form-data":
        message = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
        )
        params: dict[str, Any] = {}
        for part in message.iter_parts():  # type: ignore[attr-defined]
            name = part.get_param("name", header="content-disposition")
            if not name:
                continue
            raw = part.get_payload(decode=True) or b""
            filename = part.get_filename()
            if filename is None:
                params[name] = raw.decode("utf-8", "replace")
            else:
                params[name] = UploadedFile(
                    field=name, filename=filename, content=raw, content_type=part.get_content_type()
                )
        return params
    return {}


def _as_int(params: Mapping[str, Any], key: str) -> int | None:
    value = params.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _ApiError(400, f"Bad Request: invalid {key} {value!r}") from None


def _as_float(params: Mapping[str, Any], key: str, default: float) -> float:
    value = params.get(key)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        raise _ApiError(400, f"Bad Request: invalid {key} {value!r}") from None


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def _chat_dict(chat_id: int) -> dict[str, Any]:
    if chat_id > 0:
        return {"id": chat_id, "type": "private", "first_name": f"User {chat_id}"}
    kind = "supergroup" if chat_id <= -1_000_000_000_000 else "group"
    return {"id": chat_id, "type": kind, "title": f"Group {chat_id}"}


def _user_dict(user_id: int) -> dict[str, Any]:
    return {"id": user_id, "is_bot": False, "first_name": f"User {user_id}", "language_code": "en"}


def _kind_of(update: Mapping[str, Any]) -> str:
    for key in update:
        if key != "update_id":
            return key
    return ""


def _check_method_name(method: str) -> str:
    if not method or not isinstance(method, str):
        raise ConfigurationError(f"method must be a Bot API method name like 'sendMessage', got {method!r}")
    return method.lower()


# --------------------------------------------------------------------------------------------------
# The fake
# --------------------------------------------------------------------------------------------------


class FakeBotAPI:
    """A fake Telegram Bot API server on ``127.0.0.1`` that telebot talks to over real HTTP.

    ``token``: the one token it accepts (default: a random valid-looking one, see :attr:`token`).
    ``max_long_poll``: cap, in seconds, on the ``timeout`` a ``getUpdates`` long poll may wait.
    ``latency``: seconds added before answering, per method name (``{"sendMessage": 0.02}``).
    ``known_chats``: if given, only these chats (and chats that pushed an update) exist; others get
    ``400 chat not found``. ``local_dir``: behave like a local Bot API server started with ``--local``
    (``getFile`` answers absolute paths under that directory). ``port``: 0 picks a free port.
    ``first_update_id``: the id of the first pushed update.

    Use it as a context manager (starts and installs), or call :meth:`start`/:meth:`install` and
    :meth:`uninstall`/:meth:`stop` yourself. Thread-safe. After :meth:`stop` it can be started again
    on the same port with its state kept (a server that went away and came back).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        max_long_poll: float | None = None,
        latency: Mapping[str, float] | None = None,
        known_chats: Iterable[int] | None = None,
        local_dir: str | os.PathLike[str] | None = None,
        port: int = 0,
        first_update_id: int = 1000,
    ) -> None:
        if token is None:
            bot_id = 100_000_000 + secrets.randbelow(900_000_000)
            token = f"{bot_id}:" + "".join(secrets.choice(_TOKEN_ALPHABET) for _ in range(35))
        bot_id_text, sep, secret = token.partition(":")
        if not sep or not bot_id_text.isdigit() or not secret:
            raise ConfigurationError(f"token must look like '<digits>:<secret>', got {token[:12]!r}...")
        if max_long_poll is not None and max_long_poll < 0:
            raise ConfigurationError(f"max_long_poll must be >= 0 seconds, got {max_long_poll!r}")
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise ConfigurationError(f"port must be 0..65535, got {port!r}")
        self._token = token
        self._bot_id = int(bot_id_text)
        self._max_long_poll = max_long_poll
        self._local_dir = Path(local_dir).absolute() if local_dir is not None else None
        self._port = port

        self._cond = threading.Condition(threading.RLock())
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._serve_thread: threading.Thread | None = None
        self._conns: dict[Any, list[Any]] = {}  # socket -> [thread, busy]
        self._conn_lock = threading.Lock()
        self._previous_urls: tuple[str | None, str | None] | None = None

        # getUpdates state
        self._pending: deque[_Pending] = deque()
        self._next_update_id = first_update_id
        self._confirmed_offset = 0
        self._poller: tuple[object, Any] | None = None  # (marker, socket) of the running getUpdates
        self._local = threading.local()
        self._allowed: frozenset[str] = _DEFAULT_ALLOWED
        self._webhook_url = ""

        # recipients and messages
        self._known: set[int] | None = set(known_chats) if known_chats is not None else None
        self._forgotten: set[int] = set()
        self._blocked: set[int] = set()
        self._deactivated: set[int] = set()
        self._revoked = False
        self._next_message_id: dict[int, int] = {}
        self._bot_messages: dict[tuple[int, int], str | None] = {}
        self._callbacks: set[str] = set()
        self._callback_seq = itertools.count(1)
        self._commands: list[Any] = []

        # files
        self._files: dict[str, _StoredFile] = {}
        self._files_by_path: dict[str, _StoredFile] = {}
        self._file_seq = itertools.count(1)

        # records
        self._calls: list[Call] = []
        self._internal_errors: list[BaseException] = []
        self._sent: list[Sent] = []

        # faults, latency, rate limits
        self._latency: dict[str, float] = {}
        for method, seconds in (latency or {}).items():
            self.set_latency(method, seconds)
        self._faults: dict[str, deque[_Fault]] = {}
        self._rate_global: float | None = None
        self._rate_chat: float | None = None
        self._rate_retry_after = 1
        self._rate_all: deque[float] = deque()
        self._rate_by_chat: dict[int, deque[float]] = {}

        self._handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
            "getupdates": self._m_get_updates,
            "getme": self._m_get_me,
            "sendmessage": self._m_send_message,
            "sendphoto": self._m_send_photo,
            "senddocument": self._m_send_document,
            "editmessagetext": self._m_edit_message_text,
            "answercallbackquery": self._m_answer_callback_query,
            "sendchataction": self._m_send_chat_action,
            "getfile": self._m_get_file,
            "setwebhook": self._m_set_webhook,
            "deletewebhook": self._m_delete_webhook,
            "getwebhookinfo": self._m_get_webhook_info,
            "setmycommands": self._m_set_my_commands,
            "getmycommands": self._m_get_my_commands,
            "deletemessage": self._m_delete_message,
            "logout": lambda params: True,
            "close": lambda params: True,
        }
        self._canonical = {name.lower(): name for name in _METHOD_NAMES}

    # ---------------------------------------------------------------- lifecycle

    @property
    def token(self) -> str:
        """The bot token this server accepts (``"<bot id>:<35 characters>"``)."""
        return self._token

    @property
    def bot_id(self) -> int:
        """The numeric bot id (the part of the token before the colon); ``getMe`` answers it."""
        return self._bot_id

    @property
    def port(self) -> int:
        """The TCP port; 0 until the server was started once."""
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``; raises ``RuntimeError`` before the first :meth:`start`."""
        if not self._port:
            raise RuntimeError("FakeBotAPI has no port yet: call start() first")
        return f"http://127.0.0.1:{self._port}"

    @property
    def api_url(self) -> str:
        """The format string for telebot's ``apihelper.API_URL`` (``{0}`` token, ``{1}`` method)."""
        return self.base_url + "/bot{0}/{1}"

    @property
    def file_url(self) -> str:
        """The format string for telebot's ``apihelper.FILE_URL`` (``{0}`` token, ``{1}`` file path)."""
        return self.base_url + "/file/bot{0}/{1}"

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._server is not None

    def start(self) -> FakeBotAPI:
        """Start serving (on the port of a previous run, if any); returns ``self``.

        Raises ``RuntimeError`` if already running, ``OSError`` if the port cannot be bound.
        """
        if self._server is not None:
            raise RuntimeError("FakeBotAPI is already running")
        self._stopping.clear()
        server = _Server(("127.0.0.1", self._port), self)
        self._port = server.server_address[1]
        self._server = server
        self._serve_thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-bot-api:{self._port}",
            daemon=True,
        )
        self._serve_thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: wake long polls and delays, close connections and join every server thread.

        Requests in progress get their answer if they finish within ``timeout`` seconds; after that
        their connections are cut. Idempotent. State (updates, records) is kept.
        """
        server, serve_thread = self._server, self._serve_thread
        if server is None or serve_thread is None:
            return
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        server.shutdown()
        serve_thread.join()
        server.server_close()
        with self._conn_lock:
            idle = [sock for sock, (_, busy) in self._conns.items() if not busy]
        for sock in idle:
            _shutdown_socket(sock)
        deadline = time.monotonic() + timeout
        for thread in self._connection_threads():
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._conn_lock:
            left = list(self._conns)
        for sock in left:
            _shutdown_socket(sock)
        for thread in self._connection_threads():
            thread.join(1.0)
        self._server = None
        self._serve_thread = None

    def _connection_threads(self) -> list[threading.Thread]:
        with self._conn_lock:
            return [thread for thread, _ in self._conns.values()]

    def install(self) -> None:
        """Point telebot (process-wide) at this server; :meth:`uninstall` restores the previous URLs.

        Calling it again while installed does nothing.
        """
        if self._previous_urls is None:
            self._previous_urls = set_api_server(self.api_url, self.file_url)

    def uninstall(self) -> None:
        """Restore telebot's URLs to what they were before :meth:`install`; does nothing if not installed."""
        if self._previous_urls is not None:
            set_api_server(*self._previous_urls)
            self._previous_urls = None

    def __enter__(self) -> FakeBotAPI:
        self.start()
        try:
            self.install()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.uninstall()
        finally:
            self.stop()

    def _track_connection(self, sock: Any, thread: threading.Thread) -> None:
        with self._conn_lock:
            self._conns[sock] = [thread, False]

    def _untrack_connection(self, sock: Any) -> None:
        with self._conn_lock:
            self._conns.pop(sock, None)

    def _internal_error(self, exc: BaseException) -> None:
        with self._cond:
            self._internal_errors.append(exc)
            self._cond.notify_all()

    @property
    def internal_errors(self) -> list[BaseException]:
        """Exceptions the fake itself raised while answering (answered as 500); empty unless it has a bug."""
        with self._cond:
            return list(self._internal_errors)

    def _mark_busy(self, sock: Any, busy: bool) -> None:
        with self._conn_lock:
            entry = self._conns.get(sock)
            if entry is not None:
                entry[1] = busy

    # ---------------------------------------------------------------- updates in

    def push_update(self, update: Mapping[str, Any]) -> int:
        """Queue a raw update (a copy of it) for ``getUpdates``; returns its ``update_id``.

        A missing ``update_id`` is assigned; a given one must be above every earlier one
        (``ValueError`` otherwise), as Telegram's ids only grow.
        """
        with self._cond:
            update_id = self._queue(dict(update))
            self._cond.notify_all()
            return update_id

    def push_message(
        self,
        chat_id: int,
        text: str,
        *,
        user_id: int | None = None,
        message_id: int | None = None,
        date: int | None = None,
        **extra: Any,
    ) -> int:
        """Queue a ``message`` update from a user in ``chat_id``; returns its ``update_id``.

        ``user_id`` defaults to the chat id for private chats (positive ids), else to 1. A text that
        starts with ``/`` carries a ``bot_command`` entity, so telebot's ``commands=[...]`` filters match.
        ``extra`` keys are added to (or replace keys of) the message dict.
        """
        with self._cond:
            message = self._user_message(chat_id, text, user_id, message_id, date, extra)
            update_id = self._queue({"message": message})
            self._cond.notify_all()
            return update_id

    def push_messages(self, n: int, *, chats: Sequence[int] = (1,), text: str = "message {i}") -> list[int]:
        """Queue ``n`` messages, round-robin over ``chats``; ``text`` may use ``{i}`` (0-based index).

        Returns their update ids, in order. One lock and one wake-up for the whole batch.
        """
        if n < 0:
            raise ConfigurationError(f"n must be >= 0, got {n}")
        if not chats:
            raise ConfigurationError("chats must name at least one chat id")
        ids: list[int] = []
        with self._cond:
            for i in range(n):
                chat = chats[i % len(chats)]
                message = self._user_message(chat, text.format(i=i), None, None, None, {})
                ids.append(self._queue({"message": message}))
            self._cond.notify_all()
        return ids

    def push_callback_query(
        self,
        chat_id: int,
        data: str,
        *,
        user_id: int | None = None,
        message_id: int | None = None,
    ) -> int:
        """Queue a ``callback_query`` update (a button press on a bot message in ``chat_id``).

        ``message_id`` defaults to the bot's last message in that chat (or a new id). The query's id
        can be answered once with ``answerCallbackQuery``. Returns the ``update_id``.
        """
        with self._cond:
            uid = user_id if user_id is not None else (chat_id if chat_id > 0 else 1)
            if message_id is None:
                mine = [mid for (chat, mid) in self._bot_messages if chat == chat_id]
                message_id = max(mine) if mine else self._take_message_id(chat_id)
            query_id = f"{self._bot_id}{next(self._callback_seq):08d}"
            self._callbacks.add(query_id)
            self._learn(chat_id)
            update = {
                "callback_query": {
                    "id": query_id,
                    "from": _user_dict(uid),
                    "chat_instance": str(chat_id),
                    "data": data,
                    "message": {
                        "message_id": message_id,
                        "from": self._bot_user(),
                        "chat": _chat_dict(chat_id),
                        "date": int(time.time()),
                        "text": self._bot_messages.get((chat_id, message_id)) or "button",
                    },
                }
            }
            update_id = self._queue(update)
            self._cond.notify_all()
            return update_id

    def _user_message(
        self,
        chat_id: int,
        text: str,
        user_id: int | None,
        message_id: int | None,
        date: int | None,
        extra: Mapping[str, Any],
    ) -> dict[str, Any]:
        if not isinstance(chat_id, int):
            raise ConfigurationError(f"chat_id must be an int, got {chat_id!r}")
        uid = user_id if user_id is not None else (chat_id if chat_id > 0 else 1)
        if message_id is None:
            message_id = self._take_message_id(chat_id)
        else:
            self._next_message_id[chat_id] = max(self._next_message_id.get(chat_id, 1), message_id + 1)
        message: dict[str, Any] = {
            "message_id": message_id,
            "from": _user_dict(uid),
            "chat": _chat_dict(chat_id),
            "date": int(time.time()) if date is None else int(date),
            "text": text,
        }
        if text.startswith("/"):
            command = text.split(None, 1)[0]
            message["entities"] = [{"type": "bot_command", "offset": 0, "length": _utf16_len(command)}]
        message.update(extra)
        self._learn(chat_id)
        return message

    def _learn(self, chat_id: int) -> None:
        if self._known is not None:
            self._known.add(chat_id)

    def _take_message_id(self, chat_id: int) -> int:
        message_id = self._next_message_id.get(chat_id, 1)
        self._next_message_id[chat_id] = message_id + 1
        return message_id

    def _queue(self, update: dict[str, Any]) -> int:
        given = update.get("update_id")
        if given is None:
            update_id = self._next_update_id
        else:
            if not isinstance(given, int) or given < self._next_update_id:
                raise ValueError(
                    f"update_id {given!r} must be an int >= {self._next_update_id} (Telegram's ids only grow)"
                )
            update_id = given
        update["update_id"] = update_id
        self._next_update_id = update_id + 1
        body = json.dumps(update, separators=(",", ":"), ensure_ascii=False)
        self._pending.append(_Pending(update_id, _kind_of(update), body))
        return update_id

    @property
    def confirmed_offset(self) -> int:
        """The highest ``offset`` a ``getUpdates`` sent (0 before any); updates below it are forgotten."""
        with self._cond:
            return self._confirmed_offset

    @property
    def pending_count(self) -> int:
        """How many updates are queued and not yet confirmed."""
        with self._cond:
            return len(self._pending)

    @property
    def next_update_id(self) -> int:
        """The ``update_id`` the next pushed update gets."""
        with self._cond:
            return self._next_update_id

    @property
    def polling(self) -> bool:
        """True while a ``getUpdates`` call is being answered (e.g. waiting in a long poll)."""
        with self._cond:
            return self._poller is not None

    @property
    def webhook_url(self) -> str:
        """The webhook URL set through ``setWebhook`` ("" when none)."""
        with self._cond:
            return self._webhook_url

    # ---------------------------------------------------------------- records

    @property
    def calls(self) -> list[Call]:
        """A copy of every request received so far, in arrival order."""
        with self._cond:
            return list(self._calls)

    @property
    def sent(self) -> list[Sent]:
        """A copy of every message accepted so far (sends and edits), in order."""
        with self._cond:
            return list(self._sent)

    def sent_to(self, chat_id: int) -> list[Sent]:
        """The accepted messages for one chat, in order."""
        with self._cond:
            return [s for s in self._sent if s.chat_id == chat_id]

    def calls_to(self, method: str) -> list[Call]:
        """The requests for one method (case-insensitive), in order."""
        key = method.lower()
        with self._cond:
            return [c for c in self._calls if c.method.lower() == key]

    def clear_records(self) -> None:
        """Forget :attr:`calls` and :attr:`sent` (not updates, chats or faults)."""
        with self._cond:
            self._calls.clear()
            self._sent.clear()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Block until ``predicate()`` is true; re-checked after every request and push.

        Returns the last value of the predicate (False on timeout). The predicate runs with the
        server's lock held, so it may read this object's properties but must not block.
        """
        with self._cond:
            return bool(self._cond.wait_for(predicate, timeout))

    def wait_sent(self, n: int, timeout: float = 5.0) -> bool:
        """Block until at least ``n`` messages were accepted; False on timeout."""
        return self.wait_for(lambda: len(self._sent) >= n, timeout)

    def wait_confirmed(self, offset: int, timeout: float = 5.0) -> bool:
        """Block until a ``getUpdates`` confirmed up to ``offset`` (``confirmed_offset >= offset``)."""
        return self.wait_for(lambda: self._confirmed_offset >= offset, timeout)

    # ---------------------------------------------------------------- recipients

    def forget_chat(self, chat_id: int) -> None:
        """Make ``chat_id`` unknown: sends to it get ``400 Bad Request: chat not found``."""
        with self._cond:
            self._forgotten.add(chat_id)
            if self._known is not None:
                self._known.discard(chat_id)

    def block(self, chat_id: int) -> None:
        """The user blocked the bot: sends get ``403 Forbidden: bot was blocked by the user``."""
        with self._cond:
            self._blocked.add(chat_id)

    def unblock(self, chat_id: int) -> None:
        """Undo :meth:`block`."""
        with self._cond:
            self._blocked.discard(chat_id)

    def deactivate(self, chat_id: int) -> None:
        """The user deleted the account: sends get ``403 Forbidden: user is deactivated``."""
        with self._cond:
            self._deactivated.add(chat_id)

    def revoke_token(self) -> None:
        """Revoke the token: every request gets ``401 Unauthorized`` from now on."""
        with self._cond:
            self._revoked = True

    # ---------------------------------------------------------------- faults

    def set_latency(self, method: str, seconds: float) -> None:
        """Answer every ``method`` call ``seconds`` later (0 removes the latency)."""
        key = _check_method_name(method)
        if seconds < 0:
            raise ConfigurationError(f"latency for {method} must be >= 0 seconds, got {seconds!r}")
        with self._cond:
            if seconds:
                self._latency[key] = float(seconds)
            else:
                self._latency.pop(key, None)

    def fail(
        self,
        method: str,
        status: int,
        description: str | None = None,
        retry_after: int | None = None,
        times: int | None = 1,
        *,
        html: bool = False,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` with ``status`` (``times=None``: forever).

        The answer is Telegram's JSON error (``description`` defaults to the standard reason);
        ``retry_after`` adds ``parameters.retry_after`` and a ``Retry-After`` header. ``html=True``
        answers a non-JSON HTML page with that status instead, like a proxy in front of Telegram.
        ``method="*"`` matches any method without a fault of its own.
        """
        if not 100 <= status <= 599:
            raise ConfigurationError(f"status must be an HTTP status 100..599, got {status!r}")
        if description is None:
            reason = _REASONS.get(status, "Error")
            description = (
                f"Too Many Requests: retry after {retry_after if retry_after is not None else 1}"
                if status == 429
                else reason
            )
        self._add_fault(
            method,
            _Fault("fail", times, status=status, description=description, retry_after=retry_after, html=html),
        )

    def drop(self, method: str, times: int | None = 1, *, executed: bool = False) -> None:
        """Close the connection of the next ``times`` calls of ``method`` without an answer.

        The request was fully received; with ``executed=True`` the server also carried it out
        (e.g. the message was sent) before hanging up, which is what makes a drop ambiguous.
        """
        self._add_fault(method, _Fault("drop", times, executed=executed))

    def delay(self, method: str, seconds: float, times: int | None = 1) -> None:
        """Answer the next ``times`` calls of ``method`` after ``seconds`` (then normally)."""
        if seconds < 0:
            raise ConfigurationError(f"delay must be >= 0 seconds, got {seconds!r}")
        self._add_fault(method, _Fault("delay", times, seconds=float(seconds)))

    def malformed(self, method: str, times: int | None = 1, *, body: bytes | None = None) -> None:
        """Answer the next ``times`` calls of ``method`` with HTTP 200 and a body that is not the API's JSON.

        ``body`` defaults to an HTML page; pass e.g. ``b'{"result": true}'`` for JSON without ``ok``.
        The call is not carried out.
        """
        self._add_fault(method, _Fault("malformed", times, body=body if body is not None else b"<html>upstream</html>"))

    def clear_faults(self) -> None:
        """Remove every scripted fault and the rate limiter (latencies stay)."""
        with self._cond:
            self._faults.clear()
            self._rate_global = self._rate_chat = None
            self._rate_all.clear()
            self._rate_by_chat.clear()

    def faults_left(self, method: str) -> int:
        """How many scripted faults are still queued for ``method`` (a forever fault counts as one)."""
        with self._cond:
            return len(self._faults.get(method.lower(), ()))

    def rate_limit(
        self,
        global_per_s: float | None = None,
        per_chat_per_s: float | None = None,
        retry_after: int = 1,
    ) -> None:
        """Answer ``429`` (with ``retry_after``) to send methods over these rates; both None turns it off.

        Rates are counted over a sliding one-second window of accepted sends; a call answered 429
        does not count.
        """
        for name, value in (("global_per_s", global_per_s), ("per_chat_per_s", per_chat_per_s)):
            if value is not None and value <= 0:
                raise ConfigurationError(f"{name} must be > 0 or None, got {value!r}")
        if retry_after < 0:
            raise ConfigurationError(f"retry_after must be >= 0, got {retry_after!r}")
        with self._cond:
            self._rate_global = global_per_s
            self._rate_chat = per_chat_per_s
            self._rate_retry_after = int(retry_after)
            self._rate_all.clear()
            self._rate_by_chat.clear()

    def _add_fault(self, method: str, fault: _Fault) -> None:
        key = "*" if method == "*" else _check_method_name(method)
        if fault.times is not None and fault.times < 1:
            raise ConfigurationError(f"times must be >= 1 or None (forever), got {fault.times!r}")
        with self._cond:
            self._faults.setdefault(key, deque()).append(fault)

    def _take_fault(self, key: str) -> _Fault | None:
        with self._cond:
            for name in (key, "*"):
                queue = self._faults.get(name)
                if not queue:
                    continue
                fault = queue[0]
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        queue.popleft()
                return fault
            return None

    # ---------------------------------------------------------------- files

    def add_file(
        self,
        file_id: str | None,
        path: str | os.PathLike[str],
        content: bytes | None = b"",
    ) -> str:
        """Make ``getFile(file_id)`` answer ``path``; returns the file id (a new one if None).

        In local mode a relative ``path`` lies under ``local_dir``; an absolute one is used as is
        (also outside ``local_dir``, to test refusals). ``content`` is written there (parents
        created); ``content=None`` leaves the file system alone (e.g. a symlink you made).
        Without local mode ``path`` must be relative and ``content`` is served at :attr:`file_url`.
        """
        raw = Path(path)
        if self._local_dir is not None:
            full = raw if raw.is_absolute() else self._local_dir / raw
            if content is not None:
                full.parent.mkdir(parents=True, exist_ok=True)
                full.write_bytes(content)
            file_path, stored = str(full), None
        else:
            if raw.is_absolute():
                raise ConfigurationError(
                    f"path {str(path)!r} is absolute, but absolute file paths exist only in local mode "
                    "(FakeBotAPI(local_dir=...))"
                )
            file_path, stored = raw.as_posix(), content or b""
        with self._cond:
            return self._register_file(file_id, file_path, stored)

    def _register_file(self, file_id: str | None, file_path: str, content: bytes | None) -> str:
        seq = next(self._file_seq)
        file_id = file_id or f"FAKE-FILE-{self._bot_id}-{seq}"
        record = _StoredFile(file_id, f"U{seq:06d}", file_path, content)
        self._files[file_id] = record
        self._files_by_path[file_path] = record
        return file_id

    # ---------------------------------------------------------------- request dispatch

    def _dispatch(
        self, raw_path: str, headers: Any, body: bytes, conn: Any = None
    ) -> tuple[int, bytes, str, list[tuple[str, str]]]:
        """Answer one request: ``(status, body, content type, extra headers)``; raises ``_Drop``."""
        self._local.conn = conn
        split = urlsplit(raw_path)
        path = unquote(split.path)
        if path.startswith("/file/bot"):
            return self._download(path[len("/file/bot") :])
        if not path.startswith("/bot") or "/" not in path[4:]:
            return _error_response(_ApiError(404, "Not Found"))
        token, _, method = path[4:].partition("/")
        key = method.lower()
        method_name = self._canonical.get(key, method)
        try:
            params: dict[str, Any] = dict(parse_qsl(split.query, keep_blank_values=True))
            params.update(_parse_body(headers.get("Content-Type") or "", body))
        except _ApiError as exc:
            return _error_response(exc)
        with self._cond:
            self._calls.append(Call(method_name, params, time.time()))
            latency = self._latency.get(key, 0.0)
        try:
            if latency:
                self._stopping.wait(latency)
            fault = self._take_fault(key)
            if fault is not None:
                if fault.kind == "delay":
                    self._stopping.wait(fault.seconds)
                elif fault.kind == "malformed":
                    return 200, fault.body, "text/html; charset=utf-8", []
                elif fault.kind == "fail":
                    error = _ApiError(fault.status, fault.description, fault.retry_after)
                    if fault.html:
                        page = f"<html><body><h1>{fault.status} {fault.description}</h1></body></html>"
                        return fault.status, page.encode(), "text/html; charset=utf-8", _retry_header(error)
                    return _error_response(error)
                elif fault.kind == "drop":
                    if fault.executed:
                        with contextlib.suppress(_ApiError):
                            self._execute(token, key, params)
                    raise _Drop
            result = self._execute(token, key, params)
        except _ApiError as exc:
            return _error_response(exc)
        finally:
            with self._cond:
                self._cond.notify_all()
        if isinstance(result, bytes):  # getUpdates pre-serialised its result
            payload = b'{"ok":true,"result":' + result + b"}"
        else:
            payload = json.dumps({"ok": True, "result": result}, separators=(",", ":"), ensure_ascii=False).encode()
        return 200, payload, "application/json", []

    def _execute(self, token: str, key: str, params: dict[str, Any]) -> Any:
        if token != self._token or self._revoked:
            raise _ApiError(401, "Unauthorized")
        handler = self._handlers.get(key)
        if handler is None:
            raise _ApiError(404, "Not Found")
        return handler(params)

    def _download(self, rest: str) -> tuple[int, bytes, str, list[tuple[str, str]]]:
        token, _, file_path = rest.partition("/")
        if token != self._token or self._revoked:
            return _error_response(_ApiError(401, "Unauthorized"))
        with self._cond:
            self._calls.append(Call("downloadFile", {"file_path": file_path}, time.time()))
            record = self._files_by_path.get(file_path)
            self._cond.notify_all()
        if record is None or record.content is None:
            return _error_response(_ApiError(404, "Not Found"))
        return 200, record.content, "application/octet-stream", []

    # ---------------------------------------------------------------- methods

    def _bot_user(self) -> dict[str, Any]:
        return {"id": self._bot_id, "is_bot": True, "first_name": "Fake Bot", "username": "fake_fence_bot"}

    def _m_get_me(self, params: dict[str, Any]) -> Any:
        user = self._bot_user()
        user.update(can_join_groups=True, can_read_all_group_messages=False, supports_inline_queries=False)
        return user

    def _m_get_updates(self, params: dict[str, Any]) -> Any:
        offset = _as_int(params, "offset")
        limit = _as_int(params, "limit")
        limit = 100 if limit is None else min(100, max(1, limit))
        wait = max(0.0, _as_float(params, "timeout", 0.0))
        if self._max_long_poll is not None:
            wait = min(wait, self._max_long_poll)
        allowed_raw = params.get("allowed_updates")
        allowed: frozenset[str] | None = None
        if allowed_raw not in (None, ""):
            try:
                names = json.loads(allowed_raw) if isinstance(allowed_raw, str) else allowed_raw
            except ValueError:
                raise _ApiError(400, "Bad Request: can't parse allowed_updates JSON array") from None
            if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
                raise _ApiError(400, "Bad Request: allowed_updates must be a JSON array of strings")
            allowed = frozenset(names) if names else _DEFAULT_ALLOWED
        with self._cond:
            if self._webhook_url:
                raise _ApiError(
                    409,
                    "Conflict: can't use getUpdates method while webhook is active; "
                    "use deleteWebhook to delete the webhook first",
                )
            if self._poller is not None and not _peer_closed(self._poller[1]):
                raise _ApiError(
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
                )
            if allowed is not None:
                self._allowed = allowed
            # A poller whose client hung up (killed, timed out) is superseded, as Telegram does.
            me = (object(), getattr(self._local, "conn", None))
            self._poller = me
            self._cond.notify_all()  # wait_for(lambda: api.polling) in tests
            try:
                if offset is not None:
                    self._confirm(offset)
                deadline = time.monotonic() + wait
                while True:
                    batch = self._collect(limit)
                    if batch or self._stopping.is_set() or self._poller is not me:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            finally:
                if self._poller is me:
                    self._poller = None
        return ("[" + ",".join(batch) + "]").encode("utf-8")

    def _confirm(self, offset: int) -> None:
        pending = self._pending
        if offset < 0:
            while len(pending) > -offset:
                pending.popleft()
            floor = pending[0].update_id if pending else self._next_update_id
            self._confirmed_offset = max(self._confirmed_offset, floor)
            return
        while pending and pending[0].update_id < offset:
            pending.popleft()
        self._confirmed_offset = max(self._confirmed_offset, offset)

    def _collect(self, limit: int) -> list[str]:
        batch: list[str] = []
        allowed = self._allowed
        for item in self._pending:
            if item.kind in allowed:
                batch.append(item.body)
                if len(batch) >= limit:
                    break
        return batch

    def _chat_of(self, params: Mapping[str, Any]) -> int:
        raw = params.get("chat_id")
        if raw is None or raw == "":
            raise _ApiError(400, "Bad Request: chat_id is empty")
        try:
            chat_id = int(raw)
        except (TypeError, ValueError):
            raise _ApiError(400, "Bad Request: chat not found") from None
        if chat_id in self._forgotten or (self._known is not None and chat_id not in self._known):
            raise _ApiError(400, "Bad Request: chat not found")
        if chat_id in self._deactivated:
            raise _ApiError(403, "Forbidden: user is deactivated")
        if chat_id in self._blocked:
            if chat_id < 0:
                raise _ApiError(403, "Forbidden: bot was kicked from the group chat")
            raise _ApiError(403, "Forbidden: bot was blocked by the user")
        return chat_id

    def _check_rate(self, key: str, chat_id: int) -> None:
        if key not in _SEND_METHODS or (self._rate_global is None and self._rate_chat is None):
            return
        now = time.monotonic()
        horizon = now - 1.0
        window = self._rate_all
        while window and window[0] <= horizon:
            window.popleft()
        chat_window = self._rate_by_chat.setdefault(chat_id, deque())
        while chat_window and chat_window[0] <= horizon:
            chat_window.popleft()
        over = (self._rate_global is not None and len(window) >= self._rate_global) or (
            self._rate_chat is not None and len(chat_window) >= self._rate_chat
        )
        if over:
            seconds = self._rate_retry_after
            raise _ApiError(429, f"Too Many Requests: retry after {seconds}", retry_after=seconds)
        window.append(now)
        chat_window.append(now)

    def _record_message(
        self, method: str, chat_id: int, text: str | None, params: dict[str, Any], extra: Mapping[str, Any]
    ) -> dict[str, Any]:
        message_id = self._take_message_id(chat_id)
        self._bot_messages[(chat_id, message_id)] = text
        self._sent.append(Sent(chat_id, text, message_id, method, params))
        message: dict[str, Any] = {
            "message_id": message_id,
            "from": self._bot_user(),
            "chat": _chat_dict(chat_id),
            "date": int(time.time()),
        }
        if text is not None:
            message["text" if method == "sendMessage" else "caption"] = text
        message.update(extra)
        return message

    def _m_send_message(self, params: dict[str, Any]) -> Any:
        with self._cond:
            chat_id = self._chat_of(params)
            text = params.get("text")
            if not isinstance(text, str) or not text.strip():
                raise _ApiError(400, "Bad Request: message text is empty")
            visible = _visible_text(text, params.get("parse_mode"))
            if not visible.strip():
                raise _ApiError(400, "Bad Request: message text is empty")
            if _utf16_len(visible) > _MAX_TEXT:
                raise _ApiError(400, "Bad Request: message is too long")
            self._check_rate("sendmessage", chat_id)
            return self._record_message("sendMessage", chat_id, text, params, {})

    def _media(self, params: dict[str, Any], field_name: str, method: str) -> tuple[int, str | None, Any]:
        chat_id = self._chat_of(params)
        media = params.get(field_name)
        if media is None or media == "":
            raise _ApiError(400, f"Bad Request: there is no {field_name} in the request")
        caption = params.get("caption")
        if caption is not None:
            visible = _visible_text(str(caption), params.get("parse_mode"))
            if _utf16_len(visible) > _MAX_CAPTION:
                raise _ApiError(400, "Bad Request: message caption is too long")
        self._check_rate(method.lower(), chat_id)
        if isinstance(media, UploadedFile):
            folder = "photos" if field_name == "photo" else "documents"
            name = media.filename or f"file_{next(self._file_seq)}"
            rel = f"{folder}/{next(self._file_seq)}_{Path(name).name}"
            if self._local_dir is not None:
                full = self._local_dir / rel
                full.parent.mkdir(parents=True, exist_ok=True)
                full.write_bytes(media.content)
                file_id = self._register_file(None, str(full), None)
            else:
                file_id = self._register_file(None, rel, media.content)
            return chat_id, caption, (file_id, name, len(media.content))
        record = self._files.get(str(media))
        return chat_id, caption, (str(media), Path(record.file_path).name if record else "file", 0)

    def _m_send_photo(self, params: dict[str, Any]) -> Any:
        with self._cond:
            chat_id, caption, (file_id, _, size) = self._media(params, "photo", "sendPhoto")
            photo = [
                {"file_id": file_id, "file_unique_id": f"u{file_id}", "width": 90, "height": 90, "file_size": size}
            ]
            return self._record_message("sendPhoto", chat_id, caption, params, {"photo": photo})

    def _m_send_document(self, params: dict[str, Any]) -> Any:
        with self._cond:
            chat_id, caption, (file_id, name, size) = self._media(params, "document", "sendDocument")
            document = {"file_id": file_id, "file_unique_id": f"u{file_id}", "file_name": name, "file_size": size}
            return self._record_message("sendDocument", chat_id, caption, params, {"document": document})

    def _m_edit_message_text(self, params: dict[str, Any]) -> Any:
        with self._cond:
            text = params.get("text")
            if not isinstance(text, str) or not text.strip():
                raise _ApiError(400, "Bad Request: message text is empty")
            visible = _visible_text(text, params.get("parse_mode"))
            if _utf16_len(visible) > _MAX_TEXT:
                raise _ApiError(400, "Bad Request: message is too long")
            if params.get("inline_message_id"):
                return True
            chat_id = self._chat_of(params)
            message_id = _as_int(params, "message_id")
            if message_id is None:
                raise _ApiError(400, "Bad Request: message identifier is not specified")
            key = (chat_id, message_id)
            if key not in self._bot_messages:
                raise _ApiError(400, "Bad Request: message to edit not found")
            if self._bot_messages[key] == text:
                raise _ApiError(
                    400,
                    "Bad Request: message is not modified: specified new message content and reply markup "
                    "are exactly the same as a current content and reply markup of the message",
                )
            self._check_rate("editmessagetext", chat_id)
            self._bot_messages[key] = text
            self._sent.append(Sent(chat_id, text, message_id, "editMessageText", params))
            return {
                "message_id": message_id,
                "from": self._bot_user(),
                "chat": _chat_dict(chat_id),
                "date": int(time.time()),
                "edit_date": int(time.time()),
                "text": text,
            }

    def _m_answer_callback_query(self, params: dict[str, Any]) -> Any:
        with self._cond:
            query_id = str(params.get("callback_query_id") or "")
            if query_id not in self._callbacks:
                raise _ApiError(
                    400, "Bad Request: query is too old and response timeout expired or query ID is invalid"
                )
            self._callbacks.discard(query_id)
            return True

    def _m_send_chat_action(self, params: dict[str, Any]) -> Any:
        with self._cond:
            self._chat_of(params)
            if not params.get("action"):
                raise _ApiError(400, "Bad Request: action is empty")
            return True

    def _m_get_file(self, params: dict[str, Any]) -> Any:
        file_id = str(params.get("file_id") or "")
        with self._cond:
            record = self._files.get(file_id)
        if record is None:
            raise _ApiError(400, "Bad Request: invalid file_id")
        if record.content is not None:
            size = len(record.content)
        else:
            try:
                size = os.path.getsize(record.file_path)
            except OSError:
                size = 0
        return {
            "file_id": record.file_id,
            "file_unique_id": record.file_unique_id,
            "file_size": size,
            "file_path": record.file_path,
        }

    def _m_set_webhook(self, params: dict[str, Any]) -> Any:
        url = str(params.get("url") or "")
        if url and not url.lower().startswith("https://"):
            raise _ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
        with self._cond:
            self._webhook_url = url
            if _as_bool(params.get("drop_pending_updates")):
                self._pending.clear()
        return True

    def _m_delete_webhook(self, params: dict[str, Any]) -> Any:
        with self._cond:
            self._webhook_url = ""
            if _as_bool(params.get("drop_pending_updates")):
                self._pending.clear()
        return True

    def _m_get_webhook_info(self, params: dict[str, Any]) -> Any:
        with self._cond:
            return {
                "url": self._webhook_url,
                "has_custom_certificate": False,
                "pending_update_count": len(self._pending),
            }

    def _m_set_my_commands(self, params: dict[str, Any]) -> Any:
        raw = params.get("commands")
        try:
            commands = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            raise _ApiError(400, "Bad Request: can't parse commands JSON array") from None
        if not isinstance(commands, list):
            raise _ApiError(400, "Bad Request: commands must be a JSON array")
        with self._cond:
            self._commands = commands
        return True

    def _m_get_my_commands(self, params: dict[str, Any]) -> Any:
        with self._cond:
            return list(self._commands)

    def _m_delete_message(self, params: dict[str, Any]) -> Any:
        with self._cond:
            chat_id = self._chat_of(params)
            message_id = _as_int(params, "message_id")
            if message_id is None or self._bot_messages.pop((chat_id, message_id), None) is None:
                raise _ApiError(400, "Bad Request: message to delete not found")
            return True

    @property
    def commands(self) -> list[Any]:
        """The command list last set with ``setMyCommands``."""
        with self._cond:
            return list(self._commands)

    def __repr__(self) -> str:
        state = f"port {self._port}" if self._server is not None else "stopped"
        return f"<FakeBotAPI {state}, bot {self._bot_id}>"


def _retry_header(error: _ApiError) -> list[tuple[str, str]]:
    return [("Retry-After", str(error.retry_after))] if error.retry_after is not None else []


def _error_response(error: _ApiError) -> tuple[int, bytes, str, list[tuple[str, str]]]:
    body: dict[str, Any] = {"ok": False, "error_code": error.status, "description": error.description}
    if error.retry_after is not None:
        body["parameters"] = {"retry_after": error.retry_after}
    payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return error.status, payload, "application/json", _retry_header(error)


def _peer_closed(sock: Any) -> bool:
    """True if the client of ``sock`` hung up (or the socket is unusable); False while it is connected."""
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _shutdown_socket(sock: Any) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
