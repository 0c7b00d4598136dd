"""Telegram-shaped answers of the fake Bot API (the refusal exception, its JSON body, parameter coercion) and what
it saw, for tests to read: requests, accepted messages, uploads."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.client import responses
from typing import Any

from ...errors import FenceError

__all__ = ["ApiError", "Call", "Handler", "Response", "Sent", "UploadedFile", "as_bool", "as_number", "error_response",
           "ok_response", "reason", "retry_header"]

#: One method: request parameters -> the ``result`` (raises :class:`ApiError` to refuse).
Handler = Callable[[dict[str, Any]], Any]

#: ``(status, body, content type, extra headers)``: one HTTP answer of the fake.
Response = tuple[int, bytes, str, list[tuple[str, str]]]


def reason(status: int) -> str:
    """The standard reason phrase of an HTTP status ("Error" for one without)."""
    return responses.get(status, "Error")


class ApiError(FenceError):
    """A Telegram-shaped refusal: answered as ``{"ok": false, "error_code": status, "description": ...}``.

    A method added with ``FakeBotAPI.add_method`` raises it to refuse; ``retry_after`` adds Telegram's 429 parameter.
    """

    def __init__(self, status: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after


def retry_header(error: ApiError) -> list[tuple[str, str]]:
    """The ``Retry-After`` header of a refusal that carries ``retry_after`` (else no header)."""
    return [("Retry-After", str(error.retry_after))] if error.retry_after is not None else []


def error_response(error: ApiError) -> Response:
    """Telegram's JSON error answer for ``error``."""
    body: dict[str, Any] = {"ok": False, "error_code": error.status, "description": error.description}
    if error.retry_after is not None:
        body["parameters"] = {"retry_after": error.retry_after}
    return error.status, json.dumps(body, ensure_ascii=False).encode(), "application/json", retry_header(error)


def ok_response(result: Any) -> Response:
    """Telegram's JSON success answer; ``bytes`` are taken as an already serialised JSON ``result``."""
    payload = result if isinstance(result, bytes) else json.dumps(result, ensure_ascii=False).encode()
    return 200, b'{"ok":true,"result":' + payload + b"}", "application/json", []


def as_number(params: Mapping[str, Any], key: str, kind: Callable[[Any], Any] = int, default: Any = None) -> Any:
    """``params[key]`` as ``kind`` (int or float), ``default`` when absent or empty; raises the 400 otherwise."""
    value = params.get(key)
    if value is None or value == "":
        return default
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ApiError(400, f"Bad Request: invalid {key} {value!r}") from None


def as_bool(value: Any) -> bool:
    """A form or JSON boolean: ``"true"``, ``"1"``, ``"yes"`` (any case) or a truthy JSON value."""
    return value.strip().lower() in ("true", "1", "yes") if isinstance(value, str) else bool(value)


@dataclass(frozen=True)
class UploadedFile:
    """A file part of a multipart request, as the fake server received it."""

    field: str
    filename: str | None
    content: bytes
    content_type: str | None = None


@dataclass(frozen=True)
class Call:
    """One HTTP request the fake server received (also refused or faulted ones): ``params`` merges the query string
    and the body (uploads as :class:`UploadedFile`); ``time`` is ``time.time()`` at its arrival."""

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
