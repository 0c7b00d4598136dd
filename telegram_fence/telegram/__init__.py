"""The thin layer over pyTelegramBotAPI: the only package that touches telebot's globals and exceptions."""

from __future__ import annotations

from .failures import call, causes, classify, from_answer, from_http_status, is_certificate_failure, never_left
from .masking import mask_tokens
from .request_path import (
    API_URL_ENV,
    Answer,
    Forward,
    RequestSender,
    api_server,
    api_url,
    api_url_formats,
    direct_polling_allowed,
    install_request_sender,
    method_of_url,
    prepare_request,
    set_api_server,
    use_api_url,
    written,
)

__all__ = [
    "API_URL_ENV", "Answer", "Forward", "RequestSender", "api_server", "api_url", "api_url_formats", "call",
    "causes", "classify", "direct_polling_allowed", "from_answer", "from_http_status", "install_request_sender",
    "is_certificate_failure", "mask_tokens", "method_of_url", "never_left", "prepare_request", "set_api_server",
    "use_api_url", "written"
]
