"""Telegram-shaped answers of the fake Bot API: the refusal exception, its JSON body, parameter coercion."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

from ...errors import FenceError

__all__ = [
    "ApiError", "Response", "as_bool", "as_number", "chat_dict", "error_response",
    "ok_response", "reason", "retry_header", "user_dict",
]

#: ``(status, body, content type, extra headers)``: one HTTP answer of the fake.
Response = tuple[int, bytes, str, list[tuple[str, str]]]


def reason(status: int) -> str:
    """The standard reason phrase of an HTTP status ("Error" for one without)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


class ApiError(FenceError):
    """A Telegram-shaped refusal: answered as ``{"ok": false, "error_code": status, "description": ...}``.

    Public as ``telegram_fence.testing.ApiError``: a method added with ``FakeBotAPI.add_method`` raises it to
    refuse (``ApiError(400, "Bad Request: ...")``; ``retry_after`` adds Telegram's 429 parameter).
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
    payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return error.status, payload, "application/json", retry_header(error)


def ok_response(result: Any) -> Response:
    """Telegram's JSON success answer; ``bytes`` are taken as an already serialised JSON ``result``."""
    if isinstance(result, bytes):
        payload = b'{"ok":true,"result":' + result + b"}"
    else:
        payload = json.dumps({"ok": True, "result": result}, separators=(",", ":"), ensure_ascii=False).encode()
    return 200, payload, "application/json", []


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
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def chat_dict(chat_id: int) -> dict[str, Any]:
    """The ``Chat`` object of ``chat_id``: private for positive ids, a (super)group for negative ones."""
    if chat_id > 0:
        return {"id": chat_id, "type": "private", "first_name": f"User {chat_id}"}
    kind = "supergroup" if chat_id <= -1_000_000_000_000 else "group"
    return {"id": chat_id, "type": kind, "title": f"Group {chat_id}"}


def user_dict(user_id: int) -> dict[str, Any]:
    """The ``User`` object of a human user ``user_id``."""
    return {"id": user_id, "is_bot": False, "first_name": f"User {user_id}", "language_code": "en"}
