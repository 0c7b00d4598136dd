"""``FakeBotAPI``: configuration, life cycle, installation into telebot, what tests read back, and webhook
deliveries to watch. It inherits the methods that push updates and script recipients (``ChatControls``) and
faults (``FaultControls``)."""

from __future__ import annotations

import contextlib
import secrets
import string
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...errors import ConfigurationError
from ...telegram import set_api_server
from .answers import ApiError, Call, Handler, Response, Sent, error_response, ok_response, retry_header
from .chats import ChatControls, Chats
from .faults import FaultControls, FaultScript
from .server import Drop, HttpServer, parse_body
from .updates import UpdateQueue
from .webhook import Webhook

__all__ = ["FakeBotAPI"]

_TOKEN_ALPHABET = string.ascii_letters + string.digits + "_-"


class FakeBotAPI(ChatControls, FaultControls):
    """A fake Telegram Bot API server on ``127.0.0.1`` that telebot talks to over real HTTP.

    ``token``: the one token it accepts (default: a random one). ``max_long_poll``: cap, in seconds, on a
    ``getUpdates`` long poll. ``latency``: seconds added before answering, per method name. ``port``: 0 picks a
    free one. A failed webhook delivery is retried after ``webhook_retry_delay`` seconds, doubling up to
    ``webhook_max_retry_delay``.

    A context manager (starts and installs). Thread-safe. After :meth:`stop` it can be started again on the same
    port with its state kept.
    """

    def __init__(self, *, token: str | None = None, max_long_poll: float | None = None,
                 latency: Mapping[str, float] | None = None, port: int = 0, webhook_retry_delay: float = 0.05,
                 webhook_max_retry_delay: float = 1.0) -> None:
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
        delays = {"webhook_retry_delay": webhook_retry_delay, "webhook_max_retry_delay": webhook_max_retry_delay}
        for name, value in delays.items():
            if not value >= 0:
                raise ConfigurationError(f"{name} must be >= 0 seconds, got {value!r}")
        #: The bot token this server accepts.
        self.token = token
        #: The numeric bot id (the token's part before the colon).
        self.bot_id = int(bot_id_text)
        #: The TCP port; 0 until the first :meth:`start`.
        self.port = port
        self._cond = threading.Condition(threading.RLock())
        self._stopping = threading.Event()
        self._server: HttpServer | None = None
        self._previous_urls: tuple[str | None, str | None] | None = None
        self._calls: list[Call] = []
        self._sent: list[Sent] = []
        self._internal_errors: list[BaseException] = []
        self._faults = FaultScript(self._cond)
        self._chats = Chats(self._cond, self.bot_id, self._faults, self._sent)
        self._updates = UpdateQueue(self._cond, self._stopping, max_long_poll)
        self._webhook = Webhook(self._cond, self._updates, self._stopping, retry_delay=webhook_retry_delay,
                                max_retry_delay=webhook_max_retry_delay)
        handlers = self._chats.table() | self._webhook.table()
        self._handlers = {name.lower(): handler for name, handler in handlers.items()}
        for method, seconds in (latency or {}).items():
            self.set_latency(method, seconds)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``; raises ``RuntimeError`` before the first :meth:`start`."""
        if not self.port:
            raise RuntimeError("FakeBotAPI has no port yet: call start() first")
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """The format string for telebot's ``apihelper.API_URL`` (``{0}`` token, ``{1}`` method)."""
        return self.base_url + "/bot{0}/{1}"

    @property
    def file_url(self) -> str:
        """The format string for telebot's ``apihelper.FILE_URL`` (``{0}`` token, ``{1}`` file path)."""
        return self.base_url + "/file/bot{0}/{1}"

    def start(self) -> FakeBotAPI:
        """Start serving (on the port of a previous run, if any); returns ``self``. ``OSError``: port not bound."""
        if self._server is not None:
            raise RuntimeError("FakeBotAPI is already running")
        self._stopping.clear()
        self._server = HttpServer(self.port, self._answer, self._internal_errors.append, self._stopping)
        self.port = self._server.port
        self._webhook.start(self.port)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and join every thread; requests still running after ``timeout`` seconds are cut. Idempotent;
        the state (updates, records) is kept."""
        server = self._server
        if server is None:
            return
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        self._webhook.stop()
        server.stop(timeout)
        self._server = None

    def install(self) -> None:
        """Point telebot (process-wide) at this server until :meth:`uninstall`; does nothing if installed."""
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

    def __exit__(self, *exc: object) -> None:
        try:
            self.uninstall()
        finally:
            self.stop()

    def add_method(self, name: str, handler: Handler) -> None:
        """Answer the Bot API method ``name`` with ``handler(params)`` from now on (also replacing a built-in one).

        ``params``: the request's parameters (uploads as :class:`UploadedFile`). The handler returns the ``result``
        or raises :class:`ApiError` to refuse; it runs on the request's thread. Calls are recorded and faults apply
        as for any method. ``getUpdates`` cannot be replaced: :class:`ConfigurationError`.
        """
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigurationError(f"name must be a Bot API method name such as 'sendDice', got {name!r}")
        if name.lower() == "getupdates":
            raise ConfigurationError("getUpdates belongs to the fake's update queue; push updates instead")
        if not callable(handler):
            raise ConfigurationError(f"handler must be callable (params -> result), got {handler!r}")
        with self._cond:  # the table is replaced, never changed in place: requests read it without the lock
            self._handlers = {**self._handlers, name.lower(): handler}

    def _answer(self, raw_path: str, headers: Any, body: bytes, conn: Any) -> Response:
        """Answer one request; raises :class:`Drop` to hang up without an answer."""
        split = urlsplit(raw_path)
        path = unquote(split.path)
        if not path.startswith("/bot") or "/" not in path[4:]:
            return error_response(ApiError(404, "Not Found"))
        token, _, method = path[4:].partition("/")
        key = method.lower()
        try:
            params: dict[str, Any] = dict(parse_qsl(split.query, keep_blank_values=True))
            params.update(parse_body(headers.get("Content-Type") or "", body))
        except ApiError as exc:
            return error_response(exc)
        with self._cond:
            self._calls.append(Call(method, params, time.time()))
        try:
            self._stopping.wait(self._faults.latency.get(key, 0.0))
            fault = self._faults.take(key)
            if fault is not None:
                if fault.kind == "delay":
                    self._stopping.wait(fault.seconds)
                elif fault.kind == "malformed":
                    return 200, fault.body, "text/html; charset=utf-8", []
                elif fault.kind == "fail":
                    error = ApiError(fault.status, fault.description, fault.retry_after)
                    if fault.html:
                        page = f"<html><body><h1>{fault.status} {fault.description}</h1></body></html>"
                        return fault.status, page.encode(), "text/html; charset=utf-8", retry_header(error)
                    return error_response(error)
                elif fault.kind == "drop":
                    if fault.executed:
                        with contextlib.suppress(ApiError):
                            self._execute(token, key, params, conn)
                    raise Drop
            result = self._execute(token, key, params, conn)
        except ApiError as exc:
            return error_response(exc)
        finally:
            with self._cond:
                self._cond.notify_all()
        return ok_response(result)

    def _execute(self, token: str, key: str, params: dict[str, Any], conn: Any) -> Any:
        if token != self.token or self._chats.revoked:
            raise ApiError(401, "Unauthorized")
        if key == "getupdates":
            return self._updates.get_updates(params, conn)
        handler = self._handlers.get(key)
        if handler is None:
            raise ApiError(404, "Not Found")
        return handler(params)

    @property
    def internal_errors(self) -> list[BaseException]:
        """Exceptions the fake itself raised while answering (answered as 500); empty unless it has a bug."""
        with self._cond:
            return list(self._internal_errors)

    @property
    def confirmed_offset(self) -> int:
        """The highest ``offset`` a ``getUpdates`` sent (0 before any); updates below it are forgotten."""
        return self._updates.confirmed_offset

    @property
    def pending_count(self) -> int:
        """How many updates are queued and not yet confirmed."""
        return len(self._updates.pending)

    @property
    def polling(self) -> bool:
        """True while a ``getUpdates`` call is being answered (e.g. waiting in a long poll)."""
        return self._updates.poller is not None

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

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Block until ``predicate()`` is true (re-checked after every request and push, and every 50 ms);
        False on timeout. It runs under the fake's lock: it may read this object but must not block."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.05))
            return True

    def wait_sent(self, n: int, timeout: float = 5.0) -> bool:
        """Block until at least ``n`` messages were accepted; False on timeout."""
        return self.wait_for(lambda: len(self._sent) >= n, timeout)

    def wait_confirmed(self, offset: int, timeout: float = 5.0) -> bool:
        """Block until a ``getUpdates`` confirmed up to ``offset`` (``confirmed_offset >= offset``)."""
        return self.wait_for(lambda: self._updates.confirmed_offset >= offset, timeout)

    @property
    def webhook_url(self) -> str:
        """The webhook URL set ("" when none)."""
        config = self._webhook.config
        return config.url if config else ""

    @property
    def webhook_attempts(self) -> int:
        """How many webhook deliveries ended so far (answered or failed)."""
        return self._webhook.attempts

    @property
    def webhook_deliveries(self) -> int:
        """How many webhook deliveries were answered with a 2xx."""
        return self._webhook.deliveries

    @property
    def webhook_in_flight(self) -> int:
        """How many webhook deliveries are in progress now."""
        return len(self._webhook.in_flight)

    def wait_delivered(self, timeout: float = 5.0) -> bool:
        """Block until no update is queued or in flight (all delivered, or dropped); False on timeout."""
        with self._webhook.cond:
            webhook = self._webhook
            return webhook.cond.wait_for(lambda: not webhook.updates.pending and not webhook.in_flight, timeout)
