"""``FakeBotAPI``: configuration, life cycle, installation into telebot, and what tests read back."""

from __future__ import annotations

import secrets
import string
import threading
import time
from collections.abc import Callable, Mapping

from ...errors import ConfigurationError
from ...telegram import set_api_server
from .answers import Handler
from .chats import ChatControls, Chats
from .faults import FaultControls, FaultScript
from .records import Call, Records, Sent
from .server import Dispatcher, HttpServer
from .updates import PushControls, UpdateQueue
from .webhook import Webhook, WebhookControls

__all__ = ["FakeBotAPI"]

_TOKEN_ALPHABET = string.ascii_letters + string.digits + "_-"


class FakeBotAPI(PushControls, ChatControls, FaultControls, WebhookControls):
    """A fake Telegram Bot API server on ``127.0.0.1`` that telebot talks to over real HTTP.

    ``token``: the one token it accepts (default: a random one). ``max_long_poll``: cap, in seconds, on a
    ``getUpdates`` long poll. ``latency``: seconds added before answering, per method name. ``port``: 0 picks a
    free one. ``first_update_id``: the id of the first pushed update. A failed webhook delivery is retried after
    ``webhook_retry_delay`` seconds, doubling up to ``webhook_max_retry_delay``; ``webhook_timeout`` bounds one.

    A context manager (starts and installs). Thread-safe. After :meth:`stop` it can be started again on the same
    port with its state kept.
    """

    def __init__(self, *, token: str | None = None, max_long_poll: float | None = None,
                 latency: Mapping[str, float] | None = None, port: int = 0, first_update_id: int = 1000,
                 webhook_retry_delay: float = 0.05, webhook_max_retry_delay: float = 1.0,
                 webhook_timeout: float = 10.0) -> None:
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
        delays = {"webhook_retry_delay": webhook_retry_delay, "webhook_max_retry_delay": webhook_max_retry_delay,
                  "webhook_timeout": webhook_timeout}
        for name, value in delays.items():
            if not value >= 0:
                raise ConfigurationError(f"{name} must be >= 0 seconds, got {value!r}")
        self._token = token
        self._bot_id = int(bot_id_text)
        self._port = port
        self._cond = threading.Condition(threading.RLock())
        self._stopping = threading.Event()
        self._server: HttpServer | None = None
        self._previous_urls: tuple[str | None, str | None] | None = None
        self._records = Records(self._cond)
        self._faults = FaultScript(self._cond)
        self._chats = Chats(self._cond, self._bot_id, self._faults, self._records)
        self._updates = UpdateQueue(self._cond, self._stopping, first_update_id, max_long_poll)
        self._webhook = Webhook(self._cond, self._updates, self._stopping, retry_delay=webhook_retry_delay,
                                max_retry_delay=webhook_max_retry_delay, timeout=webhook_timeout)
        self._dispatch = Dispatcher(token=token, cond=self._cond, stopping=self._stopping, records=self._records,
                                    faults=self._faults, chats=self._chats, updates=self._updates,
                                    handlers=self._chats.table() | self._webhook.table())
        for method, seconds in (latency or {}).items():
            self.set_latency(method, seconds)

    @property
    def token(self) -> str:
        """The bot token this server accepts."""
        return self._token

    @property
    def bot_id(self) -> int:
        """The numeric bot id (the token's part before the colon)."""
        return self._bot_id

    @property
    def port(self) -> int:
        """The TCP port; 0 until the first :meth:`start`."""
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

    def start(self) -> FakeBotAPI:
        """Start serving (on the port of a previous run, if any); returns ``self``. ``OSError``: port not bound."""
        if self._server is not None:
            raise RuntimeError("FakeBotAPI is already running")
        self._stopping.clear()
        self._server = HttpServer(self._port, self._dispatch, self._records.add, self._stopping)
        self._port = self._server.port
        self._webhook.start(self._port)
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
        self._dispatch.add(name, handler)

    @property
    def internal_errors(self) -> list[BaseException]:
        """Exceptions the fake itself raised while answering (answered as 500); empty unless it has a bug."""
        with self._cond:
            return list(self._records.internal_errors)

    @property
    def confirmed_offset(self) -> int:
        """The highest ``offset`` a ``getUpdates`` sent (0 before any); updates below it are forgotten."""
        return self._updates.confirmed_offset

    @property
    def pending_count(self) -> int:
        """How many updates are queued and not yet confirmed."""
        return len(self._updates.pending)

    @property
    def next_update_id(self) -> int:
        """The ``update_id`` the next pushed update gets."""
        return self._updates.next_update_id

    @property
    def polling(self) -> bool:
        """True while a ``getUpdates`` call is being answered (e.g. waiting in a long poll)."""
        return self._updates.poller is not None

    @property
    def calls(self) -> list[Call]:
        """A copy of every request received so far, in arrival order."""
        with self._cond:
            return list(self._records.calls)

    @property
    def sent(self) -> list[Sent]:
        """A copy of every message accepted so far (sends and edits), in order."""
        with self._cond:
            return list(self._records.sent)

    def sent_to(self, chat_id: int) -> list[Sent]:
        """The accepted messages for one chat, in order."""
        with self._cond:
            return [s for s in self._records.sent if s.chat_id == chat_id]

    def calls_to(self, method: str) -> list[Call]:
        """The requests for one method (case-insensitive), in order."""
        key = method.lower()
        with self._cond:
            return [c for c in self._records.calls if c.method.lower() == key]

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
        return self.wait_for(lambda: len(self._records.sent) >= n, timeout)

    def wait_confirmed(self, offset: int, timeout: float = 5.0) -> bool:
        """Block until a ``getUpdates`` confirmed up to ``offset`` (``confirmed_offset >= offset``)."""
        return self.wait_for(lambda: self._updates.confirmed_offset >= offset, timeout)
