"""Putting durable conversations in place of telebot's in-memory defaults on a bot: the one module that changes
a bot's state storage and handler backends.

``Fence(bot, ...)`` calls :func:`install`. ``states=None`` (the default) replaces what is still telebot's own
(``StateMemoryStorage``, ``MemoryHandlerBackend`` for next-step and reply handlers, and the ``FileHandlerBackend`` of
``enable_save_next_step_handlers`` / ``enable_save_reply_handlers``, whose loaded handlers it moves into the store)
and keeps anything else the bot configured; ``states=True`` replaces all three; ``states=False`` replaces nothing. A
storage an earlier ``Fence`` put on the same bot counts as a default (it is bound to that fence's store, which may be
closed). What was replaced is said once at INFO. Uses telebot's public attributes ``current_states``,
``next_step_backend`` and ``reply_backend`` (telebot has no setters for them). May import ``errors``, ``store`` (its
protocols), telebot's default classes, the conversation's modules and the standard library (layer 3, conversation).
"""

from __future__ import annotations

import logging
from typing import Any

from telebot.handler_backends import FileHandlerBackend, MemoryHandlerBackend
from telebot.storage import StateMemoryStorage

from ..store import UpdateStore
from .extension import Conversations
from .steps import NEXT_STEP, REPLY, FenceHandlerBackend
from .storage import FenceStateStorage

__all__ = ["install"]

#: Each part: telebot's attribute, its name in the log, and the classes of telebot's own that the fence replaces
#: by default (its memory storages, and the file a bot's ``enable_save_next_step_handlers`` and
#: ``enable_save_reply_handlers`` write a while after each change: a kill before that loses the change).
_PARTS: tuple[tuple[str, str, tuple[type, ...]], ...] = (
    ("current_states", "states", (StateMemoryStorage,)),
    ("next_step_backend", "next-step handlers", (MemoryHandlerBackend, FileHandlerBackend)),
    ("reply_backend", "reply handlers", (MemoryHandlerBackend, FileHandlerBackend)),
)


def install(bot: Any, store: UpdateStore, states: bool | None, log: logging.Logger) -> Conversations | None:
    """Keep ``bot``'s conversations in ``store`` as ``states`` asks; return the attempt extension that fences them,
    or ``None`` when nothing was replaced.

    ``states`` is checked by the fence's settings; ``store`` has every method of the store protocol (checked
    when the fence opened it)."""
    if states is False:
        return None
    bot_id = getattr(bot, "bot_id", None)
    conversations = Conversations(store, bot_id if isinstance(bot_id, int) else None)
    replaced: list[str] = []
    kept: list[str] = []
    for attribute, name, defaults in _PARTS:
        current = getattr(bot, attribute, None)
        if current is None and not hasattr(bot, attribute):
            continue  # not a telebot bot (a test double): nothing to replace
        ours = isinstance(current, (FenceStateStorage, FenceHandlerBackend))  # an earlier Fence's: bound to its store
        if not states and type(current) not in defaults and not ours:
            kept.append(f"{name} ({type(current).__name__})")
            continue
        leftover = getattr(current, "data" if attribute == "current_states" else "handlers", None)
        saved = type(current) is FileHandlerBackend
        if leftover and not saved:
            log.warning("telebot's in-memory %s already held entries before the fence started; they are not moved "
                        "into the store", name)
        replacement = _replacement(attribute, conversations)
        if saved:
            _stop_saving(current)
            moved = _move(dict(leftover or {}), replacement, name, log)
            log.info("telebot's file-saved %s (%s) are kept in the fence's store instead (%s loaded from the file "
                     "moved there); the file is no longer written", name, getattr(current, "filename", "?"), moved)
        setattr(bot, attribute, replacement)
        replaced.append(name)
    if kept:
        log.info("the bot's own storage is kept for %s (pass states=True to keep them in the fence's store)",
                 ", ".join(kept))
    if not replaced:
        return None
    log.info("conversation %s are kept in the fence's store and committed with each update (instead of telebot's "
             "memory); pass states=False to keep telebot's", ", ".join(replaced))
    return conversations


def _stop_saving(backend: Any) -> None:
    """Cancel a save telebot's ``FileHandlerBackend`` has scheduled (its timer thread), so the replaced backend
    writes nothing after the fence took its place."""
    timer = getattr(backend, "timer", None)
    cancel = getattr(timer, "cancel", None)
    if callable(cancel):
        cancel()


def _move(handlers: dict[Any, list[Any]], backend: Any, name: str, log: logging.Logger) -> int:
    """Register each of ``handlers`` (a telebot backend's ``{group: [Handler, ...]}``, loaded from its file) with
    ``backend`` (each written at once); returns how many. One that cannot be kept is logged and left out."""
    moved = 0
    for group, entries in handlers.items():
        for handler in entries or []:
            try:
                backend.register_handler(group, handler)
            except Exception:
                log.warning("one of telebot's file-saved %s (of %s) could not be moved into the store", name, group,
                            exc_info=True)
            else:
                moved += 1
    return moved


def _replacement(attribute: str, conversations: Conversations) -> Any:
    if attribute == "current_states":
        return FenceStateStorage(conversations)
    return FenceHandlerBackend(conversations, NEXT_STEP if attribute == "next_step_backend" else REPLY)
