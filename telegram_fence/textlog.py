"""Readable one-line log records on stderr for a program that configured no logging.

While :meth:`~telegram_fence.Fence.run` runs (or from :meth:`~telegram_fence.Fence.start` to
:meth:`~telegram_fence.Fence.join`), and only when neither the root nor the ``telegram_fence`` logger has a handler,
``telegram_fence`` records of WARNING and above go to stderr. Nothing is installed at import.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    """``TIME LEVEL LOGGER: MESSAGE key=value ...``: the record's ``extra`` fields appended to one line.

    An exception among the extras is written as ``Type: message``; a record's ``exc_info`` adds its
    traceback on the following lines. Extras listed under :data:`IN_MESSAGE` are left out (the message
    already says them). Bot tokens are masked everywhere. Never raises for a record
    whose message or extras misbehave (their ``repr`` is used instead).
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        try:
            line = super().format(record)
        except Exception:
            line = f"{self.formatTime(record)} {record.levelname} {record.name}: {record.msg!r}"
        head, _, rest = line.partition("\n")
        extras = []
        stated = getattr(record, IN_MESSAGE, ())
        for key, value in record.__dict__.items():
            if key in _RECORD_ATTRS or key.startswith("_") or key in stated:
                continue
            try:
                extras.append(f"{key}={_value(value)}")
            except Exception:
                extras.append(f"{key}=<unprintable {type(value).__name__}>")
        if extras:
            head = head + " " + " ".join(extras)
        return mask_tokens(head + ("\n" + rest if rest else ""))


def install_fallback(stream: Any = None) -> Callable[[], None]:
    """Send ``telegram_fence`` records to ``stream`` (default stderr) as readable lines from now on, only when
    neither the root logger nor the ``telegram_fence`` logger has a handler; return the function that undoes it.

    The undo removes the handler added (nothing when logging was configured) and may be called more than once.
    """
    package = logging.getLogger(_PACKAGE_LOGGER)
    if logging.getLogger().handlers or package.handlers:
        return lambda: None
    handler = _FallbackHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(TextFormatter())
    package.addHandler(handler)
    return lambda: package.removeHandler(handler)


class _FallbackHandler(logging.StreamHandler):
    """The fallback's stream handler: it steps aside once the program configures logging after all (a handler on
    the root logger, or another on ``telegram_fence``; waitress's ``serve()`` calls ``logging.basicConfig()``), so a
    record is never written twice, once here and once by the program's own handler."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers or any(h is not self for h in logging.getLogger(_PACKAGE_LOGGER).handlers):
            return
        super().emit(record)


@contextmanager
def fallback_logging(stream: Any = None) -> Iterator[logging.Handler | None]:
    """Inside the block, send ``telegram_fence`` records to ``stream`` (default stderr) as readable lines,
    only when neither the root logger nor the ``telegram_fence`` logger has a handler (see
    :func:`install_fallback`).

    Yields the handler added, or ``None`` when logging was configured. The handler is removed on
    exit, also when the block raises. Not meant to be nested from several threads at once.
    """
    package = logging.getLogger(_PACKAGE_LOGGER)
    before = list(package.handlers)
    undo = install_fallback(stream)
    added = [h for h in package.handlers if h not in before]
    try:
        yield added[0] if added else None
    finally:
        undo()
