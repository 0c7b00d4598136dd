"""The ``fence-webhook-watch`` thread: it watches the webhook registration of a fence.

:class:`WebhookWatch` reads ``getWebhookInfo`` every ``interval`` seconds, keeps Telegram's
``pending_update_count`` and ``last_error_message`` for ``stats()``, and reports once (through ``on_moved``)
when the webhook no longer points to this process with this secret, or when Telegram reports its deliveries
refused with 401; then it ends.

Imports: the standard library, ``errors`` and, inside the methods that use it, ``ingress.webhook_guard``, so a
polling bot never loads it.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import TelegramError

if TYPE_CHECKING:
    from .webhook_guard import WebhookInfo

__all__ = ["REFUSALS_BEFORE_CHECK", "WebhookWatch", "is_refused", "refused_reason"]

log = logging.getLogger("telegram_fence.webhook.watch")


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

    With ``my_url=None`` (a fence serving ``webhook_app`` whose webhook someone else registered) the watch is
    started by the first delivery that carried the right secret, and its first check, at once, learns the URL
    registered then as ours (a webhook not registered yet is learned at a later check). From then on a
    different URL (or none) is a move, and Telegram's 401 since ``registered_at`` a swapped secret. The limit:
    a move or a swap between that delivery and the first check is learned as ours.
    """

    def __init__(
        self,
        token: str,
        my_url: str | None,
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
        from . import webhook_guard

        #: no URL given (``webhook_app`` served without ``register_webhook``): the first check learns it
        self.learning = my_url is None
        self._tag: str | None = (
            None if my_url is None else webhook_guard.tag_of(secret, webhook_guard.split_tag(my_url)[0])
        )
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
        mine = self._tag
        if mine is not None and (
            tag is None or not hmac.compare_digest(tag.encode("latin-1", "replace"), mine.encode("ascii"))
        ):
            return  # (a learned URL without a tag: every refused request counts; it can only ask for a check)
        with self._lock:
            self._refusals += 1
            poke = self._refusals >= REFUSALS_BEFORE_CHECK
        if poke:
            self._wake.set()

    def _run(self) -> None:
        last = time.monotonic()
        if self.learning and self._check():  # learn the URL at once (a delivery just proved it points here)
            return
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
        from . import webhook_guard

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
        if self._url is None:
            if not info.url:  # not registered (yet): nothing to learn, nothing moved
                return False
            self._url, self._tag = info.url, webhook_guard.split_tag(info.url)[1]
            log.info("watching the webhook as it is registered now", extra={"host": info.host})
        if not (info.url == self._url if self.learning else webhook_guard.is_ours(info.url, self._url, self._secret)):
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
