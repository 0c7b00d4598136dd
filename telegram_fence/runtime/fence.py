"""``Fence``: run a telebot bot so that no update is lost and no stale worker writes.

::

    bot = telebot.TeleBot(TOKEN)    # its @bot.message_handler functions unchanged
    Fence(bot, "bot.db").run()      # was: bot.infinity_polling(), with the same arguments

The fence owns its parts and runs their threads, each with a stop signal and joined on shutdown within a bound
(see ``docs/architecture.md``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, cast

from .._version import __version__
from ..calls.frame import UncertainCall
from ..calls.journaled import CallJournal
from ..calls.limits import Rates
from ..conversation.backends import install as install_conversations
from ..errors import ConfigurationError, SchemaError, StoreCorrupt
from ..ingress.poller import Admission, Poller
from ..ingress.webhook_door import WebhookDoor
from ..retry import RetryPolicy
from ..store import Exhaustion, UpdateStore
from ..telegram import mask_tokens
from ..textlog import IN_MESSAGE, fallback_logging, install_fallback
from .attempt import AttemptContext, running
from .exhaustions import ExhaustionDelivery
from .health import HealthService
from .heartbeat import Housekeeping
from .mailbox import Mailbox, Writer
from .outcomes import adopt, telebot_update
from .pool import WorkerPool
from .settings import (
    FENCE_INIT_DOC,
    FenceSettings,
    OperatorPost,
    check_bot,
    open_store,
    polling_options,
    split_capture,
)

if TYPE_CHECKING:
    from typing_extensions import TypeVar  # (a TypeVar with a default; typing's has none before 3.13)

    from ..ingress.webhook import WebhookIntake
    from ..store.sqlite import SqliteUpdateStore

    #: The type of ``Fence.store``: the store object given, or for a path the SqliteUpdateStore opened there.
    StoreT = TypeVar("StoreT", bound=UpdateStore, default=SqliteUpdateStore)
else:
    from typing import TypeVar

    StoreT = TypeVar("StoreT", bound=UpdateStore)

__all__ = ["Fence"]

log = logging.getLogger("telegram_fence.fence")

#: Exit code of :meth:`Fence.run` when the fence ended on its own (the poller or a pool thread could not go on).
EXIT_POLLER_ENDED = 1

#: The options' defaults, kept once, by :class:`FenceSettings`: ``Fence.__init__`` shows them in its signature.
_DEFAULT = FenceSettings()


class Fence(Generic[StoreT]):
    """A durable runner for one telebot bot (threaded or not: a threaded bot's handlers run on the fence's threads).

    ``store_or_path``: a path (a :class:`~telegram_fence.store.SqliteUpdateStore` opened there, closed on shutdown)
    or a store. ``capture``: a hook ``(conn, new_updates)`` called inside the record transaction, or an object with
    ``record_hook`` (the capture outbox, which the fence then also runs). Every other option is a field of
    :class:`~telegram_fence.runtime.settings.FenceSettings`. ``stop()``, ``pause()``, ``resume()`` and ``stats()``
    are safe from any thread. Attributes: ``bot``; ``store``, typed as given; ``log``.
    """

    def __init__(
        self,
        bot: Any,
        store_or_path: str | os.PathLike[str] | StoreT,
        *,
        workers: int = _DEFAULT.workers,
        lease: float = _DEFAULT.lease,
        max_attempts: int = _DEFAULT.max_attempts,
        retry: RetryPolicy | None = None,
        long_poll_timeout: float = _DEFAULT.long_poll_timeout,
        allowed_updates: Sequence[str] | None = None,
        authorize: Callable[[Mapping[str, Any]], bool] | None = None,
        handler_timeout: float = _DEFAULT.handler_timeout,
        on_exhausted: Callable[[Exhaustion], Any] | None = None,
        on_ended: Callable[[str], Any] | None = None,
        logger: logging.Logger | None = None,
        operator: OperatorPost | None = None,
        capture: Any = None,
        retention: float = _DEFAULT.retention,
        shutdown_timeout: float = _DEFAULT.shutdown_timeout,
        conflict_grace: float = _DEFAULT.conflict_grace,
        watchdog_margin: float = _DEFAULT.watchdog_margin,
        states: bool | None = _DEFAULT.states,
        metrics: tuple[str, int] | None = None,
        journal_calls: bool = _DEFAULT.journal_calls,
        on_uncertain: Callable[[UncertainCall], Any] | None = None,
        uncertain_calls: str = _DEFAULT.uncertain_calls,
        rate_limits: Rates | None = None,
    ) -> None:
        check_bot(bot)
        given = locals()  # the options are the parameters FenceSettings also takes
        settings = FenceSettings(**{name: value for name, value in given.items() if name in FenceSettings._fields})
        self.bot = bot
        self._settings = settings
        self._outbox, self._capture = split_capture(capture)
        store, self._close_store = open_store(store_or_path)
        self.store = cast(StoreT, store)  # the object given, or the SqliteUpdateStore opened at the path
        # A threaded bot runs its handlers on the fence's threads (after the checks: a refused fence leaves the bot).
        self._unadopt = adopt(bot)
        self._unfallback: Callable[[], None] = lambda: None
        self.log = settings.logger or log
        self._stop = threading.Event()
        self._admission = Admission()
        self._end_lock = threading.Lock()
        self._reason: str | None = None  # why the fence ended on its own (the first reason, tokens masked)
        # The one writer: the pool's writer thread does every write of the fence while it runs.
        self._writer = Writer(Mailbox(), self.store.record)
        self._exhaustions = ExhaustionDelivery(store, settings.on_exhausted,
                                               stop=self._stop, tell=self._tell_operator,
                                               on_fatal=self._end, log=self.log, write=self._writer.call)
        # Conversations: telebot's states and next-step/reply handlers, committed with each attempt.
        self._conversations = install_conversations(bot, self.store, settings.states, self.log)
        self._started = self._closed = False
        self._poller: Poller | None = None
        self._pool: WorkerPool | None = None
        self._calls = None if not settings.journal_calls else CallJournal(
            store, bot.token, rates=settings.rate_limits, on_uncertain=settings.on_uncertain,
            raise_uncertain=settings.uncertain_calls == "raise", logger=self.log)
        # The handler runs inside the attempt extensions, in this order: the call journal first, so conversation
        # changes commit with the same transaction's queued calls.
        self._extensions = tuple(ext for ext in (self._calls, self._conversations) if ext is not None)
        self._fn: Callable[..., Any] | None = None  # the handler registered, else telebot's dispatch runs
        self._takes_ctx = False
        self._health = self._make_health()  # metrics=, webhook_app, health_app
        # The webhook door: with an intake (webhook_app), start() runs no poller.
        self._webhook = WebhookDoor(bot.token, self.store, lambda: self._settings, capture=self._capture,
                                    observe=lambda path: self._health.answer(path), record=self._writer.record,
                                    tell=self._tell_operator, log=self.log,
                                    on_ended=partial(self._end, "webhook"), write=self._writer.call)

    __init__.__doc__ = FENCE_INIT_DOC

    def handler(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """Register ``fn(update)`` (a ``telebot.types.Update``) to handle every update instead of telebot's
        handlers. Usable as a decorator; returns ``fn``. :class:`ConfigurationError` for a second handler or
        after the start."""
        return self._register(fn, takes_ctx=False)

    def attempt_handler(self, fn: Callable[[Any, AttemptContext], Any]) -> Callable[[Any, AttemptContext], Any]:
        """Register ``fn(update, ctx)`` with an :class:`~telegram_fence.runtime.attempt.AttemptContext`. Usable as a
        decorator; returns ``fn``. Refused as :meth:`handler`."""
        return self._register(fn, takes_ctx=True)

    def _register(self, fn: Callable[..., Any], *, takes_ctx: bool) -> Callable[..., Any]:
        if self._fn is not None:
            raise ConfigurationError("a handler is already registered; a fence runs exactly one handler")
        if self._started:
            raise ConfigurationError("register the handler before start()")
        self._fn, self._takes_ctx = fn, takes_ctx
        return fn

    def _handle(self, update: Any, ctx: AttemptContext) -> None:
        """Run the handler registered, else telebot's dispatch, on ``update`` inside the attempt extensions."""
        with running(ctx, self._extensions):
            if self._fn is None:
                self.bot.process_new_updates([update])
            elif self._takes_ctx:
                self._fn(update, ctx)
            else:
                self._fn(update)

    def start(self, *, paused: bool = False) -> None:
        """Start the threads and return; with ``paused=True`` nothing is fetched until :meth:`resume`.
        :class:`ConfigurationError` when started twice; a damaged store ends the fence (:attr:`ended_reason`)."""
        if self._started:
            raise ConfigurationError("this fence was already started; create a new Fence to run again")
        if self._conversations is not None and self._fn is not None:
            self._conversations.dispatch_elsewhere()  # telebot's dispatch never runs: it reads no state ahead
        self._health.bind()  # bound first: an address in use fails before anything runs
        self._started = True
        self._unfallback = install_fallback()  # no logging configured: readable lines on stderr until join()
        self._admission.set(not paused)
        try:
            self._pool, self._poller = _build_parts(self)
            if self._stop.is_set():  # a stop while they were built found no pool to tell: they start stopped
                self.stop()
            _start_parts(self, self._pool)
        except (StoreCorrupt, SchemaError) as exc:  # a damaged or unusable database: end with the reason, as later
            self._end("start", f"the store cannot be used: {type(exc).__name__}: {exc}")

    def stop(self) -> None:
        """Ask everything to stop (no new long poll, no new claims; a long poll in flight is closed, nothing it read is
        recorded); returns at once. Every thread ends once no handler runs, joined or not (``metrics=``'s server at
        the join). Safe from any thread and from a signal handler."""
        if not self._stop.is_set():
            self.log.info("fence stopping")
        self._stop.set()
        self._admission.stop()
        self._exhaustions.wake()
        if self._pool is not None:
            self._pool.stop()
        if self._poller is not None:
            self._poller.interrupt()  # a long poll in progress ends now, not after up to 25 s

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a stop to finish (``timeout``, default ``shutdown_timeout`` + 5 s); ``True`` when every thread
        ended. Running handlers get ``shutdown_timeout``; unstarted claims are handed back; the store is closed when
        the fence opened it."""
        if not self._started:
            return True
        if timeout is None:
            timeout = self._settings.shutdown_timeout + 5.0
        if not self._stop.wait(timeout):
            return False
        ok = _join_parts(self, timeout)  # the bound runs from the stop, not from the call
        if ok and self._close_store is not None and not self._closed:
            self._closed = True
            self._close_store()
        if ok:
            self._unadopt()
            self._unfallback()
        return ok

    def run(
        self,
        timeout: float | None = None,
        skip_pending: bool = False,
        long_polling_timeout: float | None = None,
        logger_level: int | None = logging.ERROR,
        allowed_updates: Sequence[str] | None = None,
        restart_on_change: bool = False,
        path_to_watch: str | None = None,
        **polling: Any,
    ) -> int:
        """Start, block until stopped, shut down; return the exit code for ``sys.exit``: 0 after a requested stop,
        :data:`EXIT_POLLER_ENDED` (1) when the fence ended on its own, ``128 + signal number`` after a second
        SIGINT/SIGTERM (the first stops gracefully). Takes what ``bot.infinity_polling(...)`` takes (see
        :func:`~telegram_fence.runtime.settings.polling_options`); :class:`ConfigurationError` for what it cannot
        honour and for a second ``run()``.
        """
        if self._started:
            raise ConfigurationError("this fence was already started; create a new Fence to run again")
        settings = polling_options(
            self._settings, timeout=timeout, skip_pending=skip_pending, long_polling_timeout=long_polling_timeout,
            logger_level=logger_level, allowed_updates=allowed_updates, restart_on_change=restart_on_change,
            path_to_watch=path_to_watch, other=polling,
        )
        if settings != self._settings:  # the parts built from the settings see the new ones
            self._settings = settings
            self._health = self._make_health()
        from .signals import serve_until_stopped  # (only run() installs signal handlers)

        with fallback_logging():
            forced = serve_until_stopped(self.start, self.stop, self.join, self._stop, self.log,
                                         partial(_warn_running, self))
        return forced if forced is not None else EXIT_POLLER_ENDED if self._reason is not None else 0

    def pause(self) -> None:
        """Stop fetching new updates (the batch in hand is finished; work already stored goes on)."""
        self._admission.set(False)

    def resume(self) -> None:
        """Accept updates again after :meth:`pause` or ``start(paused=True)``."""
        self._admission.set(True)

    @property
    def ended_reason(self) -> str | None:
        """Why the fence ended on its own (the poller, or a pool thread that could not go on), or ``None``."""
        return self._reason

    def _end(self, what: str, reason: str) -> None:
        """End the fence on its own, once: keep the first reason (tokens masked), log it, tell the operator and
        ``on_ended``, stop. ``what`` names the part that could not go on. Never raises."""
        reason = mask_tokens(reason)
        with self._end_lock:
            if self._reason is not None:
                return
            self._reason = reason
        # The reason in the message too: a handler of the program's own shows no fields.
        self.log.critical("%s ended: %s", what, reason, extra={"reason": reason, IN_MESSAGE: ("reason",)})
        self._tell_operator(f"telegram_fence: the {what} ended: {reason}")
        if self._settings.on_ended is not None:
            try:
                self._settings.on_ended(reason)
            except Exception:
                self.log.error("on_ended raised", exc_info=True)
        self.stop()

    def _tell_operator(self, text: str) -> None:
        """Post ``text`` (tokens masked) to the operator channel, if any. Never raises."""
        if self._settings.operator is not None:
            try:
                self._settings.operator.post(mask_tokens(text))
            except Exception:
                self.log.error("the operator channel refused a message", exc_info=True)

    def stats(self) -> dict[str, Any]:
        """A snapshot: the store's counts and cursor (or ``store_error``), the poller, the pool, the webhook, the
        threads alive, the call journal (``calls``) and the durable steps (``steps``)."""
        from ..steps.core import stats as step_stats  # (loaded by the first stats(), not by importing the fence)

        try:
            data: dict[str, Any] = dict(self.store.stats())
        except Exception as exc:  # a store that fails: its error under store_error (readiness reads it)
            data = {"store_error": mask_tokens(repr(exc))}
        poller, pool = self._poller, self._pool
        data["poller"] = None if poller is None else {**poller.stats(), "paused": not self._admission.accepting}
        data["workers"] = None if pool is None else pool.stats()
        data.update(webhook=self._webhook.stats(), threads=self._threads(), ended_reason=self.ended_reason,
                    stopping=self._stop.is_set(), calls=self._calls.stats() if self._calls is not None else None,
                    steps=step_stats(self.store))
        return data

    def _threads(self) -> dict[str, bool]:
        """Whether the fence started and which of its threads are alive (what liveness reads)."""
        pool = self._pool
        return {"started": self._started, **(pool.threads() if pool is not None else {}),
                "exhaustions": self._exhaustions.alive}

    #: Seconds between two getWebhookInfo checks of :meth:`run_webhook` (the move detection delay).
    webhook_check_interval: float = 60.0

    def webhook_app(self, secret_token: str, *, max_body: int = 1_048_576, health: bool = False) -> WebhookIntake:
        """The WSGI application receiving this bot's webhook: each delivery is recorded and answered 200 after the
        commit. Call it before :meth:`start`: the fence then runs no poller. ``health=True``: it also answers
        ``/metrics``, ``/livez`` and ``/readyz``. :class:`ConfigurationError` for a bad secret or a fence polling.
        """
        if self._started and not self._webhook.is_open:
            raise ConfigurationError("this fence is already polling; call webhook_app() before start()")
        return self._webhook.open(secret_token, max_body=max_body, health=health,
                                  interval=lambda: self.webhook_check_interval)

    def register_webhook(self, url: str, *, secret_token: str, takeover_from: str | None = None,
                         drop_pending: bool = False) -> None:
        """Register ``url`` as this bot's webhook with takeover protection (``setWebhook`` only where none is set, it
        is this URL with this secret's tag, or ``takeover_from`` names its host), and watch it: ``fence-webhook-watch``
        ends the fence when it moved, was deleted or is refused with 401. Raises :class:`ConfigurationError`,
        :class:`~telegram_fence.errors.WebhookTaken` or the classified :class:`~telegram_fence.errors.TelegramError`.
        """
        self._webhook.register(url, secret_token=secret_token, takeover_from=takeover_from,
                               drop_pending=drop_pending, interval=self.webhook_check_interval)

    def run_webhook(self, url: str, *, secret_token: str, listen: tuple[str, int] = ("127.0.0.1", 8080),
                    takeover_from: str | None = None, drop_pending: bool = False, health: bool = False) -> int:
        """Register ``url`` as :meth:`register_webhook` does, serve it on ``listen`` (``fence-webhook-server``) and
        run until stopped; returns as :meth:`run` does (the webhook stays registered). ``drop_pending=True`` asks
        Telegram to drop what waits; ``health=True`` as for :meth:`webhook_app`.
        """
        if self._started:
            raise ConfigurationError("this fence was already started; create a new Fence to run again")
        from .signals import serve_until_stopped  # (only run() and run_webhook() install signal handlers)

        forced = self._webhook.serve(url, secret_token=secret_token, listen=listen, takeover_from=takeover_from,
                                     drop_pending=drop_pending, health=health, interval=self.webhook_check_interval,
                                     start=self.start, stop=self.stop, join=self.join, stopped=self._stop,
                                     until_stopped=serve_until_stopped)
        return forced if forced is not None else EXIT_POLLER_ENDED if self._reason is not None else 0

    def health_app(self) -> Callable[..., Any]:
        """A WSGI application answering ``GET /metrics``, ``/livez`` and ``/readyz`` for this fence (404 elsewhere),
        to mount beside your own app."""
        return self._health.wsgi

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port`` where ``metrics=`` serves, once started (the port chosen when 0 was given)."""
        return self._health.url

    def _make_health(self) -> HealthService:
        settings = self._settings
        return HealthService(
            self.stats, self.store, workers=settings.workers, polling=lambda: not self._webhook.is_open,
            version=__version__,
            vitals=lambda: {"threads": self._threads(), "ended_reason": self.ended_reason,
                            "workers": None if self._pool is None else {"alive": self._pool.workers.alive()},
                            "poller": None if self._poller is None else {"alive": self._poller.alive}},
            max_progress_age=settings.long_poll_timeout + settings.watchdog_margin, address=settings.metrics,
        )


def _build_parts(fence: Fence[Any]) -> tuple[WorkerPool, Poller | None]:
    """Release the claims of this host's dead processes; return the worker pool and poller (none for a webhook)."""
    settings, store, writer = fence._settings, fence.store, fence._writer
    housekeeping = Housekeeping(
        store, retention=settings.retention, long_poll=settings.long_poll_timeout,
        watchdog_margin=settings.watchdog_margin, captures=fence._capture is not None,
        conversations=fence._conversations is not None, poller=lambda: fence._poller,
        stopping=fence._stop.is_set, tell=fence._tell_operator, on_stuck=partial(fence._end, "poller"),
        log=fence.log, write=writer.call,
    )
    housekeeping.release_dead_claims()
    pool = WorkerPool(
        store, writer, handle=fence._handle, parse=telebot_update, workers=settings.workers,
        lease=settings.lease, max_attempts=settings.max_attempts, retry=settings.retry,
        handler_timeout=settings.handler_timeout, on_exhausted=fence._exhaustions.wake,
        on_tick=housekeeping.tick, on_fatal=partial(fence._end, "runtime"),
        on_claimed=(lambda contexts: None) if fence._conversations is None else fence._conversations.claimed,
        on_drained=partial(_end_unjoined, fence),
    )
    if fence._webhook.is_open:  # the webhook intake records the updates; no poller runs
        return pool, None
    leadership = getattr(store, "poll_leadership", None)  # PostgreSQL: poll only while this process leads
    return pool, Poller(
        token=fence.bot.token, store=store, admission=fence._admission, stop=fence._stop, record=writer.record,
        on_end=partial(fence._end, "poller"), long_poll_timeout=settings.long_poll_timeout,
        allowed_updates=settings.allowed_updates, authorize=settings.authorize, on_record=fence._capture,
        conflict_grace=settings.conflict_grace, leadership=leadership() if callable(leadership) else None,
        read_timeout=settings.request_timeout,
        skip_pending=settings.skip_pending, write=writer.call,
    )


def _start_parts(fence: Fence[Any], pool: WorkerPool) -> None:
    """Start the threads of a starting fence's parts, the poller (or the webhook door) last."""
    fence.log.info("fence starting", extra={"workers": fence._settings.workers, "lease": fence._settings.lease,
                                           "cursor": fence.store.next_offset()})
    # Unsettled rows from an earlier run are due: the workers take them, oldest first, before anything new.
    if fence._calls is not None:
        fence._calls.start()  # before any handler runs and before the poller picks its connection
    pool.start()
    if fence._outbox is not None:
        fence._outbox.start()
    fence._exhaustions.start()  # with a durable store: also woken by the exhaustions the store finds itself
    if fence._poller is not None:
        fence._poller.start()
    else:
        fence._webhook.begin()  # the webhook door's generation: `status` sees its deliveries
    fence._health.start(fence.log)


def _end_unjoined(fence: Fence[Any]) -> None:
    """The stopped pool ended its threads on its own: tell the other threads to end, without waiting, but
    ``metrics=``'s server (it answers until the join). Called on the pool's heartbeat thread."""
    if fence._calls is not None:
        fence._calls.stop_resending(0)  # the calls it still had stay queued for the next start
    if fence._outbox is not None:
        fence._outbox.stop()
    fence._webhook.stop_threads()


def _join_parts(fence: Fence[Any], timeout: float) -> bool:
    """End the parts of a stopped fence, in order, within ``timeout`` seconds; ``True`` when every thread ended (a
    part that overran its bound makes it ``False``; the later parts are still asked to end).

    The running handlers get ``shutdown_timeout``; then the call journal's resend thread, the outbox, the
    exhaustion delivery (the journal stops only when all of those ended); the poller, its generation ended
    unless the store was closed already; the webhook door; ``metrics=``'s server last.
    """
    deadline = time.monotonic() + timeout
    pool, calls, outbox, poller = fence._pool, fence._calls, fence._outbox, fence._poller

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    ok = True
    if pool is not None:
        ok = pool.join(min(fence._settings.shutdown_timeout, timeout))
        _warn_running(fence, "%(running)d handler(s) still running after shutdown_timeout=%(shutdown_timeout)g s "
                      "abandoned: their updates run again on the next start, once their lease lapsed")
    if calls is not None:
        ok = calls.stop_resending(left()) and ok
    if outbox is not None:
        outbox.stop()
        ok = outbox.join(left()) and ok
    ok = fence._exhaustions.join(left()) and ok
    if calls is not None and ok:
        calls.stop()
    if poller is not None:
        ok = poller.finish(deadline, fence.log) and ok
        if not fence._closed:
            poller.end_generation(fence._reason or "clean stop")
    ok = fence._webhook.close(left(), reason=fence._reason or "clean stop") and ok
    return fence._health.stop(left()) and ok


def _warn_running(fence: Fence[Any], message: str = "stopping: waiting (shutdown_timeout=%(shutdown_timeout)g s) "
                  "for %(running)d running handler(s); a second Ctrl-C (SIGINT/SIGTERM) stops at once") -> None:
    """Warn with ``message`` (it names ``running`` and ``shutdown_timeout``) when handlers still run; by default the
    line a second into ``run()``'s shutdown, so the wait is explained."""
    fields = {"running": 0 if fence._pool is None else fence._pool.workers.running(),
              "shutdown_timeout": fence._settings.shutdown_timeout}
    if fields["running"]:
        fence.log.warning(message, fields, extra={**fields, IN_MESSAGE: ("running", "shutdown_timeout")})
