"""JSON log lines for the standard library's :mod:`logging`, in pino's shape (the promises are in docs/operations.md).

:class:`JsonFormatter` turns a record into one masked, bounded JSON line and never raises;
:class:`JsonLineHandler` writes each line with one ``write()``; :func:`configure_logging` sets both up.
"""

from __future__ import annotations

from .convert import MIN_LINE_BYTES as MIN_LINE_BYTES
from .convert import pino_level
from .formatter import JsonFormatter
from .handler import JsonLineHandler, configure_logging

__all__ = ["JsonFormatter", "JsonLineHandler", "configure_logging", "pino_level"]
