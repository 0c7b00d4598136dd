"""Fenced Telegram calls: every Bot API call a handler makes is journaled, replayed on retry, never sent twice.

``CallJournal`` (:mod:`.journaled`) is the fence's attempt extension and telebot's request sender;
:mod:`.journal` keeps the rows, :mod:`.verdicts` decides, :mod:`.limits` paces, :mod:`.frame` is the
per-attempt state and the handler-facing helpers (:func:`queue_calls`, :func:`uncertain_calls`).
"""

from __future__ import annotations

from .frame import UncertainCall, queue_calls, uncertain_calls
from .limits import Rates

__all__ = ["Rates", "UncertainCall", "queue_calls", "uncertain_calls"]
