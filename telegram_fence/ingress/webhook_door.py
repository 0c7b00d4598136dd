"""The webhook door of a ``Fence``: its intake, the registration and its watch, and ``run_webhook``'s server.
The other webhook modules are imported inside the methods that use them: a polling bot never loads them."""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigurationError, SchemaError, StoreCorrupt
from ..store import UpdateStore
from ..textlog import fallback_logging

if TYPE_CHECKING:
    from .webhook import WebhookIntake
    from .webhook_guard import WebhookInfo, WebhookWatch

__all__ = ["DoorSettings", "WebhookDoor"]


class DoorSettings(Protocol):
    """What the door reads of the fence's settings (``runtime.settings.FenceSettings`` has it)."""

    authorize: Callable[[Mapping[str, Any]], bool] | None
    allowed_updates: Sequence[str] | None
    shutdown_timeout: float


class WebhookDoor:
    """The webhook half of a fence, which delegates ``webhook_app``, ``register_webhook`` and ``run_webhook`` to it.
    ``settings()``: the fence's current settings; ``store`` keeps the door's generation; ``record``/``write(fn)``:
    the fence's writer; ``tell(text)``: the operator channel; ``on_ended(reason)``: the webhook moved away.
    :meth:`stats` is safe from any thread; the rest is called from the thread that runs the fence's life cycle."""

    def __init__(self, token: str, store: UpdateStore, settings: Callable[[], DoorSettings], *,
                 capture: Callable[..., Any] | None, observe: Callable[[str], tuple[int, str, bytes] | None],
                 record: Callable[..., int], tell: Callable[[str], None],
                 on_ended: Callable[[str], None], log: logging.Logger,
                 write: Callable[[Callable[[], Any]], Any]) -> None:
        self._token, self._store, self._settings = token, store, settings
        self._capture, self._observe, self._record = capture, observe, record
        self._write, self._tell, self._on_ended, self._log = write, tell, on_ended, log
        self._lock = threading.Lock()  # guards what stats() reads: the app, the watch, the address
        self._app: WebhookIntake | None = None
        self._secret: str | None = None
        self._generation: int | None = None
        self._watch: WebhookWatch | None = None
        self._listen: str | None = None
        self._interval: Callable[[], float] = lambda: 60.0
        self._closing = False

    @property
    def is_open(self) -> bool:
        """Whether :meth:`open` made the intake (the fence then runs no poller)."""
        return self._app is not None

    def open(self, secret_token: str, *, max_body: int, health: bool = False,
             interval: Callable[[], float] = lambda: 60.0) -> WebhookIntake:
        """Make the intake (``Fence.webhook_app``); :class:`ConfigurationError` for a bad secret or a second call.
        ``interval()``: the period of a watch a delivery starts."""
        from .webhook import WebhookIntake

        if self._app is not None:
            raise ConfigurationError("webhook_app() was already called for this fence; serve that app")
        app = WebhookIntake(self._store, secret_token, max_body=max_body, authorize=self._settings().authorize,
                            capture=self._capture, on_commit=self._committed,
                            observe=self._observe if health else None, record=self._record)
        with self._lock:
            self._app, self._secret, self._interval = app, secret_token, interval
        return app

    def register(self, url: str, *, secret_token: str, takeover_from: str | None, drop_pending: bool,
                 interval: float) -> None:
        """Register ``url`` with takeover protection and start the watch (``Fence.register_webhook``)."""
        if self._app is None or self._secret is None:
            raise ConfigurationError("call webhook_app(secret_token) before register_webhook()")
        if not hmac.compare_digest(secret_token.encode("utf-8", "replace"), self._secret.encode("utf-8")):
            raise ConfigurationError("register_webhook() needs the secret_token given to webhook_app()")
        if self._watch is not None and not self._watch.learning:
            raise ConfigurationError("the webhook of this fence is already registered and watched")
        info, decision = self._decide(url, secret_token, takeover_from)
        with self._lock:  # a watch started by a delivery gives way to the one of the registration
            learning, self._watch = self._watch, None
        if learning is not None:
            learning.stop()
            learning.join()
        self._register(url, secret_token, info, decision, drop_pending, interval)

    def serve(self, url: str, *, secret_token: str, listen: tuple[str, int], takeover_from: str | None,
              drop_pending: bool, health: bool, interval: float, start: Callable[[], None], stop: Callable[[], None],
              join: Callable[[], bool], stopped: threading.Event, until_stopped: Callable[..., int | None]
              ) -> int | None:
        """``Fence.run_webhook``: check everything (url, secret, takeover), open, listen, then run the fence through
        ``until_stopped`` until stopped; ``128 + signal number`` after a forced stop, else ``None``."""
        from .webhook import WsgiServer

        info, decision = self._decide(url, secret_token, takeover_from)
        app = self.open(secret_token, max_body=1_048_576, health=health)
        server = WsgiServer(app, listen[0], int(listen[1]))
        with self._lock:
            self._listen = server.url

        def start_all() -> None:
            start()
            server.start()
            # Registered only once the intake listens: Telegram starts delivering at once.
            self._register(url, secret_token, info, decision, drop_pending, interval)

        def shut_down() -> None:
            stop()
            server.stop()
            if not server.join(self._settings().shutdown_timeout):
                self._log.warning("webhook requests still running at shutdown; abandoning them")
            app.close()
            watch = self._shut()
            if watch is not None:
                watch.join(5.0)
            join()

        with fallback_logging():
            try:
                return until_stopped(start_all, stop, shut_down, stopped, self._log)
            except BaseException:
                shut_down()
                raise

    def begin(self) -> None:
        """For ``Fence.start`` with an intake: begin the door's generation, whose progress are the commits and the
        watch's passed checks. A store that refuses is logged (no generation then), but :class:`StoreCorrupt` and
        :class:`SchemaError` are raised."""
        app, store = self._app, self._store
        if app is None:
            return

        def begin() -> int:
            number = int(store.begin_generation(door="webhook"))
            store.mark_progress(number)  # a start is progress: a health check may not fail before a delivery
            return number

        try:
            self._generation = int(self._write(begin))
        except (StoreCorrupt, SchemaError):
            raise  # a damaged or unusable database: the fence ends at start with the reason (as the poller's does)
        except Exception:
            self._log.error("the store did not begin the webhook generation; status will not show this door",
                            exc_info=True)
        else:
            app.mark_progress_of(self._generation)

    def close(self, timeout: float, *, reason: str) -> bool:
        """For ``Fence.join``: later deliveries answer 503, the watch ends, then the generation with ``reason``.
        Whether the deliveries in hand and the watch ended within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        watch = self._shut()
        app = self._app
        ok = app is None or app.close(max(0.1, deadline - time.monotonic()))
        if watch is not None:
            ok = watch.join(max(0.1, deadline - time.monotonic())) and ok
        number, store = self._generation, self._store
        if number is not None and ok:
            try:  # after the pool's join: no writer runs any more, so on this thread
                self._write(lambda: store.end_generation(number, reason))
            except Exception:
                self._log.error("the store did not record the end of the webhook generation", exc_info=True)
        return ok

    def stop_threads(self) -> None:
        """For a fence stopped but not joined: later deliveries answer 503 and the watch is told to end, without
        waiting (:meth:`close` waits). Idempotent."""
        self._shut()
        if self._app is not None:
            self._app.close(0)

    def _shut(self) -> WebhookWatch | None:
        """No watch starts from now on; the one running is told to end (and returned)."""
        with self._lock:
            self._closing = True
            watch = self._watch
        if watch is not None:
            watch.stop()
        return watch

    def stats(self) -> dict[str, Any] | None:
        """The intake's counts, the listening address and the watch's last answer; ``None`` without an intake."""
        with self._lock:
            app, watch, listen = self._app, self._watch, self._listen
        if app is None:
            return None
        data: dict[str, Any] = {"intake": app.stats(), "listen": listen}
        if watch is not None:
            data.update(watch.stats())
        return data

    def _decide(self, url: str, secret_token: str, takeover_from: str | None) -> tuple[WebhookInfo, str]:
        from . import webhook_guard

        webhook_guard.check_secret(secret_token)
        webhook_guard.tagged_url(url, secret_token)  # validates the url
        info = webhook_guard.read_info(self._token)
        return info, webhook_guard.decide(info.url, url, secret_token, takeover_from)

    def _register(self, url: str, secret_token: str, info: WebhookInfo, decision: str, drop_pending: bool,
                  interval: float) -> None:
        from . import webhook_guard

        registered_at = time.time()
        webhook_guard.register(self._token, url, secret_token, allowed_updates=self._settings().allowed_updates,
                               drop_pending=drop_pending)
        self._log.info("webhook registered", extra={"host": webhook_guard.owner_host(url),
                                                    "because": decision, "listen": self._listen})
        if decision == "takeover":
            self._tell(f"telegram_fence: took the webhook over from {info.host}")
        watch = webhook_guard.WebhookWatch(self._token, url, secret_token, on_moved=self._on_ended, interval=interval,
                                           first=info, registered_at=registered_at, on_checked=self._checked)
        with self._lock:
            self._watch = watch
        watch.start()

    def _committed(self, updates: Sequence[Mapping[str, Any]]) -> None:
        """The first commit of a fence whose webhook was registered some other way starts a watch learning the URL."""
        if self._watch is not None or self._closing or self._secret is None:
            return
        from .webhook_guard import WebhookWatch

        with self._lock:
            if self._watch is not None or self._closing:
                return
            watch = self._watch = WebhookWatch(self._token, None, self._secret, on_moved=self._on_ended,
                                               interval=self._interval(), on_checked=self._checked)
        watch.start()

    def _checked(self) -> None:
        """The watch found the webhook ours and working: the door's progress."""
        number, store = self._generation, self._store
        if number is not None:
            self._write(lambda: store.mark_progress(number))
