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

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, TelegramError
from ..textlog import fallback_logging
from .signals import serve_until_stopped

if TYPE_CHECKING:
    from ..ingress.webhook import WebhookIntake
    from ..ingress.webhook_guard import WebhookInfo
    from .settings import FenceSettings

__all__ = ["EXIT_ENDED", "FenceWebhook", "WebhookState", "WebhookWatch"]

#: Exit code of ``run_webhook`` when the fence ended on its own (the same as ``run()``'s).
EXIT_ENDED = 1

log = logging.getLogger("telegram_fence.webhook")


class WebhookWatch:
    """Watches the webhook registered for ``my_url`` with ``secret`` (see the module docstring).

    ``first`` is the answer read at start, shown by :meth:`stats` until the first check. A failed
    check is logged and kept in ``stats()["check_error"]``; it never counts as a move. ``stats()``,
    ``stop()`` and ``join()`` are safe from any thread.
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
    ) -> None:
        self._token = token
        self._url = my_url
        self._secret = secret
        self._on_moved = on_moved
        self._interval = max(0.01, float(interval))
        self._info = first
        self._check_error: str | None = None
        self._checks = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fence-webhook-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; returns at once."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread (a check in progress ends within the API call's timeout)."""
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        from ..ingress import webhook_guard

        while not self._stop.wait(self._interval):
            try:
                info = webhook_guard.read_info(self._token)
            except TelegramError as exc:
                with self._lock:
                    self._check_error = str(exc)
                log.warning("getWebhookInfo failed; checking again later", extra={"err": exc})
                continue
            except Exception as exc:  # a bug must not end the watch silently
                log.error("checking the webhook failed", exc_info=True)
                with self._lock:
                    self._check_error = repr(exc)
                continue
            with self._lock:
                self._info = info
                self._check_error = None
                self._checks += 1
            if info.last_error_message:
                log.warning("Telegram reports a webhook delivery error",
                            extra={"last_error_message": info.last_error_message,
                                   "pending_update_count": info.pending_update_count})
            if not webhook_guard.is_ours(info.url, self._url, self._secret):
                if not self._stop.is_set():
                    self._on_moved(webhook_guard.moved_reason(info.url))
                return

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
    """The fence's webhook parts: the intake (set by ``webhook_app``), and in ``run_webhook`` the
    watch and the listening address."""

    app: WebhookIntake | None = None
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
        ``docs/webhook.md``); register the webhook yourself or use :meth:`run_webhook`. Raises
        :class:`ConfigurationError` for a bad secret or when the fence already started polling.
        """
        from ..ingress.webhook import WebhookIntake

        if self._started and self._webhook.app is None:
            raise ConfigurationError("this fence is already polling; call webhook_app() before start()")
        if self._webhook.app is not None:
            raise ConfigurationError("webhook_app() was already called for this fence; serve that app")
        self._webhook.app = WebhookIntake(self.store, secret_token, max_body=max_body,
                                          authorize=self._settings.authorize, capture=self._capture,
                                          on_commit=self._webhook_committed, observe=self._observe)
        return self._webhook.app

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
        notices the webhook moved away: the fence then ends (log, operator channel, ``on_ended``).

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
        token = self.bot.token
        info = webhook_guard.read_info(token)
        decision = webhook_guard.decide(info.url, url, secret_token, takeover_from)
        app = self.webhook_app(secret_token)
        server = WsgiServer(app, listen[0], int(listen[1]))
        self._webhook.listen = server.url

        def start() -> None:
            self.start()
            server.start()
            # Registered only once the intake listens: Telegram starts delivering at once.
            webhook_guard.register(token, url, secret_token, allowed_updates=self._settings.allowed_updates,
                                   drop_pending=drop_pending)
            self.log.info("webhook registered", extra={"host": webhook_guard.owner_host(url),
                                                       "because": decision.reason, "listen": server.url})
            if decision.reason == "takeover":
                self._tell_operator(f"telegram_fence: took the webhook over from {decision.previous_host}")
            self._webhook.watch = WebhookWatch(token, url, secret_token, on_moved=self._webhook_ended,
                                               interval=self.webhook_check_interval, first=info)
            self._webhook.watch.start()

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

