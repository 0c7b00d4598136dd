"""Assembling the fence's running parts from its settings: the worker pool, the poller and the call journal.

May import the standard library, telebot's types, ``ingress`` (level 2) and the runtime's siblings.
Builds objects only: nothing here starts a thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from telebot import types as tb_types

from ..calls.journaled import CallJournal
from ..ingress.poller import Admission, Poller
from .attempt import AttemptContext
from .capabilities import StoreCapabilities
from .pool import WorkerPool
from .settings import FenceSettings
from .writer import Writer

__all__ = ["build_call_journal", "build_poller", "build_pool", "telebot_update"]


def telebot_update(raw: Mapping[str, Any]) -> tb_types.Update:
    """The telebot ``Update`` of a stored update; raises ``ValueError`` when telebot parses it as empty."""
    # telebot reads the top level without changing it and copies each nested object it parses.
    update = tb_types.Update.de_json(raw if type(raw) is dict else dict(raw))
    if update is None:
        raise ValueError("telebot parsed the update as empty")
    return update


def build_pool(
    capabilities: StoreCapabilities,
    settings: FenceSettings,
    writer: Writer,
    *,
    handle: Callable[[Any, AttemptContext], None],
    on_exhausted: Callable[[], None],
    on_tick: Callable[[], float | None],
    on_fatal: Callable[[str], None],
    on_claimed: Callable[[Sequence[AttemptContext]], None] = lambda contexts: None,
    on_drained: Callable[[], None] = lambda: None,
) -> WorkerPool:
    """The worker pool that runs ``handle`` on the stored updates of ``capabilities.store`` (not started), its
    writer thread serving ``writer``; ``on_claimed`` is told each round's new attempts before any of them begins;
    ``on_drained`` that a stopped pool ended its threads on its own (see ``WorkerPool``)."""
    return WorkerPool(
        capabilities, writer, handle=handle, parse=telebot_update, workers=settings.workers, lease=settings.lease,
        max_attempts=settings.max_attempts, retry=settings.retry_policy, handler_timeout=settings.handler_timeout,
        on_exhausted=on_exhausted, on_tick=on_tick, on_fatal=on_fatal,
        on_claimed=on_claimed, on_drained=on_drained,
    )


def build_poller(
    token: str,
    capabilities: StoreCapabilities,
    settings: FenceSettings,
    writer: Writer,
    *,
    admission: Admission,
    stop: threading.Event,
    capture: Callable[..., Any] | None,
    on_end: Callable[[str], None],
) -> Poller:
    """The poller that records ``getUpdates`` batches through ``writer`` (not started).

    When the store has a poll leadership (``poll_leadership()``, PostgreSQL: several processes on
    one database), the poller polls only while this process leads.
    """
    make_leadership = capabilities.poll_leadership
    return Poller(
        token=token,
        store=capabilities.store,
        admission=admission,
        stop=stop,
        record=writer.record,
        on_end=on_end,
        long_poll_timeout=settings.long_poll_timeout,
        allowed_updates=settings.allowed_updates,
        authorize=settings.authorize,
        on_record=capture,
        conflict_grace=settings.conflict_grace,
        leadership=make_leadership() if make_leadership is not None else None,
        monitored=capabilities.store,
        accepts_body=True,
        read_timeout=settings.request_timeout,
        skip_pending=settings.skip_pending,
        write=writer.call,  # the generation's writes: the writer thread's while the pool runs
    )


def build_call_journal(
    capabilities: StoreCapabilities,
    token: str,
    settings: FenceSettings,
    *,
    log: logging.Logger,
) -> CallJournal | None:
    """The fence's call journal as ``settings`` ask (``journal_calls``, ``on_uncertain``, ``uncertain_calls``,
    ``rate_limits``), or ``None`` when it is turned off."""
    if not settings.journal_calls:
        return None
    return CallJournal(capabilities.store, token, rates=settings.rate_limits, on_uncertain=settings.on_uncertain,
                       raise_uncertain=settings.uncertain_calls == "raise", logger=log)
