"""The webhook side of ``Fence``: ``webhook_app``, ``run_webhook``, and the watch on the registration.

:class:`FenceWebhook` is a base class of :class:`~telegram_fence.Fence` holding its webhook methods
(they use the fence's store, authorize, capture, pool and lifecycle). :class:`WebhookWatch` reads
``getWebhookInfo`` every ``interval`` seconds on the thread
``fence-webhook-watch``, keeps Telegram's ``pending_update_count`` and ``last_error_message`` for
``stats()``, and reports once (through ``on_moved``) when the webhook no longer points to this
process with this secret, then ends.

Imports: the standard library, ``errors``, ``textlog``, ``ingress`` (level 2) and ``runtime.signals``; the
webhook modules of ``ingress`` only inside the methods that use them, so a polling bot never loads them.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, TelegramError
from ..textlog import fallback_logging
from .signals import serve_until_stopped

if TYPE_CHECKING:
    from ..ingress.webhook import WebhookIntake
    from ..ingress.webhook_guard import Decision, WebhookInfo
    from .settings import FenceSettings

__all__ = ["EXIT_ENDED", "FenceWebhook", "WebhookState", "WebhookWatch"]

#: Exit code of ``run_webhook`` when the fence ended on its own (the same as ``run()``'s).
EXIT_ENDED = 1

log = logging.getLogger("telegram_fence.webhook")


#: Requests carrying this webhook's tag answered 401 (since the last check) that ask for a check at once.
REFUSALS_BEFORE_CHECK = 3
#: The shortest gap, in seconds, between two checks asked for by refused requests (a flood costs no more).
_MIN_POKED_GAP = 1.0


def refused_reason(host: str) -> str:
    """Why a process serving the webhook handles nothing: Telegram's deliveries carry another secret."""
    return (
        f"Telegram's deliveries to the webhook at {host} are refused with 401: the webhook was registered again "
        "with another secret_token (by another program, or another instance with a different secret); no "
        "update is handled here any more. Restart with the right secret, or pass takeover_from= to take it back"
    )


def is_refused(info: WebhookInfo, since: float) -> bool:
    """Whether Telegram reports its deliveries answered 401 at or after ``since`` (seconds since the epoch)."""
    message = info.last_error_message or ""
    date = info.last_error_date
    return "401" in message and date is not None and date >= int(since)


class WebhookWatch:
    """Watches the webhook registered for ``my_url`` with ``secret`` (see the module docstring).

    It reports once (``on_moved(reason)``), then ends, when the registered URL is no longer ours (moved or
    deleted) or when Telegram reports its deliveries answered 401 since ``registered_at`` (the same URL,
    tag and all, registered again with another secret: Telegram never shows the secret, so its own
    delivery error is the proof). :meth:`refused` counts requests answered 401 that carry this webhook's
    tag; :data:`REFUSALS_BEFORE_CHECK` of them ask for a check at once instead of at the next interval
    (a request from anyone else can only ask for a check, never end the fence). ``first`` is the answer
    read at start, shown by :meth:`stats` until the first check. A failed check is logged and kept in
    ``stats()["check_error"]``; it never counts as a move. Thread safety: ``stats()``, ``refused()``,
    ``stop()`` and ``join()`` are safe from any thread; the checks run on ``fence-webhook-watch``.
    """

    def __init__(
        self,
        token: str,
        my_url: str,
        secret: str,
        *,
        on_moved: Callable[[str], None],
        interval: float = 60.0,
        first: WebhookInfo | None = None,
        registered_at: float | None = None,
        on_checked: Callable[[], None] | None = None,
    ) -> None:
        self._token = token
        self._url = my_url
        self._secret = secret
        from ..ingress import webhook_guard

        self._tag = webhook_guard.tag_of(secret, webhook_guard.split_tag(my_url)[0])
        self._on_moved = on_moved
        self._on_checked = on_checked
        self._interval = max(0.01, float(interval))
        self._since = time.time() if registered_at is None else registered_at
        self._info = first
        self._check_error: str | None = None
        self._checks = 0
        self._refusals = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop() and by a run of refused requests
        self._thread = threading.Thread(target=self._run, name="fence-webhook-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; returns at once."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread (a check in progress ends within the API call's timeout)."""
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def refused(self, query: str) -> None:
        """A request was answered 401; when its query carries this webhook's tag, count it, and ask for a
        check now at the :data:`REFUSALS_BEFORE_CHECK`-th since the last check. Never raises."""
        from ..ingress.webhook_guard import TAG_PARAM

        tag = None
        for item in query.split("&"):
            if item.startswith(TAG_PARAM + "="):
                tag = item[len(TAG_PARAM) + 1:]
        if tag is None or not hmac.compare_digest(tag.encode("latin-1", "replace"), self._tag.encode("ascii")):
            return
        with self._lock:
            self._refusals += 1
            poke = self._refusals >= REFUSALS_BEFORE_CHECK
        if poke:
            self._wake.set()

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            self._wake.wait(self._interval)
            if self._stop.is_set():
                return
            if self._wake.is_set():  # asked for by refused requests: at most one such check a second
                gap = _MIN_POKED_GAP - (time.monotonic() - last)
                if gap > 0 and self._stop.wait(gap):
                    return
                self._wake.clear()
            last = time.monotonic()
            if self._check():
                return

    def _check(self) -> bool:
        """One getWebhookInfo; ``True`` when it reported the end (the watch ends then)."""
        from ..ingress import webhook_guard

        with self._lock:
            self._refusals = 0
        try:
            info = webhook_guard.read_info(self._token)
        except TelegramError as exc:
            with self._lock:
                self._check_error = str(exc)
            log.warning("getWebhookInfo failed; checking again later", extra={"err": exc})
            return False
        except Exception as exc:  # a bug must not end the watch silently
            log.error("checking the webhook failed", exc_info=True)
            with self._lock:
                self._check_error = repr(exc)
            return False
        with self._lock:
            self._info = info
            self._check_error = None
            self._checks += 1
        if info.last_error_message:
            log.warning("Telegram reports a webhook delivery error",
                        extra={"last_error_message": info.last_error_message,
                               "pending_update_count": info.pending_update_count})
        if not webhook_guard.is_ours(info.url, self._url, self._secret):
            reason = webhook_guard.moved_reason(info.url)
        elif is_refused(info, self._since):
            reason = refused_reason(info.host)
        else:
            if self._on_checked is not None:
                try:
                    self._on_checked()
                except Exception:
                    log.error("recording the webhook check failed", exc_info=True)
            return False
        if not self._stop.is_set():
            self._on_moved(reason)
        return True

    def stats(self) -> dict[str, Any]:
        """Telegram's last answer (host, pending count, last error; never the URL) and the check state."""
        with self._lock:
            info, error, checks = self._info, self._check_error, self._checks
        data: dict[str, Any] = info.public() if info is not None else {}
        data["checks"] = checks
        data["check_error"] = error
        return data


@dataclass(slots=True)
class WebhookState:
    """The fence's webhook parts: the intake and its secret (set by ``webhook_app``), the watch (set by
    ``register_webhook``, which ``run_webhook`` calls) and the listening address (``run_webhook``)."""

    app: WebhookIntake | None = None
    secret: str | None = None
    generation: int | None = None
    watch: WebhookWatch | None = None
    listen: str | None = None


class FenceWebhook:
    """The webhook methods of :class:`~telegram_fence.Fence` (a base class; not used on its own).

    Thread safety: as the fence's (``stats`` and ``stop`` from any thread).
    """

    if TYPE_CHECKING:  # provided by Fence
        bot: Any
        store: Any
        log: logging.Logger
        _settings: FenceSettings
        _capture: Any
        _pool: Any
        _started: bool
        _stop: threading.Event
        _webhook: WebhookState

        @property
        def ended_reason(self) -> str | None: ...
        def start(self, *, paused: bool = False) -> None: ...
        def stop(self) -> None: ...
        def join(self, timeout: float | None = None) -> bool: ...
        def _tell_operator(self, text: str) -> None: ...
        def _ended(self, what: str, reason: str) -> None: ...
        def _observe(self, path: str) -> tuple[int, str, bytes] | None: ...


    #: Seconds between two getWebhookInfo checks of :meth:`run_webhook` (the move detection delay).
    webhook_check_interval: float = 60.0

    def webhook_app(self, secret_token: str, *, max_body: int = 1_048_576) -> WebhookIntake:
        """The WSGI application receiving this bot's webhook, bound to this fence.

        Updates are recorded in the fence's store (authorised with ``authorize``, captured with
        ``capture``) and the fence's dispatcher is woken after each commit. Call it before
        :meth:`start`: the fence then runs no poller (``getUpdates`` cannot run while a webhook is
        set), only the workers. The app also answers ``GET /metrics``, ``/livez`` and ``/readyz`` (no
        secret asked; see :meth:`~telegram_fence.Fence.health_app`). Serve it with any threaded WSGI server (see
        ``docs/webhook.md``); register the webhook with :meth:`register_webhook` or use :meth:`run_webhook`.
        Raises :class:`ConfigurationError` for a bad secret or when the fence already started polling.
        """
        from ..ingress.webhook import WebhookIntake

        if self._started and self._webhook.app is None:
            raise ConfigurationError("this fence is already polling; call webhook_app() before start()")
        if self._webhook.app is not None:
            raise ConfigurationError("webhook_app() was already called for this fence; serve that app")
        self._webhook.app = WebhookIntake(self.store, secret_token, max_body=max_body,
                                          authorize=self._settings.authorize, capture=self._capture,
                                          on_commit=self._webhook_committed, on_refused=self._webhook_refused,
                                          observe=self._observe)
        self._webhook.secret = secret_token
        return self._webhook.app

    def register_webhook(
        self,
        url: str,
        *,
        secret_token: str,
        takeover_from: str | None = None,
        drop_pending: bool = False,
    ) -> None:
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
        if self._webhook.app is None or self._webhook.secret is None:
            raise ConfigurationError("call webhook_app(secret_token) before register_webhook()")
        if not hmac.compare_digest(secret_token.encode("utf-8", "replace"), self._webhook.secret.encode("utf-8")):
            raise ConfigurationError("register_webhook() needs the secret_token given to webhook_app()")
        if self._webhook.watch is not None:
            raise ConfigurationError("the webhook of this fence is already registered and watched")
        info, decision = self._webhook_decide(url, secret_token, takeover_from)
        self._webhook_register(url, secret_token, info, decision, drop_pending)

    def _webhook_decide(self, url: str, secret_token: str,
                        takeover_from: str | None) -> tuple[WebhookInfo, Decision]:
        from ..ingress import webhook_guard

        webhook_guard.check_secret(secret_token)
        webhook_guard.tagged_url(url, secret_token)  # validates the url
        info = webhook_guard.read_info(self.bot.token)
        return info, webhook_guard.decide(info.url, url, secret_token, takeover_from)

    def _webhook_register(self, url: str, secret_token: str, info: WebhookInfo,
                          decision: Decision, drop_pending: bool) -> None:
        from ..ingress import webhook_guard

        token = self.bot.token
        registered_at = time.time()
        webhook_guard.register(token, url, secret_token, allowed_updates=self._settings.allowed_updates,
                               drop_pending=drop_pending)
        self.log.info("webhook registered", extra={"host": webhook_guard.owner_host(url),
                                                   "because": decision.reason, "listen": self._webhook.listen})
        if decision.reason == "takeover":
            self._tell_operator(f"telegram_fence: took the webhook over from {decision.previous_host}")
        self._webhook.watch = WebhookWatch(token, url, secret_token, on_moved=self._webhook_ended,
                                           interval=self.webhook_check_interval, first=info,
                                           registered_at=registered_at, on_checked=self._webhook_checked)
        self._webhook.watch.start()

    def run_webhook(
        self,
        url: str,
        *,
        secret_token: str,
        listen: tuple[str, int] = ("127.0.0.1", 8080),
        takeover_from: str | None = None,
        drop_pending: bool = False,
    ) -> int:
        """Register the webhook ``url``, serve it on ``listen`` and run the workers until stopped.

        Takeover protection: ``getWebhookInfo`` is read first and ``setWebhook`` is called only
        where no webhook is set, where it already points to ``url`` with this ``secret_token`` (the
        registered URL carries a tag derived from the secret), or where ``takeover_from`` names the
        host it points to; otherwise :class:`~telegram_fence.errors.WebhookTaken` is raised naming
        that host, before anything starts. ``drop_pending=True`` asks Telegram to drop the updates
        waiting for delivery. A ``getWebhookInfo`` every :attr:`webhook_check_interval` seconds
        (sooner after a run of refused requests carrying this webhook's tag) notices the webhook moved
        away, or Telegram's deliveries refused with 401 (the same URL registered again with another
        secret): the fence then ends (log, operator channel, ``on_ended``). See :meth:`register_webhook`.

        Returns 0 after a requested stop (SIGINT/SIGTERM on the main thread), 1 when it ended on its
        own. A second SIGINT/SIGTERM while the shutdown waits for running handlers stops at once and
        returns ``128 + signal number`` (130 for Ctrl-C), as :meth:`~telegram_fence.Fence.run` does:
        the abandoned updates stay claimed in the store and run again once their lease lapses. While
        it runs, warnings go to stderr when no logging is configured (as for ``run()``).

        Raises :class:`ConfigurationError` for a bad url or secret, ``OSError`` when ``listen`` cannot be
        bound, :class:`~telegram_fence.errors.TelegramError` when Telegram refused the
        registration (the fence is stopped then). The webhook stays registered after the return,
        so Telegram keeps the updates for the next start.
        """
        from ..ingress import webhook_guard
        from ..ingress.wsgi_server import WsgiServer

        webhook_guard.check_secret(secret_token)
        webhook_guard.tagged_url(url, secret_token)  # validates the url
        if self._started:
            raise ConfigurationError("this fence was already started; create a new Fence to run again")
        info, decision = self._webhook_decide(url, secret_token, takeover_from)
        app = self.webhook_app(secret_token)
        server = WsgiServer(app, listen[0], int(listen[1]))
        self._webhook.listen = server.url

        def start() -> None:
            self.start()
            server.start()
            # Registered only once the intake listens: Telegram starts delivering at once.
            self._webhook_register(url, secret_token, info, decision, drop_pending)

        def shut_down() -> None:
            self.stop()
            server.stop()
            if not server.join(self._settings.shutdown_timeout):
                self.log.warning("webhook requests still running at shutdown; abandoning them")
            app.close()
            if self._webhook.watch is not None:
                self._webhook.watch.stop()
                self._webhook.watch.join(5.0)
            self.join()

        with fallback_logging():
            try:
                forced = serve_until_stopped(start, self.stop, shut_down, self._stop, self.log)
            except BaseException:
                shut_down()
                raise
        if forced is not None:
            return forced
        return EXIT_ENDED if self.ended_reason is not None else 0

    def _webhook_committed(self, updates: Sequence[Mapping[str, Any]]) -> None:
        pool = self._pool
        if pool is not None:
            pool.wake()

    def _webhook_started(self) -> None:
        """For :meth:`start` with a webhook app: begin the webhook door's generation in the store (when it
        keeps generations), so ``status`` and its health check see this door; every commit is its progress,
        and so is every check of the watch that found the webhook ours and working. Never raises: a store
        that refuses is logged, and the door runs without a generation."""
        app = self._webhook.app
        if app is None or not hasattr(self.store, "begin_generation"):
            return
        try:
            number = int(self.store.begin_generation(door="webhook"))
            self.store.mark_progress(number)  # a start is progress: a health check may not fail before a delivery
        except Exception:
            self.log.error("the store did not begin the webhook generation; status will not show this door",
                           exc_info=True)
            return
        self._webhook.generation = number
        app.mark_progress_of(number)

    def _webhook_checked(self) -> None:
        """The watch found the webhook ours and Telegram reporting no refused delivery: the door is open."""
        number = self._webhook.generation
        if number is not None:
            self.store.mark_progress(number)

    def _webhook_refused(self, query: str) -> None:
        watch = self._webhook.watch
        if watch is not None:
            watch.refused(query)

    def _webhook_close(self, timeout: float) -> bool:
        """For :meth:`join`: later deliveries answer 503 and the committer ends; the watch ends. Returns
        whether both ended within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        watch = self._webhook.watch
        if watch is not None:
            watch.stop()
        app = self._webhook.app
        ok = app is None or app.close(max(0.1, deadline - time.monotonic()))
        if watch is not None:
            ok = watch.join(max(0.1, deadline - time.monotonic())) and ok
        number = self._webhook.generation
        if number is not None and ok:
            try:
                self.store.end_generation(number, self.ended_reason or "clean stop")
            except Exception:
                self.log.error("the store did not record the end of the webhook generation", exc_info=True)
        return ok

    def _webhook_ended(self, reason: str) -> None:
        """The webhook moved away: end the fence once, as a poller end would (log, operator, on_ended)."""
        self._ended("webhook", reason)

    def _webhook_stats(self) -> dict[str, Any] | None:
        app = self._webhook.app
        if app is None:
            return None
        data: dict[str, Any] = {"intake": app.stats(), "listen": self._webhook.listen}
        watch = self._webhook.watch
        if watch is not None:
            data.update(watch.stats())
        return data

