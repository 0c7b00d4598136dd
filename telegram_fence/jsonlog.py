"""JSON log lines for the standard library's :mod:`logging`, in pino's shape.

One JSON object per line, so the readers built for pino (``pino-pretty``, log shippers) keep working::

    {"level":50,"time":1732912345678,"pid":4242,"hostname":"box","name":"mybot",
     "logger":"telegram_fence.operator","msg":"operator message given up","chat_id":-100123,
     "err":{"type":"telegram_fence.errors.MessageRefused","message":"...","stack":"...","cause":null}}

Levels (pino number ← stdlib level):

====== ========================= =======================================
pino   stdlib                    note
====== ========================= =======================================
10     below DEBUG (e.g. 5)      pino's ``trace``; stdlib has no name for it
20     DEBUG (10-19)
30     INFO (20-29)
40     WARNING (30-39)           pino's ``warn``
50     ERROR (40-49)             **the error contract: level >= 50 is an error**
60     CRITICAL (50 and above)   pino's ``fatal``
====== ========================= =======================================

Promises of :class:`JsonFormatter`:

- ``time`` is the record's creation time in integer epoch milliseconds, ``msg`` the formatted message,
  ``pid`` and ``hostname`` identify the process, ``name`` is the configured application name (or the
  logger's name when none was configured), and ``logger`` the logger's name when it differs from ``name``.
- Every ``extra={...}`` field of the record becomes a field of the line. An extra whose key collides with
  a core key (``level``, ``time``, ``pid``, ``hostname``, ``name``, ``logger``, ``msg``, ``err``,
  ``truncated``) is written under the key with a trailing underscore (``time_``) instead of replacing it.
- An exception anywhere in the line — the record's ``exc_info`` (written under ``err``, pino's convention),
  an extra field, or nested inside dicts, lists, tuples and sets — becomes
  ``{"type", "message", "stack", "cause"}``; ``cause`` is the exception Python's own traceback would show
  as its cause (``__cause__``, else ``__context__`` unless suppressed by ``raise ... from None``), to a
  bounded depth; a cycle ends in an entry with ``"cycle": true``, a cut chain in one with
  ``"truncated": true``. Scalar and container attributes of the exception (``error_code``, ``method``,
  ``seconds``…) are kept too. An exception is never written as ``{}``.
- Every bot token (``<bot id>:<secret>``, also inside URLs such as ``/bot<token>/getUpdates``) and every
  string in ``secrets`` is replaced by ``***`` in every string of the line — message, keys, values, nested
  values, stack text. A number whose decimal text contains a secret becomes the string ``"***"``.
- Values JSON cannot encode are written as their ``repr()``; an object whose ``repr()`` raises is written as
  ``"<unrepresentable TYPE: ERROR>"``; containers are cut at a bounded depth.
- A line is at most ``max_line_bytes`` UTF-8 bytes (the newline not counted). A longer one is shortened —
  long strings first (keeping their head and tail), then extras — and marked ``"truncated": true``; it is
  still one valid JSON object.
- :meth:`JsonFormatter.format` never raises (an ``Exception``): when something unexpected breaks, it returns
  a fallback line with the level, time, masked message text and ``"format_error"``.

:class:`JsonLineHandler` writes each line with one ``write()`` under the handler's lock, so threads never
interleave parts of lines, and its error path never prints the record (which may hold a secret).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from .errors import ConfigurationError
from .telegram import mask_tokens

__all__ = [
    "JsonFormatter",
    "JsonLineHandler",
    "configure_logging",
    "pino_level",
]

#: The smallest ``max_line_bytes`` accepted: room for the core fields of a fallback line.
MIN_LINE_BYTES = 1024

_CORE_KEYS = frozenset({"level", "time", "pid", "hostname", "name", "logger", "msg", "err", "truncated"})
_EXC_KEYS = frozenset({"type", "message", "stack", "cause", "cycle", "truncated", "exceptions", "notes"})

# Attributes every LogRecord has; anything else in record.__dict__ came from ``extra=``.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

_LEVEL_NAMES: dict[str, int] = {
    "trace": 5,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
    "critical": logging.CRITICAL,
}

_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def pino_level(levelno: int) -> int:
    """Return pino's level number for a stdlib level number (see the module's table); never raises."""
    try:
        n = int(levelno)
    except (TypeError, ValueError):
        return 30
    if n < logging.DEBUG:
        return 10
    if n < logging.INFO:
        return 20
    if n < logging.WARNING:
        return 30
    if n < logging.ERROR:
        return 40
    if n < logging.CRITICAL:
        return 50
    return 60


def _type_name(obj: object) -> str:
    try:
        cls = type(obj)
        module = getattr(cls, "__module__", "") or ""
        qualname = getattr(cls, "__qualname__", None) or cls.__name__
        if module in ("builtins", "__main__", ""):
            return str(qualname)
        return f"{module}.{qualname}"
    except Exception:
        return "object"


def _safe_repr(obj: object) -> str:
    try:
        text = repr(obj)
        if isinstance(text, str):
            return text
        return f"<unrepresentable {_type_name(obj)}: __repr__ returned {type(text).__name__}>"
    except Exception as exc:  # a broken __repr__ must not break the line
        return f"<unrepresentable {_type_name(obj)}: {_type_name(exc)}>"


def _safe_str(obj: object) -> str:
    if isinstance(obj, str):
        return obj
    try:
        text = str(obj)
        if isinstance(text, str):
            return text
    except Exception:
        pass
    return _safe_repr(obj)


def _byte_len(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def _escape_non_ascii(line: str) -> str:
    # Non-ASCII characters appear only inside JSON strings, where \\uXXXX is always valid.
    return _NON_ASCII.sub(lambda m: json.dumps(m.group(0))[1:-1], line)


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = max(1, limit // 2)
    tail = max(0, limit - head)
    cut = len(text) - head - tail
    return f"{text[:head]}…[{cut} chars cut]…{text[len(text) - tail :] if tail else ''}"


class _Converter:
    """Turns arbitrary values into masked JSON values; one instance per formatted record (not shared)."""

    __slots__ = ("formatter", "secrets")

    def __init__(self, formatter: JsonFormatter) -> None:
        self.formatter = formatter
        self.secrets = formatter.secrets

    def text(self, value: str) -> str:
        # Mask before cutting: a cut through a token would leave part of it unmasked.
        if ":" in value:  # every bot token has one; most strings do not, and skip the regex
            masked = mask_tokens(value, self.secrets)
        else:
            masked = value
            for secret in self.secrets:
                if secret in masked:
                    masked = masked.replace(secret, "***")
        if len(masked) > self.formatter.max_line_bytes:
            return _shorten(masked, self.formatter.max_line_bytes)
        return masked

    def key(self, key: object) -> str:
        return self.text(key if isinstance(key, str) else _safe_str(key))

    def value(self, value: Any, depth: int = 0, path: frozenset[int] = frozenset()) -> Any:
        if value is None or value is True or value is False:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, int):
            return self._int(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                return repr(value)
            if self.secrets and any(s in repr(value) for s in self.secrets if s):
                return "***"
            return value
        if isinstance(value, BaseException):
            if depth >= self.formatter.max_depth:
                head = self._exc_head(value)
                head["truncated"] = True
                return head
            return self.exception(value, depth, path)
        if isinstance(value, (dict, list, tuple, set, frozenset, Mapping)):
            if depth >= self.formatter.max_depth:
                return f"<{_type_name(value)} cut at depth {self.formatter.max_depth}>"
            if id(value) in path:
                return f"<cycle: {_type_name(value)}>"
            inner = path | {id(value)}
            if isinstance(value, Mapping):
                return {self.key(k): self.value(v, depth + 1, inner) for k, v in list(value.items())}
            return [self.value(v, depth + 1, inner) for v in list(value)]
        return self.text(_safe_repr(value))

    def _int(self, value: int) -> Any:
        if value.bit_length() > 3000:  # beyond sys.get_int_max_str_digits on some builds
            return f"<int of {value.bit_length()} bits>"
        if self.secrets:
            text = int.__repr__(value)
            if any(s in text for s in self.secrets if s):
                return "***"
        if type(value) is not int:
            return int(value)
        return value

    def exception(
        self,
        exc: BaseException,
        depth: int = 0,
        path: frozenset[int] = frozenset(),
        tb: Any = None,
    ) -> dict[str, Any]:
        """Serialise ``exc`` and its cause chain; cycles and over-long chains end in a marked entry."""
        chain_seen: set[int] = set()
        top: dict[str, Any] | None = None
        parent: dict[str, Any] | None = None
        current: BaseException | None = exc
        level = 0
        while current is not None:
            if id(current) in chain_seen or id(current) in path:
                entry = self._exc_head(current)
                entry["cycle"] = True
            elif level > self.formatter.max_cause_depth:
                entry = self._exc_head(current)
                entry["truncated"] = True
            else:
                entry = self._exc_entry(current, depth, path, tb if level == 0 else None)
            if parent is None:
                top = entry
            else:
                parent["cause"] = entry
            if entry.get("cycle") or entry.get("truncated"):
                break
            chain_seen.add(id(current))
            parent = entry
            current = self._cause_of(current)
            level += 1
        assert top is not None
        return top

    @staticmethod
    def _cause_of(exc: BaseException) -> BaseException | None:
        try:
            cause = exc.__cause__
            if cause is None and not exc.__suppress_context__:
                cause = exc.__context__
            return cause if isinstance(cause, BaseException) else None
        except Exception:
            return None

    def _message(self, exc: BaseException) -> str:
        try:
            return self.text(str(exc))
        except Exception:
            return f"<exception str() failed: {_type_name(exc)}>"

    def _exc_head(self, exc: BaseException) -> dict[str, Any]:
        return {"type": self.text(_type_name(exc)), "message": self._message(exc), "stack": "", "cause": None}

    def _exc_entry(self, exc: BaseException, depth: int, path: frozenset[int], tb: Any) -> dict[str, Any]:
        entry = self._exc_head(exc)
        try:
            trace = tb if tb is not None else exc.__traceback__
            lines = traceback.format_exception(type(exc), exc, trace, chain=False)
            entry["stack"] = self.text("".join(lines).rstrip("\n"))
        except Exception as fmt_exc:
            entry["stack"] = f"<traceback unavailable: {_type_name(fmt_exc)}>"
        inner = path | {id(exc)}
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, (list, tuple)) and notes:
            entry["notes"] = [self.text(_safe_str(n)) for n in notes[:20]]
        group = getattr(exc, "exceptions", None)
        if isinstance(group, (list, tuple)) and group and all(isinstance(e, BaseException) for e in group):
            entry["exceptions"] = [self.exception(e, depth + 1, inner) for e in group[:10]]
        attrs = getattr(exc, "__dict__", None)
        if isinstance(attrs, dict):
            for name, val in list(attrs.items())[:20]:
                if not isinstance(name, str) or name.startswith("_") or name in _EXC_KEYS:
                    continue
                if val is None or isinstance(val, (str, int, float, bool, dict, list, tuple, BaseException)):
                    entry[self.key(name)] = self.value(val, depth + 1, inner)
        return entry


class JsonFormatter(logging.Formatter):
    """Formats a :class:`logging.LogRecord` as one pino-shaped JSON line (see the module docstring).

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

    # -- public -------------------------------------------------------------------------------------

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one JSON line (no newline). Never raises an ``Exception``."""
        try:
            return self._encode(self._payload(record))
        except Exception as exc:
            return self._fallback(record, exc)

    def to_dict(self, record: logging.LogRecord) -> dict[str, Any]:
        """Return the JSON object :meth:`format` would write, before the line cap is applied."""
        return self._payload(record)

    # -- building ------------------------------------------------------------------------------------

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

    # -- encoding ------------------------------------------------------------------------------------

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


def _fit_bytes(text: str, limit: int) -> str:
    if _byte_len(text) <= limit:
        return text
    marker = "…[cut]"
    budget = max(0, limit - len(marker.encode("utf-8")))
    data = text.encode("utf-8", "surrogatepass")[:budget]
    return data.decode("utf-8", "ignore") + marker


def _cut(value: Any, limit: int, items: int) -> Any:
    if isinstance(value, str):
        return _shorten(value, limit)
    if isinstance(value, dict):
        keys = list(value)
        out = {k: _cut(value[k], limit, items) for k in keys[: items * 4]}
        if len(keys) > items * 4:
            out["…"] = f"{len(keys) - items * 4} fields cut"
        return out
    if isinstance(value, list):
        out_list = [_cut(v, limit, items) for v in value[:items]]
        if len(value) > items:
            out_list.append(f"…[{len(value) - items} items cut]")
        return out_list
    return value


_hostname_cache: str | None = None


def _hostname() -> str:
    global _hostname_cache
    if _hostname_cache is None:
        try:
            _hostname_cache = socket.gethostname()
        except Exception:
            _hostname_cache = "unknown"
    return _hostname_cache


class JsonLineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes each formatted record with exactly one ``write()`` under its lock.

    Thread-safe: concurrent threads produce whole lines, never interleaved parts. A record that cannot
    be written (closed stream, full disk) is counted in ``write_errors``; a short masked notice goes to
    ``sys.stderr`` while :data:`logging.raiseExceptions` is true. The record itself is never printed,
    unlike :class:`logging.StreamHandler`, whose error path would print its message and arguments.
    """

    def __init__(self, stream: IO[str] | None = None, formatter: logging.Formatter | None = None) -> None:
        super().__init__(stream if stream is not None else sys.stderr)
        self.setFormatter(formatter if formatter is not None else JsonFormatter())
        self.write_errors = 0
        self._error_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        """Format ``record`` and write it plus a newline in one call; never raises an ``Exception``."""
        try:
            line = self.format(record) + self.terminator
            with self.lock:  # type: ignore[union-attr]
                self.stream.write(line)
                self.flush()
        except RecursionError:
            raise
        except Exception as exc:
            self._write_failed(exc)

    def handleError(self, record: logging.LogRecord) -> None:
        """Count a failed write and print a masked notice; never prints the record."""
        self._write_failed(sys.exc_info()[1] or RuntimeError("unknown logging error"))

    def _write_failed(self, exc: BaseException) -> None:
        with self._error_lock:
            self.write_errors += 1
        if not logging.raiseExceptions:
            return
        secrets: Sequence[str] = getattr(self.formatter, "secrets", ())
        try:
            notice = mask_tokens(f"{_type_name(exc)}: {_safe_str(exc)}", secrets)[:300]
            err_stream = sys.stderr
            if err_stream is not None and err_stream is not self.stream:
                err_stream.write(f"telegram_fence.jsonlog: a log line could not be written ({notice})\n")
        except Exception:
            pass


def _level_number(level: int | str) -> int:
    if isinstance(level, bool):
        raise ConfigurationError(f"level must be a level name or number; got {level!r}")
    if isinstance(level, int):
        return level
    if isinstance(level, str):
        text = level.strip()
        if text.isdigit():
            return int(text)
        number = _LEVEL_NAMES.get(text.lower())
        if number is not None:
            return number
    raise ConfigurationError(
        f"level {level!r} is not a level: use a number or one of {', '.join(sorted(_LEVEL_NAMES))}"
    )


def configure_logging(
    stream: IO[str] | None = None,
    level: int | str = "INFO",
    secrets: Iterable[str] = (),
    name: str | None = None,
    *,
    max_line_bytes: int = 16 * 1024,
    logger: logging.Logger | str | None = None,
    force: bool = False,
) -> JsonLineHandler:
    """Send ``logger``'s records (the root logger by default) as JSON lines to ``stream`` (default stderr).

    Installs one :class:`JsonLineHandler` with a :class:`JsonFormatter` and sets the logger's level
    (a number or a name: trace, debug, info, warn/warning, error, fatal/critical). Calling it again
    replaces the handler an earlier call installed instead of adding a second one; ``force=True`` also
    removes (and closes) every other handler of that logger. Returns the handler. Raises
    :class:`~telegram_fence.errors.ConfigurationError` for a bad level, name, secret or size.
    """
    number = _level_number(level)
    formatter = JsonFormatter(secrets=secrets, name=name, max_line_bytes=max_line_bytes)
    target = logger if isinstance(logger, logging.Logger) else logging.getLogger(logger)
    handler = JsonLineHandler(stream if stream is not None else sys.stderr, formatter)
    handler._telegram_fence_installed = True  # type: ignore[attr-defined]
    for old in list(target.handlers):
        if force or getattr(old, "_telegram_fence_installed", False):
            target.removeHandler(old)
            if force or old is not handler:
                with contextlib.suppress(Exception):
                    old.close()
    target.addHandler(handler)
    target.setLevel(number)
    return handler
