"""``JsonLineHandler`` (one write per line, under the handler's lock) and :func:`configure_logging`."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import IO

from ..errors import ConfigurationError
from ..telegram import mask_tokens
from .convert import _LEVEL_NAMES, _safe_str, _type_name
from .formatter import JsonFormatter


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
