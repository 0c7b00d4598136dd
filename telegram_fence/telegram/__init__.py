"""The thin layer over pyTelegramBotAPI: the only package that touches telebot's globals and exceptions.

- :mod:`.failures`: :func:`classify` turns any exception from a Bot API call into one
  :class:`~telegram_fence.errors.TelegramError` subclass; :func:`call` makes a telebot call and classifies its failure.
- :mod:`.masking`: :func:`mask_tokens` removes bot tokens from text; every log path and error message uses it.
- :mod:`.server`: :func:`api_server` / :func:`use_api_url` point telebot at another Bot API server.
- :mod:`.request_path`: :func:`install_request_sender` puts a function between telebot and HTTP for the life of a
  fence; :func:`telebot_get_updates` and :func:`direct_polling_allowed` give the poller telebot's request path.

This package re-exports those names, so callers write ``telegram.classify(...)`` whichever module holds it.
"""

from __future__ import annotations

from .failures import call, classify, from_answer, from_http_status, is_certificate_failure, never_left
from .masking import mask_tokens, token_pattern
from .request_path import (
    Answer,
    Forward,
    RequestSender,
    direct_polling_allowed,
    install_request_sender,
    method_of_url,
    prepare,
    prepare_request,
    send_request,
    telebot_get_updates,
    written,
)
from .server import API_URL_ENV, api_server, api_url, api_url_formats, set_api_server, use_api_url

__all__ = [
    "API_URL_ENV",
    "Answer",
    "Forward",
    "RequestSender",
    "api_server",
    "api_url",
    "api_url_formats",
    "call",
    "classify",
    "direct_polling_allowed",
    "from_answer",
    "from_http_status",
    "install_request_sender",
    "is_certificate_failure",
    "mask_tokens",
    "method_of_url",
    "never_left",
    "prepare",
    "prepare_request",
    "send_request",
    "set_api_server",
    "telebot_get_updates",
    "token_pattern",
    "use_api_url",
    "written",
]
