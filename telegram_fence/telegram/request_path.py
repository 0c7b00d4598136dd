"""telebot's request path: how a Bot API request of this process reaches the server, and which server.

The one module that changes telebot's globals ``API_URL``/``FILE_URL`` and ``CUSTOM_REQUEST_SENDER`` (what
:func:`install_request_sender` puts between telebot and HTTP); :func:`written` says whether a failed request may
have left."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import requests
import requests.adapters
import urllib3
import urllib3.connection
from telebot import apihelper

from ..errors import ConfigurationError

__all__ = [
    "API_URL_ENV", "Answer", "Forward", "RequestSender", "api_server", "api_url", "api_url_formats",
    "direct_polling_allowed", "install_request_sender", "method_of_url", "prepare_request",
    "set_api_server", "use_api_url", "written"
]

#: Guards telebot's globals (``API_URL``, ``FILE_URL``, ``CUSTOM_REQUEST_SENDER``) while they change.
_api_lock = threading.Lock()


def direct_polling_allowed() -> bool:
    """Whether the poller may use its own connection: not when telebot sends its own way (``apihelper.proxy``, a
    ``session``, a ``CUSTOM_REQUEST_SENDER``) or the environment names a proxy."""
    if apihelper.proxy or getattr(apihelper, "session", None) is not None:
        return False
    if _foreign_sender(getattr(apihelper, "CUSTOM_REQUEST_SENDER", None)) is not None:
        return False
    return not any(scheme != "no" for scheme in urllib.request.getproxies())  # NO_PROXY alone names no proxy


class Answer:
    """A journaled HTTP answer as telebot reads it (``status_code``, ``reason``, ``text``, ``json()``,
    ``headers``): a replayed call gives telebot the very bytes the server sent. Immutable."""

    __slots__ = ("headers", "reason", "status_code", "text")

    def __init__(self, status_code: int, text: str) -> None:
        self.status_code = status_code
        self.text = text
        self.reason = http.client.responses.get(status_code, "")
        self.headers: dict[str, str] = {}

    def json(self) -> Any:
        """The body parsed as JSON; raises ``ValueError`` when it is not JSON (as ``requests`` does)."""
        return json.loads(self.text)


class Forward:
    """How a request reaches the server, as an installed sender gets it: ``forward(http_method, url, params, files,
    timeout, proxies)`` sends through ``previous`` (the application's own sender) when there is one, else the way
    telebot does without one."""

    __slots__ = ("previous",)

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, method: str, url: str, params: Any, files: Any, timeout: Any, proxies: Any) -> Any:
        return self.prepare(method, url, params, files, timeout, proxies)()

    def prepare(self, method: str, url: str, params: Any, files: Any, timeout: Any,
                proxies: Any) -> Callable[[], Any]:
        """The function that sends the request (again, when called again), built here when it goes as telebot
        sends (so whatever this raises certainly never left); through an application's own sender it calls that."""
        previous = self.previous
        if previous is None:
            return _built(method, url, params, files, timeout, proxies)
        return _fresh(lambda: previous(method, url, params=params, files=files, timeout=timeout, proxies=proxies))


#: What :func:`install_request_sender` installs: ``sender(http_method, url, params, files, timeout, proxies,
#: forward)`` returns an answer (anything with ``status_code``, ``text`` and ``json()``).
RequestSender = Callable[[str, str, Any, Any, Any, Any, Forward], Any]


class _Installed:
    """The function set as ``CUSTOM_REQUEST_SENDER`` while a fence runs; ``previous`` is what it replaced."""

    def __init__(self, sender: RequestSender, previous: Any) -> None:
        self.sender: RequestSender | None = sender
        self.previous = previous
        self._forward = Forward(previous)

    def __call__(self, method: str, url: str, params: Any = None, files: Any = None, timeout: Any = None,
                 proxies: Any = None) -> Any:
        sender = self.sender
        if sender is None:  # uninstalled while another sender wrapped this one: step aside
            return self._forward(method, url, params, files, timeout, proxies)
        return sender(method, url, params, files, timeout, proxies, self._forward)


def _built(method: str, url: str, params: Any, files: Any, timeout: Any, proxies: Any) -> Callable[[], Any]:
    """The request telebot's session would send, built now (raising what building raises), and the function that
    sends it; telebot's default session is replaced by a watched one (see :func:`written`)."""
    session = _watched_session()
    prepared = session.prepare_request(requests.Request(method.upper(), url, params=params, files=files))
    settings = session.merge_environment_settings(str(prepared.url), proxies or {}, None, None, None)
    return _fresh(lambda: session.send(prepared, timeout=timeout, allow_redirects=True, **settings))


def _fresh(send_it: Callable[[], Any]) -> Callable[[], Any]:
    """``send_it`` with this thread's :data:`_STATE` cleared before each call (a new request)."""
    def send() -> Any:
        _STATE.phase = None
        return send_it()

    return send


class _State(threading.local):
    phase: str | None = None  # None: no watched connection reached; "before"; "written": a byte may have left


_STATE = _State()


def written() -> bool | None:
    """Whether the request this thread sent last through :meth:`Forward.prepare` may have left: ``False`` when it failed
    before its first byte was written, ``True`` when one may have been, ``None`` when not known (an application's
    own sender or session, a SOCKS proxy)."""
    phase = _STATE.phase
    return None if phase is None else phase == "written"


class _Watch:
    """Notes in :data:`_STATE` what a connection did with this thread's request (mixed into urllib3's)."""

    sock: Any

    def connect(self) -> None:
        _STATE.phase = _STATE.phase or "before"
        super().connect()  # type: ignore[misc]

    def request(self, *args: Any, **kwargs: Any) -> None:
        _STATE.phase = _STATE.phase or "before"
        super().request(*args, **kwargs)  # type: ignore[misc]

    def send(self, data: Any) -> None:
        if self.sock is None:  # connected first (nothing of the request written while connecting)
            self.connect()
        _STATE.phase = "written"
        super().send(data)  # type: ignore[misc]


class _WatchedHTTP(_Watch, urllib3.connection.HTTPConnection):
    pass


class _WatchedHTTPS(_Watch, urllib3.connection.HTTPSConnection):
    pass


_WATCHED_POOLS = {
    "http": type("_WatchedHTTPPool", (urllib3.HTTPConnectionPool,), {"ConnectionCls": _WatchedHTTP}),
    "https": type("_WatchedHTTPSPool", (urllib3.HTTPSConnectionPool,), {"ConnectionCls": _WatchedHTTPS}),
}


class _WatchedAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter whose connections note when a request's first byte is written (not through SOCKS)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _WATCHED_POOLS  # type: ignore[assignment]

    def proxy_manager_for(self, proxy: Any, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if type(manager) is urllib3.ProxyManager:
            manager.pool_classes_by_scheme = _WATCHED_POOLS
        return manager


class _Sessions(threading.local):
    session: requests.Session | None = None
    made = 0.0


_SESSIONS = _Sessions()


def _watched_session() -> requests.Session:
    """This thread's watched session where telebot would use its default one (renewed after
    ``SESSION_TIME_TO_LIVE``, as telebot's is), else telebot's own ``apihelper.session``."""
    if apihelper.session is not None:
        return apihelper._get_req_session()
    local = _SESSIONS
    session = local.session
    ttl = apihelper.SESSION_TIME_TO_LIVE
    now = time.monotonic()
    if session is not None and ttl is not None and now - local.made > ttl:
        session.close()
        session = None
    if session is None:
        session = local.session = requests.Session()
        local.made = now
        adapter = _WatchedAdapter()
        session.mount("https://", adapter)
        session.mount("http://", adapter)
    return session


def _foreign_sender(sender: Any) -> Any:
    """The first request sender in the chain that is not one a fence installed (``None`` when there is none)."""
    while isinstance(sender, _Installed):
        sender = sender.previous
    return sender


def _live(sender: Any) -> Any:
    """``sender`` without the senders at its head undone while another was installed on top of them (two fences
    stopped in the order they started)."""
    while isinstance(sender, _Installed) and sender.sender is None:
        sender = sender.previous
    return sender


def install_request_sender(sender: RequestSender) -> Callable[[], None]:
    """Route every telebot request of this process through ``sender`` (an application's own sender is what
    ``forward`` calls); the function returned undoes it, or makes it pass requests through when something was
    installed on top since. Safe from any thread."""
    with _api_lock:
        installed = _Installed(sender, apihelper.CUSTOM_REQUEST_SENDER)
        apihelper.CUSTOM_REQUEST_SENDER = installed  # type: ignore[assignment]  # telebot declares it None

    def undo() -> None:
        with _api_lock:
            installed.sender = None
            if apihelper.CUSTOM_REQUEST_SENDER is installed:
                apihelper.CUSTOM_REQUEST_SENDER = _live(installed.previous)

    return undo


def prepare_request(method: str, url: str, params: Any = None, files: Any = None,
                    timeout: Any = None) -> Callable[[], Any]:
    """A request sent the way telebot would without a fence (the application's own sender, else telebot's
    session), built now as :meth:`Forward.prepare` does; the returned function sends it."""
    if timeout is None:
        timeout = (apihelper.CONNECT_TIMEOUT, apihelper.READ_TIMEOUT)
    return Forward(_foreign_sender(apihelper.CUSTOM_REQUEST_SENDER)).prepare(method, url, params, files, timeout,
                                                                             apihelper.proxy)


def method_of_url(url: str) -> str:
    """The Bot API method a telebot request URL names (its last path segment), e.g. ``sendMessage``."""
    path = urllib.parse.urlsplit(url).path
    return path.rstrip("/").rpartition("/")[2]


@contextmanager
def api_server(api_url: str, file_url: str | None = None) -> Iterator[None]:
    """Point every telebot bot of this process at ``api_url`` (``{0}`` the token, ``{1}`` the method, e.g.
    ``"http://127.0.0.1:8081/bot{0}/{1}"``) and ``file_url`` inside the block; restored after. Process-wide:
    nest blocks, do not interleave them from several threads."""
    previous = set_api_server(api_url, apihelper.FILE_URL if file_url is None else file_url)
    try:
        yield
    finally:
        set_api_server(*previous)


def set_api_server(api_url: str | None, file_url: str | None = None) -> tuple[str | None, str | None]:
    """Set telebot's server URLs (``None``: api.telegram.org); returns the previous ``(api_url, file_url)``."""
    with _api_lock:
        previous = (apihelper.API_URL, apihelper.FILE_URL)
        apihelper.API_URL = api_url  # type: ignore[assignment]  # telebot declares these None
        apihelper.FILE_URL = file_url  # type: ignore[assignment]
        return previous


#: The environment variable the command line and the examples read a Bot API server's URL from.
API_URL_ENV = "TELEGRAM_API_URL"


def api_url_formats(url: str) -> tuple[str, str | None]:
    """telebot's ``(API_URL, FILE_URL)`` formats for ``url``: telebot's own format (``http://host:port/bot{0}/{1}``;
    a file URL only when it ends so) or a base URL (``http://host:port[/prefix]``). Raises
    :class:`ConfigurationError` for anything that is not an ``http(s)://host`` URL."""
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
    """Point telebot (process-wide: once, before the bots start) at ``url``, else ``$TELEGRAM_API_URL``; return the
    API format used, or ``None`` when neither is given. Raises :class:`ConfigurationError` for a malformed URL."""
    if url is None:
        url = (environ if environ is not None else os.environ).get(API_URL_ENV) or None
    if url is None:
        return None
    api, file_url = api_url_formats(url)
    set_api_server(api, file_url)
    return api


def api_url(token: str, method: str) -> str:
    """The URL of ``method`` for ``token`` on the Bot API server telebot is pointed at (``apihelper.API_URL``)."""
    base = apihelper.API_URL or "https://api.telegram.org/bot{0}/{1}"
    return base.format(token, method)
