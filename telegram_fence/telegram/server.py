"""Which Bot API server telebot talks to. The one module that changes telebot's ``API_URL``/``FILE_URL`` globals
(process-wide: :func:`api_server` is used once, around the life of the bots that need it).
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from telebot import apihelper

from ..errors import ConfigurationError

__all__ = ["API_URL_ENV", "api_server", "api_url", "api_url_formats", "set_api_server", "use_api_url"]


#: Guards telebot's server URLs (``apihelper.API_URL``, ``FILE_URL``) while they change.
_api_lock = threading.Lock()


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
