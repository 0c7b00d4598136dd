"""JSON log lines for the standard library's :mod:`logging`, in pino's shape (promised in docs/operations.md): one
masked, bounded line per record (:class:`JsonFormatter`), written with one ``write()`` (:class:`JsonLineHandler`)."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import re
import socket
import sys
import time
import traceback
from collections.abc import Iterable, Mapping
from typing import IO, Any

from .errors import ConfigurationError
from .telegram import mask_tokens
from .textlog import _RECORD_ATTRS

__all__ = ["JsonFormatter", "JsonLineHandler", "configure_logging", "pino_level"]

#: The smallest ``max_line_bytes`` accepted: room for the core fields of a fallback line.
MIN_LINE_BYTES = 1024

_CORE_KEYS = frozenset({"level", "time", "pid", "hostname", "name", "logger", "msg", "err", "truncated"})
_EXC_KEYS = frozenset({"type", "message", "stack", "cause", "cycle", "truncated"})
_LEVEL_NAMES: dict[str, int] = {
    "trace": 5, "debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING,
    "error": logging.ERROR, "fatal": logging.CRITICAL, "critical": logging.CRITICAL,
}
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def pino_level(levelno: int) -> int:
    """pino's level number (10 trace … 60 fatal) for a stdlib level number; 30 for anything not a number."""
    try:
        n = int(levelno)
    except (TypeError, ValueError):
        return 30
    return 10 + 10 * sum(n >= bound for bound in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
                                                  logging.CRITICAL))


def _type_name(obj: object) -> str:
    cls = type(obj)
    module = getattr(cls, "__module__", "") or ""
    return cls.__qualname__ if module in ("builtins", "__main__", "") else f"{module}.{cls.__qualname__}"


def _safe_repr(obj: object) -> str:
    try:
        return repr(obj)
    except Exception as exc:  # a broken __repr__ (or one returning a non-str) must not break the line
        return f"<unrepresentable {_type_name(obj)}: {_type_name(exc)}>"


def _safe_str(obj: object) -> str:
    try:
        return obj if isinstance(obj, str) else str(obj)
    except Exception:
        return _safe_repr(obj)


def _byte_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = max(1, limit // 2)
    tail = max(0, limit - head)
    return f"{text[:head]}…[{len(text) - head - tail} chars cut]…{text[len(text) - tail:] if tail else ''}"


def _fit_bytes(text: str, limit: int) -> str:
    if _byte_len(text) <= limit:
        return text
    marker = "…[cut]"
    data = text.encode("utf-8", "surrogatepass")[: max(0, limit - len(marker.encode("utf-8")))]
    return data.decode("utf-8", "ignore") + marker


def _cut(value: Any, limit: int, items: int) -> Any:
    """``value`` with strings shortened to ``limit`` characters and containers to about ``items`` entries."""
    if isinstance(value, str):
        return _shorten(value, limit)
    if isinstance(value, dict):
        out = {k: _cut(value[k], limit, items) for k in list(value)[: items * 4]}
        if len(value) > items * 4:
            out["…"] = f"{len(value) - items * 4} fields cut"
        return out
    if isinstance(value, list):
        out_list = [_cut(v, limit, items) for v in value[:items]]
        if len(value) > items:
            out_list.append(f"…[{len(value) - items} items cut]")
        return out_list
    return value


class JsonFormatter(logging.Formatter):
    """Formats a record as one pino-shaped JSON line (docs/operations.md): ``secrets`` (and bot tokens) masked,
    at most ``max_line_bytes``, ``max_cause_depth`` causes and ``max_depth`` nested containers. Thread-safe; bad
    settings raise :class:`~telegram_fence.errors.ConfigurationError`."""

    def __init__(self, *, secrets: Iterable[str] = (), name: str | None = None, max_line_bytes: int = 16 * 1024,
                 max_cause_depth: int = 8, max_depth: int = 8, hostname: str | None = None) -> None:
        super().__init__()
        secret_list = [] if isinstance(secrets, str) else list(secrets)
        if isinstance(secrets, str) or not all(isinstance(secret, str) for secret in secret_list):
            raise ConfigurationError("secrets must be a sequence of strings (not one string)")
        # Longest first, so a secret that contains another is masked whole.
        self.secrets: tuple[str, ...] = tuple(sorted({s for s in secret_list if s}, key=len, reverse=True))
        if name is not None and not isinstance(name, str):
            raise ConfigurationError(f"name must be a string or None; got {type(name).__name__}")
        if not isinstance(max_line_bytes, int) or max_line_bytes < MIN_LINE_BYTES:
            raise ConfigurationError(f"max_line_bytes must be an int >= {MIN_LINE_BYTES}; got {max_line_bytes!r}")
        for label, number in (("max_cause_depth", max_cause_depth), ("max_depth", max_depth)):
            if not isinstance(number, int) or number < 1:
                raise ConfigurationError(f"{label} must be an int >= 1; got {number!r}")
        self.app_name, self.max_line_bytes, self.max_cause_depth, self.max_depth = (
            name, max_line_bytes, max_cause_depth, max_depth)
        self.hostname = hostname if hostname is not None else socket.gethostname()

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON line (no newline). Never raises an ``Exception``."""
        try:
            payload = self._payload(record)
            line = self._dump(payload)
            return line if _byte_len(line) <= self.max_line_bytes else self._shrink(payload)
        except Exception as exc:
            return self._fallback(record, exc)

    def _text(self, value: str) -> str:
        # Masked before cutting: a cut through a token would leave part of it.
        return _shorten(mask_tokens(value, self.secrets), self.max_line_bytes)

    def _key(self, key: object) -> str:
        return self._text(key if isinstance(key, str) else _safe_str(key))

    def _holds_secret(self, text: str) -> bool:
        return any(s in text for s in self.secrets)

    def _value(self, value: Any, depth: int = 0, path: frozenset[int] = frozenset()) -> Any:
        if value is None or value is True or value is False:
            return value
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, int):
            if value.bit_length() > 3000:  # beyond sys.get_int_max_str_digits on some builds
                return f"<int of {value.bit_length()} bits>"
            return "***" if self.secrets and self._holds_secret(int.__repr__(value)) else int(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                return repr(value)
            return "***" if self.secrets and self._holds_secret(repr(value)) else value
        max_depth = self.max_depth
        if isinstance(value, BaseException):
            if depth >= max_depth:
                return {**self._exc_head(value), "truncated": True}
            return self._exception(value, depth, path)
        if isinstance(value, (dict, list, tuple, set, frozenset, Mapping)):
            if depth >= max_depth:
                return f"<{_type_name(value)} cut at depth {max_depth}>"
            if id(value) in path:
                return f"<cycle: {_type_name(value)}>"
            inner = path | {id(value)}
            if isinstance(value, Mapping):
                return {self._key(k): self._value(v, depth + 1, inner) for k, v in list(value.items())}
            return [self._value(v, depth + 1, inner) for v in list(value)]
        return self._text(_safe_repr(value))

    def _exception(self, exc: BaseException, depth: int = 0, path: frozenset[int] = frozenset()) -> dict[str, Any]:
        """``exc`` and its cause chain; a cycle or a chain past ``max_cause_depth`` ends in a marked entry."""
        chain: list[dict[str, Any]] = []
        seen = set(path)
        current: BaseException | None = exc
        while current is not None:
            if id(current) in seen or len(chain) > self.max_cause_depth:
                chain.append({**self._exc_head(current), "cycle" if id(current) in seen else "truncated": True})
                break
            seen.add(id(current))
            chain.append(self._exc_entry(current, depth, path))
            current = current.__cause__ if current.__cause__ is not None or current.__suppress_context__ \
                else current.__context__
        for outer, inner in itertools.pairwise(chain):
            outer["cause"] = inner
        return chain[0]

    def _exc_head(self, exc: BaseException) -> dict[str, Any]:
        try:
            message = self._text(str(exc))
        except Exception:
            message = f"<exception str() failed: {_type_name(exc)}>"
        return {"type": self._text(_type_name(exc)), "message": message, "stack": "", "cause": None}

    def _exc_entry(self, exc: BaseException, depth: int, path: frozenset[int]) -> dict[str, Any]:
        """``exc`` without its cause: type, message, its traceback (with its notes and, for a group, its members'
        tracebacks) as ``stack``, and its public attributes of a JSON kind."""
        entry = self._exc_head(exc)
        try:
            lines = traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False)
            entry["stack"] = self._text("".join(lines).rstrip("\n"))
        except Exception as fmt_exc:  # a __str__ that raises
            entry["stack"] = f"<traceback unavailable: {_type_name(fmt_exc)}>"
        for name, val in list(getattr(exc, "__dict__", {}).items())[:20]:
            if isinstance(name, str) and not name.startswith("_") and name not in _EXC_KEYS and (
                    val is None or isinstance(val, (str, int, float, bool, dict, list, tuple, BaseException))):
                entry[self._key(name)] = self._value(val, depth + 1, path | {id(exc)})
        return entry

    def _payload(self, record: logging.LogRecord) -> dict[str, Any]:
        logger_name = _safe_str(record.name)
        payload: dict[str, Any] = {
            "level": pino_level(record.levelno),
            "time": int(record.created * 1000),
            "pid": record.process if isinstance(record.process, int) else os.getpid(),
            "hostname": self._text(self.hostname),
            "name": self._text(self.app_name if self.app_name is not None else logger_name),
        }
        if self.app_name is not None and logger_name != self.app_name:
            payload["logger"] = self._text(logger_name)
        try:
            message = record.getMessage()
        except Exception as exc:
            message = (f"{_safe_str(record.msg)} [message could not be formatted with args "
                       f"{_safe_repr(record.args)}: {_type_name(exc)}]")
        payload["msg"] = self._text(message)
        error = record.exc_info[1] if isinstance(record.exc_info, tuple) else record.exc_info
        err = self._exception(error) if isinstance(error, BaseException) else None
        # Without exc_info an extra named "err" is pino's convention and keeps its key.
        reserved = _CORE_KEYS if err is not None else _CORE_KEYS - {"err"}
        fields = [(key, value) for key, value in list(record.__dict__.items())
                  if key not in _RECORD_ATTRS and not key.startswith("_")]
        for key, value in fields + ([("stack_info", record.stack_info)] if record.stack_info else []):
            out_key = self._key(key)
            while out_key in reserved or out_key in payload:
                out_key += "_"
            payload[out_key] = self._value(value)
        if err is not None:
            payload["err"] = err
        return payload

    @staticmethod
    def _dump(payload: Mapping[str, Any]) -> str:
        line = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), check_circular=False)
        if not line.isascii():
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: escape non-ASCII (it stands only inside JSON strings)
                line = _NON_ASCII.sub(lambda m: json.dumps(m.group(0))[1:-1], line)
        return line

    def _shrink(self, payload: dict[str, Any]) -> str:
        """``payload`` cut to fit ``max_line_bytes``: strings and containers shorter and shorter, then only the core
        fields, the error's type and message and as much of the message as fits; marked ``truncated``."""
        cap = self.max_line_bytes
        limit = cap // 4
        while limit >= 32:
            cut = _cut(payload, limit, items=max(4, limit // 64))
            cut["truncated"] = True
            line = self._dump(cut)
            if _byte_len(line) <= cap:
                return line
            limit //= 4
        short = cap // 32  # five strings of at most 4 bytes a character: well within the line
        core = _cut({k: payload[k] for k in ("level", "time", "pid", "hostname", "name", "logger") if k in payload},
                    short, items=4)
        err = payload.get("err")
        if isinstance(err, dict):
            core["err"] = {k: _cut(err.get(k), short, items=4) for k in ("type", "message")}
        core["truncated"] = True
        core["msg"] = _fit_bytes(payload["msg"], cap - _byte_len(self._dump(core)) - 64)
        return self._dump(core)

    def _fallback(self, record: logging.LogRecord, error: BaseException) -> str:
        """The line of a record that could not be formatted: its level, time, masked message and the failure."""
        levelno = getattr(record, "levelno", logging.ERROR)
        line: dict[str, Any] = {
            "level": pino_level(levelno if isinstance(levelno, int) else logging.ERROR),
            "time": int(time.time() * 1000),
            "pid": os.getpid(),
            "hostname": mask_tokens(self.hostname, self.secrets),
            "name": mask_tokens(self.app_name or _safe_str(getattr(record, "name", "")), self.secrets),
            "msg": _fit_bytes(mask_tokens(_safe_str(getattr(record, "msg", "")), self.secrets),
                              self.max_line_bytes // 2),
            "format_error": mask_tokens(f"{_type_name(error)}: {_safe_str(error)}", self.secrets)[:500],
        }
        return json.dumps(line, ensure_ascii=True, separators=(",", ":"))


class JsonLineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes each record with one ``write()`` under its lock (``handle()`` holds it, so
    lines never interleave). A record that cannot be written is counted in ``write_errors`` with a short masked
    notice on stderr (while :data:`logging.raiseExceptions`), never printed itself."""

    def __init__(self, stream: IO[str] | None = None, formatter: logging.Formatter | None = None) -> None:
        super().__init__(stream if stream is not None else sys.stderr)
        self.setFormatter(formatter if formatter is not None else JsonFormatter())
        self.write_errors = 0

    def handleError(self, record: logging.LogRecord) -> None:
        """Count a record :meth:`emit` could not write and say so on stderr, masked; never print the record."""
        self.write_errors += 1  # under the handler's lock: handle() holds it around emit()
        exc = sys.exc_info()[1]
        if logging.raiseExceptions and sys.stderr is not None and sys.stderr is not self.stream:
            notice = mask_tokens(f"{_type_name(exc)}: {_safe_str(exc)}", getattr(self.formatter, "secrets", ()))
            with contextlib.suppress(Exception):
                sys.stderr.write(f"telegram_fence.jsonlog: a log line could not be written ({notice[:300]})\n")


def _level_number(level: int | str) -> int:
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    text = str(level).strip().lower()
    if text.isdigit() or text in _LEVEL_NAMES:
        return int(text) if text.isdigit() else _LEVEL_NAMES[text]
    raise ConfigurationError(f"level {level!r} is not a level: use a number or one of "
                             f"{', '.join(sorted(_LEVEL_NAMES))}")


def configure_logging(stream: IO[str] | None = None, level: int | str = "INFO", secrets: Iterable[str] = (),
                      name: str | None = None, *, max_line_bytes: int = 16 * 1024,
                      logger: logging.Logger | str | None = None, force: bool = False) -> JsonLineHandler:
    """Send ``logger``'s (default root's) records as JSON lines to ``stream`` (default stderr) through one
    :class:`JsonLineHandler` (replacing the one installed before; ``force``: every handler) at ``level`` (a number,
    a pino or stdlib name); returns it. A bad level, name, secret or size raises ConfigurationError."""
    number = _level_number(level)
    formatter = JsonFormatter(secrets=secrets, name=name, max_line_bytes=max_line_bytes)
    target = logger if isinstance(logger, logging.Logger) else logging.getLogger(logger)
    handler = JsonLineHandler(stream if stream is not None else sys.stderr, formatter)
    handler._telegram_fence_installed = True  # type: ignore[attr-defined]
    for old in list(target.handlers):
        if force or getattr(old, "_telegram_fence_installed", False):
            target.removeHandler(old)
            with contextlib.suppress(Exception):
                old.close()
    target.addHandler(handler)
    target.setLevel(number)
    return handler
