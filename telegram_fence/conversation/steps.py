"""``FenceHandlerBackend``: telebot's next-step and reply handler backend kept in the fence's store, fenced.

A handler (``bot.register_next_step_handler``, ``bot.register_for_reply``) is kept as a reference to its callback
(``module:qualified.name``) and its pickled arguments, and found again by that name after a restart. A callback
that cannot be found by name in another process (a lambda, a closure, a bound method of an instance, a
``functools.partial``) or arguments that cannot be pickled are kept in this process only: the registration is
stored and fenced like any other, and logged once at INFO; after a restart such a handler is gone (a WARNING names
it when the chat's next message finds it). A memory handler whose registration never committed stays in memory until
the process ends (one object per such registration). :func:`prune_steps` deletes registrations older than
:data:`STEP_RETENTION` (a reply that never came, a chat that never wrote again); states are never pruned: a
conversation waits as long as its user does. May import telebot's handler classes, the conversation's
modules and the standard library (layer 3, conversation).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from typing import Any

from telebot import Handler
from telebot.handler_backends import HandlerBackend

from .extension import Conversations, ConversationStore
from .pending import NEXT_STEP, REPLY, Entry, GroupKey, Pending
from .sql import rows, statements_for
from .values import decode_args, encode_args, reference_of, resolve

__all__ = ["NEXT_STEP", "REPLY", "STEP_RETENTION", "FenceHandlerBackend", "prune_steps"]

log = logging.getLogger("telegram_fence.conversation.steps")

_MEMORY = "memory:"
#: Seconds a next-step or reply handler registration is kept without being taken (30 days).
STEP_RETENTION = 30 * 86400.0


class FenceHandlerBackend(HandlerBackend):  # type: ignore[misc]  # telebot has no type hints
    """telebot's handler backend (``register_handler``, ``clear_handlers``, ``get_handlers``) in the fence's store.

    ``kind`` is ``"next_step"`` (groups are chat ids) or ``"reply"`` (groups are message ids). ``get_handlers``
    takes the group's handlers (they run once); inside an attempt that taking, like a registration, commits with
    the attempt, so a retried update finds its handlers again. Safe to share between threads.
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
        """Take the group's handlers (telebot ``Handler`` objects, oldest first), or ``None`` when it has none.

        A handler whose callback cannot be found any more (renamed, removed, or kept in a process that ended)
        is dropped with a WARNING naming it."""
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
        """Nothing to load: the handlers are in the fence's store already (telebot's file backend loads a file)."""
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


def prune_steps(store: ConversationStore, registered_before: float) -> int:
    """Delete handler registrations made before ``registered_before`` (epoch seconds); return how many."""
    with store.write() as conn:
        sql = statements_for(conn)
        count = int(rows(conn, sql.count_old_steps, (registered_before,))[0][0])
        if count:
            rows(conn, sql.prune_steps, (registered_before,))
    return count
