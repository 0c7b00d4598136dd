"""Readable one-line log records on stderr for a program that configured no logging: while a fence runs, and only
when neither the root nor the ``telegram_fence`` logger has a handler. Nothing is installed at import."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from .telegram import mask_tokens

__all__ = ["IN_MESSAGE", "TextFormatter", "fallback_logging", "install_fallback"]

#: An ``extra`` key naming the other extras the message already states (``extra={..., IN_MESSAGE: ("retry_in",)}``):
#: the text line leaves them out, so a value is not printed twice; JSON lines keep every field.
IN_MESSAGE = "_in_message"

#: Attributes every LogRecord has; anything else came from ``extra=``.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}

_PACKAGE_LOGGER = "telegram_fence"


def _value(value: Any) -> str:
    if isinstance(value, BaseException):
        text = f"{type(value).__name__}: {value}" if str(value) else type(value).__name__
    else:
        text = str(value)
    text = text.replace("\n", " | ")
    return text if len(text) <= 500 else text[:497] + "..."


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE key=value ...``: the record's extras (but those under :data:`IN_MESSAGE`)
    appended, an exception among them as ``Type: message``, ``exc_info``'s traceback on the next lines, bot tokens
    masked. Never raises for a record whose message or extras misbehave."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        try:
            line = super().format(record)
        except Exception:
            line = f"{self.formatTime(record)} {record.levelname} {record.name}: {record.msg!r}"
        head, _, rest = line.partition("\n")
        stated = getattr(record, IN_MESSAGE, ())
        for key, value in record.__dict__.items():
            if key in _RECORD_ATTRS or key.startswith("_") or key in stated:
                continue
            try:
                head += f" {key}={_value(value)}"
            except Exception:
                head += f" {key}=<unprintable {type(value).__name__}>"
        return mask_tokens(head + ("\n" + rest if rest else ""))


def _configured(besides: logging.Handler | None = None) -> bool:
    """Whether the root logger, or the package's logger, has a handler (other than ``besides``)."""
    return bool(logging.getLogger().handlers) or any(
        h is not besides for h in logging.getLogger(_PACKAGE_LOGGER).handlers)


class _FallbackHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Steps aside once the program configures logging after all (waitress's ``serve()`` calls
    ``logging.basicConfig()``), so a record is never written twice."""

    def emit(self, record: logging.LogRecord) -> None:
        if not _configured(besides=self):
            super().emit(record)


@contextmanager
def fallback_logging(stream: Any = None) -> Iterator[logging.Handler | None]:
    """Inside the block, send ``telegram_fence`` records to ``stream`` (default stderr) as readable lines when
    neither the root nor the ``telegram_fence`` logger has a handler; yields the handler added (or ``None``) and
    removes it after, also when the block raises."""
    if _configured():
        yield None
        return
    package = logging.getLogger(_PACKAGE_LOGGER)
    handler = _FallbackHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(TextFormatter())
    package.addHandler(handler)
    try:
        yield handler
    finally:
        package.removeHandler(handler)


def install_fallback(stream: Any = None) -> Callable[[], None]:
    """:func:`fallback_logging` from now on; returns the function that undoes it (callable more than once)."""
    stack = ExitStack()
    stack.enter_context(fallback_logging(stream))
    return stack.close
