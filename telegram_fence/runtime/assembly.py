"""Assembling the fence's running parts from its settings: the worker pool, the poller, the backpressure
between them (how many updates the poller may fetch next) and the call journal.

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
from ..ingress.admission import Admission
from ..ingress.poller import Poller
from ..store import FencedUpdateStore
from .attempt import AttemptContext
from .capabilities import StoreCapabilities
from .pool import WorkerPool
from .settings import FenceSettings

__all__ = ["backlog_room", "build_call_journal", "build_poller", "build_pool", "telebot_update"]

#: The backlog the poller keeps while the dispatcher runs the handlers itself (see :func:`backlog_room`).
INLINE_BACKLOG = 200


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
    *,
    handle: Callable[[Any, AttemptContext], None],
    on_exhausted: Callable[[], None],
    on_progress: Callable[[], None],
    on_tick: Callable[[], float | None],
    on_fatal: Callable[[str], None],
    on_claimed: Callable[[Sequence[AttemptContext]], None] = lambda contexts: None,
    on_drained: Callable[[], None] = lambda: None,
) -> WorkerPool:
    """The worker pool that runs ``handle`` on the stored updates of ``capabilities.store`` (not started), through
    the fence's own look at the store; ``on_claimed`` is told each round's new attempts before any of them begins;
    ``on_drained`` that a stopped pool ended its threads on its own (see ``WorkerPool``)."""
    return WorkerPool(
        store=capabilities.store,
        capabilities=capabilities,
        handle=handle,
        parse=telebot_update,
        workers=settings.workers,
        lease=settings.lease,
        max_attempts=settings.max_attempts,
        retry=settings.retry_policy,
        handler_timeout=settings.handler_timeout,
        batch_size=settings.batch_size,
        on_exhausted=on_exhausted,
        on_progress=on_progress,
        on_tick=on_tick,
        on_fatal=on_fatal,
        on_claimed=on_claimed,
        on_drained=on_drained,
    )


def backlog_room(
    store: FencedUpdateStore, settings: FenceSettings, pool: WorkerPool, log: logging.Logger
) -> Callable[[], int]:
    """The poller's backpressure: a ``() -> int`` telling how many updates it may fetch next.

    ``max_backlog`` minus the store's backlog (no further than :data:`INLINE_BACKLOG` ahead while
    the dispatcher runs the handlers itself); 100 for a store without ``backlog()``; 1 (logged)
    when the backlog cannot be read. The returned callable never raises.
    """
    monitored = pool.capabilities.monitored
    backlog = monitored.backlog if monitored is not None else None

    def room() -> int:
        if backlog is None:
            return 100
        limit = settings.max_backlog
        if pool.inline:
            # Fast handlers: fetch the next batch while the dispatcher runs this one, no further
            # ahead. A new batch then finds its chats free and is claimed as it is stored.
            limit = min(limit, INLINE_BACKLOG)
        try:
            return limit - int(backlog())
        except Exception:
            log.warning("could not read the backlog; fetching a small batch", exc_info=True)
            return 1

    return room


def build_poller(
    token: str,
    store: FencedUpdateStore,
    settings: FenceSettings,
    pool: WorkerPool,
    *,
    admission: Admission,
    stop: threading.Event,
    capture: Callable[..., Any] | None,
    on_end: Callable[[str], None],
    wait_progress: Callable[[float], None],
    log: logging.Logger,
) -> Poller:
    """The poller that records ``getUpdates`` batches through ``pool`` (not started).

    When the store has a poll leadership (``poll_leadership()``, PostgreSQL: several processes on
    one database), the poller polls only while this process leads.
    """
    capabilities = pool.capabilities
    make_leadership = capabilities.poll_leadership
    return Poller(
        token=token,
        store=store,
        admission=admission,
        stop=stop,
        record=pool.record,
        on_fetch=pool.fetching,
        full_batch=max(1, settings.max_backlog // 2),
        on_end=on_end,
        backpressure=backlog_room(store, settings, pool, log),
        wait_progress=wait_progress,
        long_poll_timeout=settings.long_poll_timeout,
        allowed_updates=settings.allowed_updates,
        authorize=settings.authorize,
        on_record=capture,
        conflict_grace=settings.conflict_grace,
        leadership=make_leadership() if make_leadership is not None else None,
        monitored=capabilities.monitored,
        accepts_body=capabilities.accepts_body,
        read_timeout=settings.request_timeout,
        skip_pending=settings.skip_pending,
        write=pool.writer.call,  # the generation's writes: the dispatcher's while the pool runs
    )


def build_call_journal(
    capabilities: StoreCapabilities,
    token: str,
    settings: FenceSettings,
    *,
    log: logging.Logger,
) -> CallJournal | None:
    """The fence's call journal as ``settings`` ask (``journal_calls``, ``on_uncertain``, ``uncertain_calls``,
    ``rate_limits``), or ``None`` when it is turned off or the store cannot keep one (it needs the batched level's
    ``write`` beside the fenced ``transaction``)."""
    store = capabilities.batched
    if not settings.journal_calls or store is None:
        return None
    return CallJournal(store, token, rates=settings.rate_limits, on_uncertain=settings.on_uncertain,
                       raise_uncertain=settings.uncertain_calls == "raise", logger=log)
