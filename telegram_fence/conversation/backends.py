"""telebot's state storage and next-step/reply handler backends kept in the fence's store, fenced, and putting them
in place of telebot's in-memory defaults on a bot.

Inside an attempt a change commits with the attempt (see :mod:`.extension`); outside one it is written at once. A
handler is kept by its callback's reference (``module:qualified.name``) and pickled arguments; one that cannot be
found by name in another process (a lambda, a closure, a bound method) or whose arguments cannot be pickled is kept
in this process only (said once at INFO; gone after a restart). :func:`prune_steps` deletes registrations older
than :data:`STEP_RETENTION`; states are never pruned. May import telebot's storage and handler classes, ``store``
(its protocols), ``calls.journal`` (its store types), the conversation's modules and the standard library (layer 3,
conversation).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from typing import Any

from telebot import Handler
from telebot.handler_backends import FileHandlerBackend, HandlerBackend, MemoryHandlerBackend
from telebot.storage import StateDataContext, StateMemoryStorage, StateStorageBase

from ..calls.journal import JournalStore
from ..errors import StateMissing, StateNotStorable
from ..store import UpdateStore
from .extension import Conversations
from .sql import NEXT_STEP, PRUNE_STEPS, REPLY, Entry, GroupKey, Pending, rows
from .values import (
    decode_args,
    decode_data,
    decode_state,
    encode_args,
    encode_data,
    encode_state,
    reference_of,
    resolve,
    state_key,
)

__all__ = ["STEP_RETENTION", "FenceHandlerBackend", "FenceStateStorage", "install", "prune_steps"]

log = logging.getLogger("telegram_fence.conversation.backends")

_EMPTY = "{}"
_MEMORY = "memory:"
#: Seconds a next-step or reply handler registration is kept without being taken (30 days).
STEP_RETENTION = 30 * 86400.0


class FenceStateStorage(StateStorageBase):  # type: ignore[misc]  # telebot has no type hints
    """telebot's state storage in the fence's store: states and their data keyed as telebot keys them.

    A state is a telebot ``State`` (kept by its ``name``), a string or an integer; its data a dict of JSON values
    (anything else raises :class:`~telegram_fence.errors.StateNotStorable` and changes nothing). ``get_data``
    returns a fresh dict. Ids outside 64 bits have no state (reads answer ``None``/``{}``, writes raise
    ``StateNotStorable``). ``set_data`` without a state raises :class:`~telegram_fence.errors.StateMissing` (a
    ``RuntimeError``, as telebot's memory storage raises). Safe to share between threads.
    """

    def __init__(self, conversations: Conversations) -> None:
        super().__init__()
        self._conversations = conversations

    def set_state(self, chat_id: Any, user_id: Any, state: Any, business_connection_id: Any = None,
                  message_thread_id: Any = None, bot_id: Any = None) -> bool:
        """Set the state (keeping the data, or with empty data for a new one); ``True``."""
        key = state_key(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        text = encode_state(state)
        with self._conversations.changing() as pending:
            row = pending.state(key)
            pending.put_state(key, (text, _EMPTY if row is None else row[1]))
        return True

    def get_state(self, chat_id: Any, user_id: Any, business_connection_id: Any = None,
                  message_thread_id: Any = None, bot_id: Any = None) -> Any:
        """The state's name (or the integer it was set to), ``None`` when there is none."""
        row = self._read(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        return None if row is None else decode_state(row[0])

    def delete_state(self, chat_id: Any, user_id: Any, business_connection_id: Any = None,
                     message_thread_id: Any = None, bot_id: Any = None) -> bool:
        """Delete the state and its data; ``False`` when there was none."""
        key = state_key(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        with self._conversations.changing() as pending:
            if pending.state(key) is None:
                return False
            pending.put_state(key, None)
        return True

    def set_data(self, chat_id: Any, user_id: Any, key: Any, value: Any, business_connection_id: Any = None,
                 message_thread_id: Any = None, bot_id: Any = None) -> bool:
        """Set one item of the data; raises :class:`StateMissing` when the user has no state."""
        where = state_key(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        with self._conversations.changing() as pending:
            row = pending.state(where)
            if row is None:
                raise StateMissing(f"set_data({key!r}): chat {where.chat_id} user {where.user_id} has no state; "
                                   "call set_state first")
            data = decode_data(row[1])
            data[key] = value
            pending.put_state(where, (row[0], encode_data(data)))
        return True

    def get_data(self, chat_id: Any, user_id: Any, business_connection_id: Any = None,
                 message_thread_id: Any = None, bot_id: Any = None) -> dict[str, Any]:
        """A fresh dict of the data (empty when there is no state)."""
        row = self._read(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        return {} if row is None else decode_data(row[1])

    def reset_data(self, chat_id: Any, user_id: Any, business_connection_id: Any = None,
                   message_thread_id: Any = None, bot_id: Any = None) -> bool:
        """Empty the data, keeping the state; ``False`` when there is no state."""
        return self.save(chat_id, user_id, {}, business_connection_id, message_thread_id, bot_id)

    def get_interactive_data(self, chat_id: Any, user_id: Any, business_connection_id: Any = None,
                             message_thread_id: Any = None, bot_id: Any = None) -> Any:
        """telebot's context manager over the data: yields a copy, saved (:meth:`save`) when the block ends."""
        return StateDataContext(self, chat_id=chat_id, user_id=user_id, business_connection_id=business_connection_id,
                                message_thread_id=message_thread_id, bot_id=bot_id)

    def save(self, chat_id: Any, user_id: Any, data: Any, business_connection_id: Any = None,
             message_thread_id: Any = None, bot_id: Any = None) -> bool:
        """Replace the data, keeping the state; ``False`` (nothing written) when there is no state."""
        key = state_key(chat_id, user_id, business_connection_id, message_thread_id, bot_id)
        text = encode_data(data)
        with self._conversations.changing() as pending:
            row = pending.state(key)
            if row is None:
                return False
            pending.put_state(key, (row[0], text))
        return True

    def _read(self, chat_id: Any, user_id: Any, *parts: Any) -> tuple[str, str] | None:
        """The stored ``(state, data)`` of the key, ``None`` for none (ids no state can be stored under included)."""
        if self._conversations.knows_no_state(user_id if chat_id is None else chat_id):
            return None  # a quiet chat: a state= filter asks for every message
        try:
            key = state_key(chat_id, user_id, *parts)
        except StateNotStorable:
            return None
        with self._conversations.reading() as pending:
            return pending.state(key)

    def __str__(self) -> str:
        return "<FenceStateStorage: in the fence's store>"


class FenceHandlerBackend(HandlerBackend):  # type: ignore[misc]  # telebot has no type hints
    """telebot's handler backend in the fence's store; ``kind``: ``"next_step"`` (groups are chat ids) or
    ``"reply"`` (message ids). Taking a group's handlers, like a registration, commits with the attempt (a retried
    update finds them again). Safe to share between threads.
    """

    def __init__(self, conversations: Conversations, kind: str) -> None:
        super().__init__()
        if kind not in (NEXT_STEP, REPLY):
            raise ValueError(f"kind={kind!r} must be {NEXT_STEP!r} or {REPLY!r}")
        self.kind = kind
        self._conversations = conversations
        self._lock = threading.Lock()
        self._memory: dict[str, Any] = {}  # memory:… reference -> Handler, for this process only
        self._serial = itertools.count(1)
        self._process = f"{os.getpid()}-{id(self):x}"
        self._told: set[str] = set()

    def _group(self, handler_group_id: Any) -> GroupKey:
        return (self.kind, str(handler_group_id))

    def register_handler(self, handler_group_id: Any, handler: Any) -> None:
        """Add ``handler`` (a telebot ``Handler``) to the group, after those already registered."""
        group = self._group(handler_group_id)
        entry = self._entry(handler)
        with self._conversations.changing() as pending:
            pending.put_entries(group, [*pending.entries(group), entry])

    def clear_handlers(self, handler_group_id: Any) -> None:
        """Remove every handler of the group."""
        group = self._group(handler_group_id)
        with self._conversations.changing() as pending:
            self._release(pending, pending.entries(group))
            pending.put_entries(group, [])

    def get_handlers(self, handler_group_id: Any) -> list[Any] | None:
        """Take the group's handlers (oldest first), or ``None``; one whose callback cannot be found any more is
        dropped with a WARNING."""
        if self._conversations.knows_empty(self.kind, handler_group_id):  # a quiet chat: telebot asks every message
            return None
        group = self._group(handler_group_id)
        with self._conversations.changing() as pending:
            entries = pending.entries(group)
            if not entries:
                return None
            handlers = [handler for handler in (self._handler_of(entry, group) for entry in entries) if handler]
            pending.put_entries(group, [])
            self._release(pending, entries)
        return handlers or None

    def load_handlers(self, filename: Any = None, del_file_after_loading: Any = True) -> None:
        """Nothing to load: the handlers are in the fence's store already."""
        log.info("%s handlers are kept in the fence's store; load_handlers has nothing to load", self.kind)

    # --- entries --------------------------------------------------------------------------------

    def _entry(self, handler: Any) -> Entry:
        callback = handler["callback"]
        reference = reference_of(callback)
        args = encode_args(handler["args"], handler["kwargs"]) if reference is not None else None
        if reference is not None and args is not None:
            return Entry(reference, args, handler)
        name = getattr(callback, "__qualname__", repr(callback))
        why = "its callback cannot be found by name in another process" if reference is None else (
            "its arguments cannot be pickled")
        if name not in self._told:
            self._told.add(name)
            log.info("%s handler %s is kept in this process only (%s): it does not survive a restart; "
                     "use a module-level function and picklable arguments", self.kind, name, why)
        with self._lock:
            reference = f"{_MEMORY}{self._process}:{next(self._serial)}"
            self._memory[reference] = handler
        return Entry(reference, None, handler)

    def _release(self, pending: Pending, entries: list[Entry]) -> None:
        """Once the taking commits, forget the memory handlers among ``entries``."""
        references = [entry.reference for entry in entries if entry.reference.startswith(_MEMORY)]
        if references:
            def forget() -> None:
                with self._lock:
                    for reference in references:
                        self._memory.pop(reference, None)
            pending.after_commit(forget)

    def _handler_of(self, entry: Entry, group: GroupKey) -> Any:
        if entry.handler is not None:
            return entry.handler
        if entry.reference.startswith(_MEMORY):
            with self._lock:
                handler = self._memory.get(entry.reference)
            if handler is None:
                log.warning("%s handler for %s was kept in memory by a process that ended (a lambda or closure); "
                            "it is dropped", self.kind, group[1])
            return handler
        try:
            callback = resolve(entry.reference)
            args, kwargs = decode_args(entry.args or b"")
        except LookupError as exc:
            log.warning("%s handler for %s is dropped: %s", self.kind, group[1], exc)
            return None
        return Handler(callback, *args, **kwargs)


def prune_steps(store: JournalStore, registered_before: float) -> int:
    """Delete handler registrations made before ``registered_before`` (epoch seconds); return how many."""
    with store.write() as conn:
        return len(rows(conn, PRUNE_STEPS, (registered_before,)))


#: Each part: telebot's attribute, its name in the log, and telebot's classes the fence replaces by default (its
#: file backend writes a while after each change: a kill before that loses it).
_PARTS: tuple[tuple[str, str, tuple[type, ...]], ...] = (
    ("current_states", "states", (StateMemoryStorage,)),
    ("next_step_backend", "next-step handlers", (MemoryHandlerBackend, FileHandlerBackend)),
    ("reply_backend", "reply handlers", (MemoryHandlerBackend, FileHandlerBackend)),
)


def install(bot: Any, store: UpdateStore, states: bool | None, log: logging.Logger) -> Conversations | None:
    """Keep ``bot``'s conversations in ``store``: ``states=None`` replaces what is still telebot's own (its memory
    storages and the file of ``enable_save_*_handlers``, whose handlers move into the store), ``True`` all three,
    ``False`` nothing. Returns the attempt extension that fences them, or ``None`` when nothing was replaced."""
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
        replacement = FenceStateStorage(conversations) if attribute == "current_states" else FenceHandlerBackend(
            conversations, NEXT_STEP if attribute == "next_step_backend" else REPLY)
        if saved:
            timer = getattr(current, "timer", None)  # the save telebot scheduled writes nothing now
            if timer is not None:
                timer.cancel()
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


def _move(handlers: dict[Any, list[Any]], backend: Any, name: str, log: logging.Logger) -> int:
    """Register each of ``handlers`` (``{group: [Handler, ...]}``) with ``backend``; how many. One that cannot be
    kept is logged and left out."""
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
