"""Turning anything a log record holds into JSON values: masked text, bounded containers, whole exceptions."""

from __future__ import annotations

import json
import logging
import math
import re
import traceback
from collections.abc import Mapping
from typing import Any, Protocol

from ..telegram import mask_tokens

#: The smallest ``max_line_bytes`` accepted: room for the core fields of a fallback line.
MIN_LINE_BYTES = 1024

_CORE_KEYS = frozenset({"level", "time", "pid", "hostname", "name", "logger", "msg", "err", "truncated"})
_EXC_KEYS = frozenset({"type", "message", "stack", "cause", "cycle", "truncated", "exceptions", "notes"})


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
        return repr(obj)
    except Exception as exc:  # a broken __repr__ (or one returning a non-str) must not break the line
        return f"<unrepresentable {_type_name(obj)}: {_type_name(exc)}>"


def _safe_str(obj: object) -> str:
    try:
        return obj if isinstance(obj, str) else str(obj)
    except Exception:
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


class _Limits(Protocol):
    """What a converter reads of its formatter: the secrets to mask and the bounds of one line."""

    @property
    def secrets(self) -> tuple[str, ...]: ...

    @property
    def max_line_bytes(self) -> int: ...

    @property
    def max_depth(self) -> int: ...

    @property
    def max_cause_depth(self) -> int: ...


class _Converter:
    """Turns arbitrary values into masked JSON values; one instance per formatted record (not shared)."""

    __slots__ = ("formatter", "secrets")

    def __init__(self, formatter: _Limits) -> None:
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
