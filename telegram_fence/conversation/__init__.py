"""Conversations: telebot's states and next-step/reply handlers kept in the fence's store, committed with the update
that changed them.

==============  ===================================================================================
``values``      state keys, the JSON of a state and its data, handler references (plain functions)
``sql``         the statements of the conversation tables on SQLite and PostgreSQL; listings
``pending``     the uncommitted changes of one attempt, and writing them in a transaction
``extension``   ``Conversations``: the attempt extension; which claimed chats have nothing stored
``backends``    telebot's ``StateStorageBase`` and handler backends; installing them on a bot
==============  ===================================================================================

Layer 3 (beside ``runtime``, whose attempt seam it plugs into); ``runtime.fence`` imports
:func:`~.backends.install`.
"""

from __future__ import annotations

from .backends import FenceHandlerBackend, FenceStateStorage

__all__ = ["FenceHandlerBackend", "FenceStateStorage"]
