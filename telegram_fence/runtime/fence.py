"""``Fence``: run a telebot bot so that no update is lost and no stale worker writes.

::

    bot = telebot.TeleBot(TOKEN)

    @bot.message_handler(commands=["start"])
    def start(message):
        bot.reply_to(message, "hello")

    Fence(bot, "bot.db").run()      # was: bot.infinity_polling(), with the same arguments

The fence owns its parts (the worker pool, the poller or the webhook door, the exhaustion delivery, the
housekeeping, the metrics server) and runs their threads, each with a stop signal and joined on shutdown
within a bound. The threads and the path of one update through each door are drawn in
``docs/architecture.md``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, cast

from .._version import __version__
from ..calls.frame import UncertainCall
from ..calls.limits import Rates
from ..conversation.install import install as install_conversations
from ..errors import ConfigurationError, SchemaError, StoreCorrupt
from ..ingress.admission import Admission
from ..ingress.poller import Poller
from ..retry import RetryPolicy
from ..store import Exhaustion, FencedUpdateStore
from ..textlog import fallback_logging, install_fallback
from .assembly import build_call_journal, build_poller, build_pool
from .attempt import AttemptContext
from .capabilities import StoreCapabilities
from .ending import Ending
from .exhaustions import ExhaustionDelivery
from .handlers import HandlerChoice
from .housekeeping import Housekeeping, release_dead_claims
from .mailbox import Mailbox
from .metrics_http import Endpoints, HealthService
from .pool import WorkerPool
from .settings import (
    FENCE_INIT_DOC,
    FenceSettings,
    OperatorPost,
    check_bot,
    open_store,
    polling_options,
    refuse_removed,
    split_capture,
)
from .shutdown import end_unjoined, join_parts, warn_running
from .snapshot import fence_stats, fence_threads, fence_vitals
from .threaded_bot import adopt
from .webhook_door import WebhookDoor
from .writer import Writer

if TYPE_CHECKING:
    from typing_extensions import TypeVar  # (a TypeVar with a default; typing's has none before 3.13)

    from ..ingress.webhook import WebhookIntake
    from ..store.sqlite import SqliteUpdateStore

    #: The type of ``Fence.store``: the store object given, or for a path the SqliteUpdateStore opened there.
    StoreT = TypeVar("StoreT", bound=FencedUpdateStore, default=SqliteUpdateStore)
else:
    from typing import TypeVar

    StoreT = TypeVar("StoreT", bound=FencedUpdateStore)

__all__ = ["Fence"]


log = logging.getLogger("telegram_fence.fence")

#: Exit code of :meth:`Fence.run` when the fence ended on its own: the poller did (token refused, conflict,
#: stall, …) or a pool thread could not go on (a damaged database, …).
EXIT_POLLER_ENDED = 1

#: The options' defaults, kept once, by :class:`FenceSettings`: ``Fence.__init__`` shows them in its signature.
_DEFAULT = FenceSettings()

class Fence(Generic[StoreT]):
    """A durable runner for one telebot bot.

    ``bot`` is a telebot bot, threaded (telebot's default: its handlers then run on the fence's threads, see
    :mod:`~telegram_fence.runtime.threaded_bot`) or not;
    ``store_or_path`` is a path (a :class:`~telegram_fence.store.SqliteUpdateStore` is opened there
    and closed on shutdown) or a store object. ``capture``: a hook ``(conn, new_updates)`` (or an
    object with ``record_hook``, such as the capture outbox, which the fence then also runs) called
    inside the record transaction. Every other option is a field of
    :class:`~telegram_fence.runtime.settings.FenceSettings`, documented, defaulted and checked there, once, before
    anything is opened; a bad one raises :class:`ConfigurationError` naming it. The fence reads its options
    from the settings only.

    ``stop()``, ``pause()``, ``resume()`` and ``stats()`` are safe from any thread, a handler included.

    Attributes: ``bot``, the bot given; ``store``, the store it runs on (for a path, that
    :class:`~telegram_fence.store.SqliteUpdateStore`: ``fence.store.write()`` is a transaction for your own
    tables in the same file), typed as what was given (``Fence[StoreT]``: a path gives
    ``Fence[SqliteUpdateStore]``); ``log``, the logger it writes to.
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
        **removed: Any,
    ) -> None:
        # (the docstring is FENCE_INIT_DOC, set below: the options are documented once, in FenceSettings)
        refuse_removed(removed)
        check_bot(bot)
        settings = FenceSettings(
            workers=workers, lease=lease, max_attempts=max_attempts, retry=retry,
            long_poll_timeout=long_poll_timeout, allowed_updates=allowed_updates, authorize=authorize,
            handler_timeout=handler_timeout, on_exhausted=on_exhausted, on_ended=on_ended, operator=operator,
            retention=retention, shutdown_timeout=shutdown_timeout,
            conflict_grace=conflict_grace, watchdog_margin=watchdog_margin,
            metrics=metrics, logger=logger, states=states, journal_calls=journal_calls, on_uncertain=on_uncertain,
            uncertain_calls=uncertain_calls, rate_limits=rate_limits,
        )
        self.bot = bot
        self._settings = settings
        self._outbox, self._capture = split_capture(capture)
        store, self._close_store = open_store(store_or_path)
        self.store = cast(StoreT, store)  # the object given, or the SqliteUpdateStore opened at the path
        self._capabilities = StoreCapabilities.of(self.store)  # what the store offers, looked at once
        # A threaded bot (telebot's default) runs its handlers on the fence's threads, never on telebot's pool
        # (after the checks that may refuse the fence: a refused fence leaves the bot as it was).
        self._unadopt = adopt(bot)
        self._unfallback: Callable[[], None] = lambda: None
        self.log = settings.logger or log
        self._stop = threading.Event()
        self._admission = Admission()
        self._ending = Ending(operator=settings.operator, on_ended=settings.on_ended, stop=self.stop, log=self.log)
        caps = self._capabilities
        # The one writer: the pool's writer thread does every write of the fence while it runs (before the start and
        # after the join, the calling thread does).
        self._writer = Writer(Mailbox(), self.store.record)
        self._exhaustions = ExhaustionDelivery(caps.durable, settings.on_exhausted, listen=caps.exhaustion_listener,
                                               stop=self._stop, tell=self._ending.tell_operator,
                                               on_fatal=self._ending.end, log=self.log, write=self._writer.call)
        # Conversations: telebot's states and next-step/reply handlers, committed with each attempt.
        self._conversations = install_conversations(bot, self.store, settings.states, self.log)
        self._housekeeping = self._make_housekeeping()
        self._started = False
        self._poller: Poller | None = None
        self._pool: WorkerPool | None = None
        self._closed = False
        self._calls = build_call_journal(self._capabilities, bot.token, settings, log=self.log)
        # The handler runs inside the attempt extensions, in this order: the call journal first, so conversation
        # changes commit with the same transaction's queued calls.
        self._handlers = HandlerChoice(lambda updates: bot.process_new_updates(updates), tuple(
            ext for ext in (self._calls, self._conversations) if ext is not None))
        self._health = HealthService(self._make_endpoints(), settings.metrics)  # metrics=, webhook_app, health_app
        # The webhook door: with an intake (webhook_app), start() runs no poller.
        self._webhook = WebhookDoor(bot.token, self.store, settings, monitored=self._capabilities.monitored,
                                    capture=self._capture, observe=lambda path: self._health.answer(path),
                                    wake=self._wake_pool, record=self._writer.record,
                                    accepts_body=self._capabilities.accepts_body,
                                    tell=self._ending.tell_operator, on_ended=partial(self._ending.end, "webhook"),
                                    log=self.log, write=self._writer.call)

    __init__.__doc__ = FENCE_INIT_DOC

    # --- handler registration -------------------------------------------------------------------

    def handler(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """Register ``fn(update)`` (a ``telebot.types.Update``) to handle every update instead of telebot's
        handlers. Usable as a decorator; returns ``fn``. :class:`ConfigurationError` for a second handler or
        after the start."""
        self._handlers.set_plain(fn)
        return fn

    def attempt_handler(self, fn: Callable[[Any, AttemptContext], Any]) -> Callable[[Any, AttemptContext], Any]:
        """Register ``fn(update, ctx)`` with an :class:`~telegram_fence.runtime.attempt.AttemptContext`.

        Needs a fenced store; checked at start. Usable as a decorator; returns ``fn``. Refused as :meth:`handler`.
        """
        self._handlers.set_attempt(fn)
        return fn

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, *, paused: bool = False) -> None:
        """Start the threads and return. With ``paused=True`` nothing is fetched until :meth:`resume`. Without any
        logging configured, warnings and errors of ``telegram_fence`` go to stderr as readable lines from here
        until :meth:`join` returns ``True`` (see :func:`telegram_fence.textlog.install_fallback`).

        Raises :class:`ConfigurationError` when started twice or when an attempt handler is
        registered on a store without the fenced methods. A store that raises :class:`StoreCorrupt` or
        :class:`SchemaError` while starting (a damaged file, a table of another layout) does not raise here: the
        fence ends at once with that reason (:attr:`ended_reason`; ``run()`` returns 1), as when it is met later.
        """
        if self._started:
            raise ConfigurationError("this fence was already started; create a new Fence to run again")
        if self._handlers.needs_fenced and not self._capabilities.fenced:
            raise ConfigurationError(
                f"attempt_handler needs a fenced store (claim_owned, renew_owned, owns, settle_owned, transaction); "
                f"{type(self.store).__name__} does not have them"
            )
        if self._conversations is not None and self._handlers.registered:
            self._conversations.dispatch_elsewhere()  # telebot's dispatch never runs: it reads no state ahead
        self._health.bind()  # bound first: an address in use fails before anything runs
        self._started = True
        self._handlers.close()
        self._unfallback = install_fallback()  # no logging configured: readable lines on stderr until join()
        self._admission.set(not paused)
        try:
            self._start_parts()
        except (StoreCorrupt, SchemaError) as exc:  # a damaged or unusable database: end with the reason, as later
            self._ending.end("start", f"the store cannot be used: {type(exc).__name__}: {exc}")

    def _start_parts(self) -> None:
        """Build and start the pool, the poller (or the webhook door's generation) and the other threads."""
        self._pool = build_pool(
            self._capabilities, self._settings, self._writer, handle=self._handlers.run,
            on_exhausted=self._exhaustions.wake, on_tick=self._housekeeping.tick,
            on_fatal=partial(self._ending.end, "runtime"),
            # conversations ask once per round which claimed chats have any (instead of once per update)
            on_claimed=(lambda contexts: None) if self._conversations is None else self._conversations.claimed,
            on_drained=partial(end_unjoined, self._calls, self._outbox, self._webhook),
        )
        self._poller = build_poller(
            self.bot.token, self._capabilities, self._settings, self._writer, admission=self._admission,
            stop=self._stop, capture=self._capture, on_end=partial(self._ending.end, "poller"),
        )
        self.log.info("fence starting", extra={"workers": self._settings.workers, "lease": self._settings.lease,
                                               "cursor": self.store.next_offset()})
        # Unsettled rows from an earlier run are due (or become due when their lease lapses): the
        # workers take them, oldest first, before anything new.
        if self._calls is not None:
            self._calls.start()  # before any handler runs and before the poller picks its connection
        release_dead_claims(self.store, self.log)
        self._pool.start()
        if self._outbox is not None:
            self._outbox.start()
        self._exhaustions.start()  # with a durable store: also woken by the exhaustions the store finds itself
        if not self._webhook.is_open:
            self._poller.start()
        else:  # the webhook intake records the updates; no poller runs
            self._poller = None
            self._webhook.begin()  # the webhook door's generation: `status` sees its deliveries
        self._health.start(self.log)

    def stop(self) -> None:
        """Ask everything to stop: no new long poll, no new claims. Returns at once; see :meth:`join`. Joined or
        not, every thread of the fence ends once no handler runs any more (``metrics=``'s server: at the join).

        A long poll in progress on the poller's own connection is closed at once; what it was
        reading is neither recorded nor confirmed, so Telegram sends it again on the next start.
        Safe from any thread and from a signal handler.
        """
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
        """Wait for a stop to finish (bounded by ``timeout``, default ``shutdown_timeout`` + 5 s); ``True`` when every
        thread ended. Running handlers get ``shutdown_timeout``; claims not started are handed back; the poller's
        long poll was closed by :meth:`stop` (nothing it was reading is recorded or confirmed), except one through
        telebot's own request path (a proxy, a custom session): it is left to run out on its daemon thread, records
        nothing afterwards, and counts as ended. The store is closed when the fence opened it and every thread
        that uses it ended.
        """
        if not self._started:
            return True
        if timeout is None:
            timeout = self._settings.shutdown_timeout + 5.0
        if not self._stop.wait(timeout):
            return False
        # the bound runs from the stop, not from the call; the order and the bounds: runtime.shutdown
        ok = join_parts(timeout, grace=self._settings.shutdown_timeout, pool=self._pool, calls=self._calls,
                        outbox=self._outbox, exhaustions=self._exhaustions, poller=self._poller,
                        webhook=self._webhook, health=self._health, reason=lambda: self.ended_reason,
                        end_generation=not self._closed, log=self.log)
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
        """Start, block until stopped, shut down; return the exit code for ``sys.exit``.

        Takes what ``bot.infinity_polling(...)`` takes, in its order, so the move is one line (see
        :func:`~telegram_fence.runtime.settings.polling_options`: ``allowed_updates``, ``long_polling_timeout``,
        ``timeout``, ``skip_pending`` on the first start of a database, ``logger_level`` accepted and unused;
        ``interval``, ``none_stop`` and ``non_stop``, which ``infinity_polling`` hands on to ``polling()``, accepted
        and changing nothing); ``restart_on_change``, ``path_to_watch``, any other argument and a second ``run()``
        raise :class:`ConfigurationError`.

        On the main thread SIGINT and SIGTERM request a graceful stop (see :meth:`stop` and :meth:`join`); a second
        one during the shutdown stops at once: running handlers are abandoned and ``128 + signal number`` (130 for
        Ctrl-C) is returned, their updates staying claimed in the store to run again once their lease lapses.
        Returns 0 after a requested stop, :data:`EXIT_POLLER_ENDED` (1) when the fence ended on its own (its reason
        was logged and passed to ``on_ended``). Without any logging configured, warnings and errors of
        ``telegram_fence`` go to stderr while it runs (:func:`telegram_fence.textlog.fallback_logging`).
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
            self._housekeeping = self._make_housekeeping()
            self._health = HealthService(self._make_endpoints(), settings.metrics)
            self._webhook.use(settings)
        from .signals import serve_until_stopped  # (only run() installs signal handlers)

        with fallback_logging():
            forced = serve_until_stopped(self.start, self.stop, self.join, self._stop, self.log, self._say_waiting)
        if forced is not None:
            return forced
        return EXIT_POLLER_ENDED if self.ended_reason is not None else 0

    def _say_waiting(self) -> None:
        """A second into :meth:`run`'s shutdown: a warning when handlers still run, so the wait is explained."""
        if self._pool is not None and self._pool.running():
            warn_running(self.log, self._pool, self._settings.shutdown_timeout, "stopping: waiting (shutdown_timeout="
                         "%g s) for %d running handler(s); a second Ctrl-C (SIGINT/SIGTERM) stops at once",
                         timeout_first=True)

    def pause(self) -> None:
        """Stop fetching new updates (the batch in hand is finished; work already stored goes on)."""
        self._admission.set(False)

    def resume(self) -> None:
        """Accept updates again after :meth:`pause` or ``start(paused=True)``."""
        self._admission.set(True)

    @property
    def ended_reason(self) -> str | None:
        """Why the fence ended on its own (the poller, or a pool thread that could not go on), or ``None``."""
        return self._ending.reason

    # --- internals ------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """A snapshot: the store's counts and cursor, the poller's generation and progress, the pool, the webhook,
        which of the fence's threads are alive (``threads``), the call journal's counts (``calls``) and the durable
        steps (``steps``: this process's counters, the store's steps by state)."""
        stats = fence_stats(
            self._capabilities.monitored, self._poller, self._pool, paused=not self._admission.accepting,
            webhook=self._webhook.stats(), ended_reason=self.ended_reason, stopping=self._stop.is_set(),
            threads=self._threads(),
        )
        stats["calls"] = self._calls.stats() if self._calls is not None else None
        stats["steps"] = _step_stats(self.store)
        return stats

    # --- the webhook door (see runtime.webhook_door) ----------------------------------------------

    #: Seconds between two getWebhookInfo checks of :meth:`run_webhook` (the move detection delay).
    webhook_check_interval: float = 60.0

    def webhook_app(self, secret_token: str, *, max_body: int = 1_048_576, health: bool = False) -> WebhookIntake:
        """The WSGI application receiving this bot's webhook, bound to this fence.

        Updates are recorded in the fence's store (authorised with ``authorize``, captured with
        ``capture``) and the fence's dispatcher is woken after each commit. Call it before
        :meth:`start`: the fence then runs no poller (``getUpdates`` cannot run while a webhook is
        set), only the workers. ``health=True``: the app also answers ``GET /metrics``, ``/livez`` and
        ``/readyz`` (no secret asked, so anyone who reaches the webhook reads them; off by default: serve them
        on ``metrics=`` or :meth:`health_app`, away from the public port). Serve it with any threaded WSGI server (see
        ``docs/webhook.md``); register the webhook with :meth:`register_webhook` or use :meth:`run_webhook`.
        A webhook registered some other way is watched from the first delivery with the right secret: the URL
        registered then is learned as ours, and a later move or a swapped secret ends the fence as it does after
        :meth:`register_webhook` (not a swap made before that first delivery).
        Raises :class:`ConfigurationError` for a bad secret or when the fence already started polling.
        """
        if self._started and not self._webhook.is_open:
            raise ConfigurationError("this fence is already polling; call webhook_app() before start()")
        return self._webhook.open(secret_token, max_body=max_body, health=health,
                                  interval=lambda: self.webhook_check_interval)

    def register_webhook(self, url: str, *, secret_token: str, takeover_from: str | None = None,
                         drop_pending: bool = False) -> None:
        """Register ``url`` as this bot's webhook, with takeover protection, and watch it (what
        :meth:`run_webhook` does around its own server; call it when you serve :meth:`webhook_app`
        yourself, after your server listens or just before).

        ``getWebhookInfo`` is read first; ``setWebhook`` (the URL tagged for ``secret_token``, the
        secret, the fence's ``allowed_updates``) is called only where no webhook is set, where it is
        already this URL with this secret's tag, or where ``takeover_from`` names the host it points to.
        Then ``fence-webhook-watch`` reads ``getWebhookInfo`` every :attr:`webhook_check_interval`
        seconds and ends the fence (log, operator channel, ``on_ended``) when the webhook was moved or
        deleted, or when Telegram reports its deliveries refused with 401 (the same URL registered
        again with another secret). :meth:`join` stops the watch.

        Raises :class:`ConfigurationError` before :meth:`webhook_app`, for a ``secret_token`` other
        than webhook_app's, for a bad url, or when called twice;
        :class:`~telegram_fence.errors.WebhookTaken` (naming the host only) when another host or
        another secret holds the webhook, nothing registered then; the classified
        :class:`~telegram_fence.errors.TelegramError` when Telegram could not be asked or refused.
        """
        self._webhook.register(url, secret_token=secret_token, takeover_from=takeover_from,
                               drop_pending=drop_pending, interval=self.webhook_check_interval)

    def run_webhook(self, url: str, *, secret_token: str, listen: tuple[str, int] = ("127.0.0.1", 8080),
                    takeover_from: str | None = None, drop_pending: bool = False, health: bool = False) -> int:
        """Register the webhook ``url`` as :meth:`register_webhook` does (takeover protection, then the watch), serve
        it on ``listen`` (threads ``fence-webhook-server`` and ``fence-webhook-request-N``) and run the workers until
        stopped. Everything is checked before anything starts. ``drop_pending=True`` asks Telegram to drop the
        updates waiting for delivery. ``health=True`` serves ``/metrics``, ``/livez`` and ``/readyz`` on ``listen``
        too (see :meth:`webhook_app`). The webhook stays registered after the return, so Telegram keeps the updates
        for the next start.

        Returns as :meth:`run` does: 0 after a requested stop (SIGINT/SIGTERM on the main thread), 1 when the fence
        ended on its own, ``128 + signal number`` after a second signal during the shutdown (the abandoned updates
        stay claimed and run again once their lease lapses); warnings go to stderr when no logging is configured.
        Raises :class:`ConfigurationError` for a bad url or secret or a fence already started, ``OSError`` when
        ``listen`` cannot be bound, :class:`~telegram_fence.errors.WebhookTaken` or the classified
        :class:`~telegram_fence.errors.TelegramError` as :meth:`register_webhook` does (the fence is stopped then).
        """
        if self._started:
            raise ConfigurationError("this fence was already started; create a new Fence to run again")
        forced = self._webhook.serve(url, secret_token=secret_token, listen=listen, takeover_from=takeover_from,
                                     drop_pending=drop_pending, health=health, interval=self.webhook_check_interval,
                                     start=self.start, stop=self.stop, join=self.join, stopped=self._stop)
        if forced is not None:
            return forced
        return EXIT_POLLER_ENDED if self.ended_reason is not None else 0

    # --- metrics and health (see runtime.metrics_http) ------------------------------------------

    def health_app(self) -> Callable[..., Any]:
        """A WSGI application answering ``GET /metrics``, ``/livez`` and ``/readyz`` for this fence (404
        elsewhere), to mount beside your own app; ``metrics=`` and ``webhook_app(health=True)`` serve the same
        answers."""
        return self._health.wsgi

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port`` where ``metrics=`` serves, once started (the port chosen when 0 was given)."""
        return self._health.url

    def _wake_pool(self) -> None:
        """The webhook door committed deliveries: a pool whose writer did not record them itself looks for them."""
        pool = self._pool
        if pool is not None and not self._writer.serving():
            pool.wake()

    def _make_housekeeping(self) -> Housekeeping:
        settings = self._settings
        return Housekeeping(
            self._capabilities, retention=settings.retention, long_poll=settings.long_poll_timeout,
            watchdog_margin=settings.watchdog_margin, captures=self._capture is not None,
            conversations=self._conversations is not None, poller=lambda: self._poller,
            stopping=self._stop.is_set, tell=self._ending.tell_operator, on_stuck=partial(self._ending.end, "poller"),
            log=self.log, write=self._writer.call,
        )

    def _make_endpoints(self) -> Endpoints:
        settings = self._settings
        return Endpoints(
            self.stats, self.store, workers=settings.workers, polling=lambda: not self._webhook.is_open,
            exhaustions=self._capabilities.durable is not None, version=__version__, vitals=self._vitals,
            max_progress_age=settings.long_poll_timeout + settings.watchdog_margin,
        )

    def _vitals(self) -> dict[str, Any]:
        return fence_vitals(self._threads(), self.ended_reason, self._pool, self._poller)

    def _threads(self) -> dict[str, bool]:
        return fence_threads(self._started, self._pool, self._exhaustions.alive)


def _step_stats(store: Any) -> dict[str, Any] | None:
    """The durable steps' figures (:func:`telegram_fence.steps.stats`) for a store that can hold them, else ``None``."""
    if not hasattr(store, "transaction"):
        return None
    from ..steps import stats  # (loaded by the first stats(), not by importing the fence)

    return stats(store)
