"""Telegram's rate limits as one object every sending thread shares, and the request sender by which every call
that is not a handler's waits for them.

:class:`Limits` holds the pauses a 429 asks for (per chat or for the whole bot) and optional proactive
:class:`Rates`. Given a shared store (``share``, the call journal), every process of the bot waits out the same
pauses and spends the same token buckets; a store that cannot be reached falls back to this process's own (logged),
never to no limits. :class:`LimitedSender` is the telebot request sender of calls outside a handler (broadcasts, the
operator channel, other threads); :func:`shared_limits` installs one in a process without a fence. ``get*`` calls
pass untouched. May import ``errors``, ``retry``, ``telegram``, ``calls.verdicts``, ``calls.journal`` and the
standard library. Safe from any thread; :meth:`Limits.wait` blocks only its caller.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError
from ..retry import MAX_RETRY_AFTER_WAIT
from ..telegram import Forward, install_request_sender, method_of_url
from . import verdicts
from .journal import Journal, JournalStore, spend

__all__ = ["BOT_SCOPE", "MAX_CALL_WAIT", "LimitedSender", "Limits", "Rates", "fence_journals",
           "paid", "passing", "scope_of", "shared_limits"]

log = logging.getLogger("telegram_fence.calls.limits")

#: The scope of a pause that holds every call of the bot.
BOT_SCOPE = "bot"
#: How often (seconds) a wait for a pause reads the shared pauses again (another process may lengthen it).
_SHARED_REFRESH = 0.25
#: Longest 429 wait a call sits out inside the fence before the 429 reaches its caller (who waits it out).
MAX_CALL_WAIT = 30.0


def scope_of(chat_id: int | None) -> str:
    """The scope a 429 on a call to ``chat_id`` pauses: that chat, or the whole bot for a call without one."""
    return BOT_SCOPE if chat_id is None else f"chat:{chat_id}"


@dataclass(frozen=True)
class Rates:
    """Proactive limits, shaped like Telegram's: token buckets refilled continuously.

    ``per_chat`` messages per second to one private chat (``chat_burst`` at once); ``per_group_minute`` per
    minute to one group or channel (a negative chat id; ``group_burst`` at once); ``per_bot`` per second for
    the whole bot (``bot_burst`` at once); ``paid_per_bot`` per second for calls with
    ``allow_paid_broadcast``. In any window of ``t`` seconds a scope gets at most ``burst + rate * t``
    calls. Raises :class:`ConfigurationError` for a rate or burst that is not positive.
    """

    per_chat: float = 1.0
    chat_burst: int = 3
    per_group_minute: float = 20.0
    group_burst: int = 3
    per_bot: float = 30.0
    bot_burst: int = 30
    paid_per_bot: float = 1000.0

    def __post_init__(self) -> None:
        for name in ("per_chat", "chat_burst", "per_group_minute", "group_burst", "per_bot", "bot_burst",
                     "paid_per_bot"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                    or not math.isfinite(value):
                raise ConfigurationError(f"Rates({name}={value!r}): must be a positive number")


class Limits:
    """The pauses and rates every call waits for: ``rates`` (``None``: only pauses), ``share`` (where pauses and
    buckets are shared between processes), ``clock`` (wall-clock seconds, as pauses are shared)."""

    def __init__(self, rates: Rates | None = None, *, share: Journal | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._rates = rates
        self._share = share
        self._clock = clock
        self._cond = threading.Condition()
        self._pauses: dict[str, float] = {}
        self._buckets: dict[str, tuple[float, float]] = {}  # scope -> (tokens, at): this process's own
        self._share_failing = False  # the last read of the shared pauses failed (logged once per streak)
        self.paused = 0  # how many 429 pauses were taken (for stats)

    def pause(self, chat_id: int | None, seconds: float) -> None:
        """Hold every call to ``chat_id``'s scope for ``seconds`` (cut to ``MAX_RETRY_AFTER_WAIT``; never shortening
        a longer pause) in every thread and, when shared, every process. A failure to share it is logged."""
        scope = scope_of(chat_id)
        seconds = min(max(0.0, seconds), MAX_RETRY_AFTER_WAIT)
        until = self._clock() + seconds
        with self._cond:
            self._pauses[scope] = max(self._pauses.get(scope, -math.inf), until)
            self._cond.notify_all()
        log.warning("Telegram asked to wait %.3g s before the next call to %s", seconds, scope,
                    extra={"scope": scope, "retry_after": seconds})
        if self._share is not None:
            try:
                self._share.pause(scope, until)
            except Exception:
                log.warning("could not share the pause of %s with other processes", scope, exc_info=True)
        with self._cond:
            self.paused += 1  # counted once it is shared: a reader of stats() sees it in the store too

    def wait(self, chat_id: int | None, *, paid: bool = False, stop: threading.Event | None = None,
             shared: float | None = None) -> bool:
        """Block until a call to ``chat_id`` may be sent, then take its tokens; ``False`` (nothing taken) once
        ``stop`` is set (seen within 0.25 s). ``shared``: when the shared pauses end, as the caller just read them."""
        scope = scope_of(chat_id)
        while True:
            shared = self._shared_until(scope) if shared is None else shared
            with self._cond:
                if stop is not None and stop.is_set():  # a caller told to stop never spends a token
                    return False
                delay = self._delay(scope, chat_id, paid, shared)
                if delay <= 0:
                    return True
                self._cond.wait(delay if self._share is None and stop is None else min(delay, _SHARED_REFRESH))
            shared = None

    def ready(self, chat_id: int | None, *, paid: bool = False, shared: float | None = None) -> bool:
        """:meth:`wait` without waiting: ``False`` (nothing taken) when the call would have to wait."""
        scope = scope_of(chat_id)
        shared = self._shared_until(scope) if shared is None else shared
        with self._cond:
            return self._delay(scope, chat_id, paid, shared) <= 0

    def judge(self, answer: Any, chat_id: int | None) -> tuple[int, str, verdicts.Verdict]:
        """The status, text and verdict of ``answer`` to a call to ``chat_id``; a 429 pauses the call's scope."""
        status = int(getattr(answer, "status_code", 0) or 0)
        try:
            text = str(answer.text)
        except Exception:
            text = ""
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        verdict = verdicts.judge_answer(status, body, max_wait=MAX_CALL_WAIT)
        if verdict.pause:
            self.pause(chat_id, verdict.pause)
        return status, text, verdict

    def _delay(self, scope: str, chat_id: int | None, paid: bool, shared: float) -> float:
        """Seconds until a call to ``scope`` may leave (its tokens taken when that is now); under ``_cond``."""
        now = self._clock()
        delay = max(self._pauses.get(scope, 0.0), self._pauses.get(BOT_SCOPE, 0.0), shared) - now
        if delay <= 0 and self._rates is not None:
            delay = self._take(chat_id, paid, now)
        return delay

    def _take(self, chat_id: int | None, paid: bool, now: float) -> float:
        """Take the call's tokens (0.0) or say how long until they are there (nothing taken); a shared store
        that fails falls back to this process's own buckets (logged)."""
        wanted = self._wanted(chat_id, paid)
        if self._share is not None:
            try:
                return self._share.take_tokens(wanted, now)
            except Exception:
                log.warning("could not take shared rate-limit tokens; using this process's own", exc_info=True)
        return spend(wanted, now, lambda scope, burst: self._buckets.get(scope, (burst, now)),
                     self._buckets.__setitem__)

    def _wanted(self, chat_id: int | None, paid: bool) -> list[tuple[str, float, float]]:
        """``(bucket, rate per second, burst)`` of every bucket a call to ``chat_id`` spends a token of."""
        rates = self._rates
        assert rates is not None
        wanted: list[tuple[str, float, float]] = []
        if paid:
            wanted.append(("paid", rates.paid_per_bot, max(1.0, rates.paid_per_bot / 10)))
        else:
            wanted.append((BOT_SCOPE, rates.per_bot, rates.bot_burst))
        if chat_id is not None:
            if chat_id < 0:
                wanted.append((f"chat:{chat_id}", rates.per_group_minute / 60.0, rates.group_burst))
            else:
                wanted.append((f"chat:{chat_id}", rates.per_chat, rates.chat_burst))
        return wanted

    def _shared_until(self, scope: str) -> float:
        """When the pauses other processes recorded for ``scope`` (or the bot) end; ``0.0`` for none, nothing
        shared, or a store that cannot be read (logged once per run of failures)."""
        share = self._share
        if share is None:
            return 0.0
        try:
            until = share.paused_until(scope, self._clock())
        except Exception:
            if not self._share_failing:
                log.warning("could not read the pauses other processes recorded; this process's own still hold",
                            exc_info=True)
            self._share_failing = True
            return 0.0
        self._share_failing = False
        return until


class _Passing(threading.local):
    depth = 0  # > 0 while this thread's request is inside a LimitedSender


_LOCK = threading.Lock()
_FENCES = [0]  # call journals installed in this process
_PASSING = _Passing()


def paid(params: Any) -> bool:
    """Whether a call's parameters ask for ``allow_paid_broadcast`` (it spends the paid bucket)."""
    return bool(isinstance(params, dict) and str(params.get("allow_paid_broadcast", "")).lower() == "true")


class LimitedSender:
    """The request sender of calls made outside a handler: waits for ``limits`` (giving up when ``stop`` is set),
    calls ``check(method)`` (what it raises reaches the caller, nothing sent), sends, and pauses on a 429."""

    def __init__(self, limits: Limits, stop: threading.Event | None = None,
                 check: Callable[[str], None] | None = None) -> None:
        self.limits, self._stop, self._check = limits, stop, check

    def __call__(self, http: str, url: str, params: Any, files: Any, timeout: Any, proxies: Any,
                 forward: Forward) -> Any:
        method = method_of_url(url)
        if not verdicts.journaled(method) or _PASSING.depth > 0:
            return forward(http, url, params, files, timeout, proxies)  # read-only, or gated by an outer sender
        chat_id, spends_paid = verdicts.chat_of(params), paid(params)
        if not self.limits.wait(chat_id, paid=spends_paid, stop=self._stop):
            self.limits.ready(chat_id, paid=spends_paid)  # stopping: it leaves now, with a token if one is there
        if self._check is not None:
            self._check(method)
        with passing():
            answer = forward(http, url, params, files, timeout, proxies)
        if getattr(answer, "status_code", None) == 429:
            self.limits.judge(answer, chat_id)
        return answer


@contextmanager
def passing() -> Iterator[None]:
    """Inside, this thread's request has waited for the limits already: a :class:`LimitedSender` passes it."""
    _PASSING.depth += 1
    try:
        yield
    finally:
        _PASSING.depth -= 1


def fence_journals(change: int) -> None:
    """Note that a fence's call journal was installed (``+1``) or taken out (``-1``) in this process."""
    with _LOCK:
        _FENCES[0] = max(0, _FENCES[0] + change)


@contextmanager
def shared_limits(store: JournalStore, *, rates: Rates | None = None) -> Iterator[Limits]:
    """While inside, every Bot API call of this process waits for the rate limits the bot shares through ``store``
    (its pauses, and with ``rates`` its buckets), and a 429 pauses its scope there for every process of the bot.
    Yields the limits.

    For a process without a fence (``telegram-fence broadcast run --db``). Raises
    :class:`~telegram_fence.errors.ConfigurationError` when a fence journals calls in this process (its limits
    would be waited for twice). A block opened inside another waits nothing more (:func:`passing`).
    """
    if _FENCES[0]:
        raise ConfigurationError("a fence journals calls in this process: its broadcasts and other calls wait "
                                 "for the shared limits already; do not open shared_limits() beside it")
    limits = Limits(rates, share=Journal(store))
    undo = install_request_sender(LimitedSender(limits))
    try:
        yield limits
    finally:
        undo()
