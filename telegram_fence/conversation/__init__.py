"""Conversations: telebot's states and next-step/reply handlers kept in the fence's store, committed with the update
that changed them.

:mod:`.backends` holds telebot's storage and handler backends and installs them on a bot, :mod:`.extension` fences
them by attempts, :mod:`.sql` holds the tables' statements and an attempt's changes, :mod:`.values` the plain
values. Layer 3 (beside ``runtime``, whose attempt seam it plugs into).
"""

from __future__ import annotations

from .backends import FenceHandlerBackend, FenceStateStorage

__all__ = ["FenceHandlerBackend", "FenceStateStorage"]
