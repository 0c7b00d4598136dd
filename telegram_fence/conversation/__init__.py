"""Conversations: telebot's states and next-step/reply handlers kept in the fence's store, committed with the update
that changed them.

==============  ===================================================================================
``values``      state keys, the JSON of a state and its data, handler references (plain functions)
``sql``         the statements of the conversation tables on SQLite and PostgreSQL
``pending``     the uncommitted changes of one attempt, and writing them in a transaction
``quiet``       which claimed chats have nothing stored: one question per dispatcher round
``extension``   ``Conversations``: the attempt extension that commits the changes with the attempt
``storage``     ``FenceStateStorage``: telebot's ``StateStorageBase``
``steps``       ``FenceHandlerBackend`` (telebot's next-step and reply handlers); pruning old registrations
``install``     replacing telebot's in-memory defaults on a bot
``listing``     read-only listings for the command line
==============  ===================================================================================

Layer 3 (beside ``runtime``, whose attempt seam it plugs into): may import ``runtime.attempt``, ``store``,
``errors``, telebot's storage and handler classes, and the standard library; ``runtime.fence`` imports
:func:`~.install.install`.
"""

from __future__ import annotations

from .steps import FenceHandlerBackend
from .storage import FenceStateStorage

__all__ = ["FenceHandlerBackend", "FenceStateStorage"]
