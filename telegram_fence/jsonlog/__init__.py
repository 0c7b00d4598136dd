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

The package: :mod:`.convert` (values, text, exceptions), :mod:`.formatter` (:class:`JsonFormatter`),
:mod:`.handler` (:class:`JsonLineHandler`, :func:`configure_logging`).
"""

from __future__ import annotations

from .convert import MIN_LINE_BYTES as MIN_LINE_BYTES
from .convert import pino_level
from .formatter import JsonFormatter
from .handler import JsonLineHandler, configure_logging

__all__ = [
    "JsonFormatter",
    "JsonLineHandler",
    "configure_logging",
    "pino_level",
]
