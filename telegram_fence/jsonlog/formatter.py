"""``JsonFormatter``: one log record → one pino-shaped JSON line that never raises and never holds a secret."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigurationError
from ..telegram import mask_tokens
from ..textlog import _RECORD_ATTRS
from .convert import (
    _CORE_KEYS,
    MIN_LINE_BYTES,
    _byte_len,
    _Converter,
    _cut,
    _escape_non_ascii,
    _fit_bytes,
    _safe_repr,
    _safe_str,
    _type_name,
    pino_level,
)


class JsonFormatter(logging.Formatter):
    """Formats a :class:`logging.LogRecord` as one pino-shaped JSON line (see docs/operations.md).

    ``secrets`` are strings masked wherever they appear (bot tokens are always masked); ``name`` is
    the application name written as ``name``; ``max_line_bytes`` caps the encoded line (at least
    :data:`MIN_LINE_BYTES`); ``max_cause_depth`` bounds the exception cause chain and ``max_depth``
    nested containers. Thread-safe: it keeps no per-record state. Bad settings raise
    :class:`~telegram_fence.errors.ConfigurationError`.
    """

    def __init__(
        self,
        *,
        secrets: Iterable[str] = (),
        name: str | None = None,
        max_line_bytes: int = 16 * 1024,
        max_cause_depth: int = 8,
        max_depth: int = 8,
        hostname: str | None = None,
    ) -> None:
        super().__init__()
        if isinstance(secrets, str):
            raise ConfigurationError("secrets must be a sequence of strings, not one string")
        secret_list = list(secrets)
        for secret in secret_list:
            if not isinstance(secret, str):
                raise ConfigurationError(f"secrets must be strings; got {type(secret).__name__}")
        # Longest first, so a secret that contains another is masked whole.
        self.secrets: tuple[str, ...] = tuple(sorted({s for s in secret_list if s}, key=len, reverse=True))
        if name is not None and not isinstance(name, str):
            raise ConfigurationError(f"name must be a string or None; got {type(name).__name__}")
        if not isinstance(max_line_bytes, int) or max_line_bytes < MIN_LINE_BYTES:
            raise ConfigurationError(f"max_line_bytes must be an int >= {MIN_LINE_BYTES}; got {max_line_bytes!r}")
        for label, number in (("max_cause_depth", max_cause_depth), ("max_depth", max_depth)):
            if not isinstance(number, int) or number < 1:
                raise ConfigurationError(f"{label} must be an int >= 1; got {number!r}")
        self.app_name = name
        self.max_line_bytes = max_line_bytes
        self.max_cause_depth = max_cause_depth
        self.max_depth = max_depth
        self.hostname = hostname if hostname is not None else _hostname()

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one JSON line (no newline). Never raises an ``Exception``."""
        try:
            return self._encode(self._payload(record))
        except Exception as exc:
            return self._fallback(record, exc)

    def _payload(self, record: logging.LogRecord) -> dict[str, Any]:
        conv = _Converter(self)
        logger_name = record.name if isinstance(record.name, str) else _safe_str(record.name)
        payload: dict[str, Any] = {
            "level": pino_level(record.levelno),
            "time": self._millis(record),
            "pid": record.process if isinstance(record.process, int) else os.getpid(),
            "hostname": conv.text(self.hostname),
            "name": conv.text(self.app_name if self.app_name is not None else logger_name),
        }
        if self.app_name is not None and logger_name != self.app_name:
            payload["logger"] = conv.text(logger_name)
        payload["msg"] = conv.text(self._message(record))
        exc_info = record.exc_info
        err: dict[str, Any] | None = None
        if exc_info and isinstance(exc_info, tuple) and len(exc_info) == 3 and exc_info[1] is not None:
            err = conv.exception(exc_info[1], tb=exc_info[2])
        elif isinstance(exc_info, BaseException):
            err = conv.exception(exc_info)
        # Without exc_info an extra named "err" is pino's convention and keeps its key.
        reserved = _CORE_KEYS if err is not None else _CORE_KEYS - {"err"}
        for key, value in list(record.__dict__.items()):
            if key in _RECORD_ATTRS or key.startswith("_"):
                continue
            out_key = conv.key(key)
            while out_key in reserved or out_key in payload:
                out_key += "_"
            payload[out_key] = conv.value(value)
        if err is not None:
            payload["err"] = err
        if record.stack_info:
            key = "stack_info"
            while key in payload:
                key += "_"
            payload[key] = conv.text(_safe_str(record.stack_info))
        return payload

    @staticmethod
    def _millis(record: logging.LogRecord) -> int:
        try:
            return int(record.created * 1000)
        except Exception:
            return int(time.time() * 1000)

    @staticmethod
    def _message(record: logging.LogRecord) -> str:
        try:
            return record.getMessage()
        except Exception as exc:
            args = _safe_repr(record.args)
            return f"{_safe_str(record.msg)} [message could not be formatted with args {args}: {_type_name(exc)}]"

    def _dump(self, payload: Mapping[str, Any]) -> str:
        line = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), check_circular=False)
        if not line.isascii():
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: no UTF-8 stream could write it
                line = _escape_non_ascii(line)
        return line

    def _encode(self, payload: dict[str, Any]) -> str:
        line = self._dump(payload)
        if _byte_len(line) <= self.max_line_bytes:
            return line
        return self._shrink(payload)

    def _shrink(self, payload: dict[str, Any]) -> str:
        cap = self.max_line_bytes
        limit = cap // 4
        while limit >= 32:
            cut = _cut(payload, limit, items=max(4, limit // 64))
            cut["truncated"] = True
            line = self._dump(cut)
            if _byte_len(line) <= cap:
                return line
            limit //= 4
        # Still too big (very many fields): keep the core and the error only.
        core = {k: payload[k] for k in ("level", "time", "pid", "hostname", "name", "logger") if k in payload}
        core = _cut(core, 200, items=4)
        err = payload.get("err")
        if isinstance(err, dict):
            core["err"] = {k: _cut(err.get(k), 256, items=4) for k in ("type", "message", "stack")}
            core["err"]["cause"] = None
        core["truncated"] = True
        core["msg"] = ""
        room = cap - _byte_len(self._dump(core)) - 64
        msg = payload.get("msg", "")
        core["msg"] = _fit_bytes(msg if isinstance(msg, str) else "", max(0, room))
        line = self._dump(core)
        if _byte_len(line) <= cap:
            return line
        core.pop("err", None)
        core["msg"] = _fit_bytes(core["msg"], max(0, room // 2))
        return self._dump(core)

    def _fallback(self, record: logging.LogRecord, error: BaseException) -> str:
        try:
            levelno = getattr(record, "levelno", logging.ERROR)
            raw = getattr(record, "msg", "")
            text = mask_tokens(_safe_str(raw), self.secrets)
            line: dict[str, Any] = {
                "level": pino_level(levelno if isinstance(levelno, int) else logging.ERROR),
                "time": int(time.time() * 1000),
                "pid": os.getpid(),
                "hostname": mask_tokens(self.hostname, self.secrets),
                "name": mask_tokens(self.app_name or _safe_str(getattr(record, "name", "")), self.secrets),
                "msg": _fit_bytes(text, self.max_line_bytes // 2),
                "format_error": mask_tokens(f"{_type_name(error)}: {_safe_str(error)}", self.secrets)[:500],
            }
            return json.dumps(line, ensure_ascii=True, separators=(",", ":"))
        except Exception:
            return json.dumps(
                {
                    "level": 50,
                    "time": int(time.time() * 1000),
                    "pid": os.getpid(),
                    "msg": "log record could not be formatted",
                    "format_error": "fallback failed",
                },
                separators=(",", ":"),
            )


_hostname_cache: str | None = None


def _hostname() -> str:
    global _hostname_cache
    if _hostname_cache is None:
        try:
            _hostname_cache = socket.gethostname()
        except Exception:
            _hostname_cache = "unknown"
    return _hostname_cache


