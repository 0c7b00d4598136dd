"""The one path by which a Bot API call that is not a handler's meets Telegram's rate limits: broadcasts, the
operator channel, an application's own threads, and a ``telegram-fence broadcast run`` in a process of its own.

:class:`LimitedSender` is a telebot request sender: it waits for the :class:`~telegram_fence.calls.limits.Limits`
(429 pauses per chat or for the whole bot, optional :class:`~telegram_fence.calls.limits.Rates` buckets), sends,
and pauses the call's scope when Telegram answers 429. While a fence journals calls, its ``CallJournal`` sends
every non-handler call through one of these (on the fence's limits); a process without a fence uses
:func:`shared_limits` to put one on the limits the bot shares through its store, so a pause the bot met holds the
broadcast, and a pause the broadcast met holds the bot. ``get*`` calls pass untouched.

May import ``errors``, ``telegram``, ``calls.verdicts``, ``calls.journal``, ``calls.limits`` and the standard
library (layer 2). Thread safety: a :class:`LimitedSender` serves every thread.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import ConfigurationError
from ..telegram import Forward, install_request_sender, method_of_url
from . import verdicts
from .journal import Journal, JournalStore
from .limits import Limits, Rates

__all__ = ["MAX_CALL_WAIT", "LimitedSender", "fence_started", "fence_stopped", "paid", "passing", "shared_limits",
           "shared_open"]

#: Longest 429 wait a call sits out inside the fence before the 429 reaches its caller (who waits it out).
MAX_CALL_WAIT = 30.0

_LOCK = threading.Lock()
_FENCES = 0  # call journals installed in this process now
_SHARED = 0  # shared_limits() blocks open in this process now
_PASSING = threading.local()  # .depth > 0 while this thread's request is inside a LimitedSender


def _depth() -> int:
    depth: int = getattr(_PASSING, "depth", 0)
    return depth


def paid(params: Any) -> bool:
    """Whether a call's parameters ask for ``allow_paid_broadcast`` (it spends the paid bucket)."""
    return bool(isinstance(params, dict) and str(params.get("allow_paid_broadcast", "")).lower() == "true")


def _json_of(answer: Any) -> Any:
    try:
        return json.loads(str(answer.text))
    except Exception:
        return None


class LimitedSender:
    """The request sender of calls made outside a handler (see the module docstring); ``stop``: a wait for
    the limits gives up when it is set, and the request is then sent without waiting further (the caller's
    own 429 handling still applies); ``check(method)``: called after the wait, right before the request leaves
    (what it raises reaches the caller, and nothing is sent)."""

    def __init__(self, limits: Limits, stop: threading.Event | None = None,
                 check: Callable[[str], None] | None = None) -> None:
        self.limits = limits
        self._stop = stop
        self._check = check

    def __call__(self, http: str, url: str, params: Any, files: Any, timeout: Any, proxies: Any,
                 forward: Forward) -> Any:
        method = method_of_url(url)
        if not verdicts.journaled(method) or _depth() > 0:
            return forward(http, url, params, files, timeout, proxies)  # read-only, or gated by an outer sender
        chat_id = verdicts.chat_of(params)
        self.limits.wait(chat_id, paid=paid(params), stop=self._stop)
        if self._check is not None:
            self._check(method)
        with passing():
            answer = forward(http, url, params, files, timeout, proxies)
        if getattr(answer, "status_code", None) == 429:
            verdict = verdicts.judge_answer(429, _json_of(answer), max_wait=MAX_CALL_WAIT)
            self.limits.pause(chat_id, verdict.pause)
        return answer


@contextmanager
def passing() -> Iterator[None]:
    """Inside, this thread's request has waited for the limits already: a :class:`LimitedSender` further down
    the chain of request senders passes it untouched (the call journal sends its requests inside this)."""
    _PASSING.depth = _depth() + 1
    try:
        yield
    finally:
        _PASSING.depth -= 1


def fence_started() -> None:
    """Note that a fence's call journal is installed in this process (``CallJournal.start``)."""
    global _FENCES
    with _LOCK:
        _FENCES += 1


def fence_stopped() -> None:
    """Note that a fence's call journal was taken out again (``CallJournal.stop``)."""
    global _FENCES
    with _LOCK:
        _FENCES = max(0, _FENCES - 1)


@contextmanager
def shared_limits(store: JournalStore, *, rates: Rates | None = None) -> Iterator[Limits]:
    """While inside, every Bot API call of this process (telebot's, any thread) waits for the rate limits the bot
    shares through ``store`` (its fence's store: a SQLite file's or a PostgreSQL database's ``fence_pauses``, and
    with ``rates`` its ``fence_buckets``), and a 429 it gets pauses its scope there for every process of the bot.

    For a process without a fence, such as ``telegram-fence broadcast run --db``: a fence's own calls already go
    through the limits (a fence started inside the block puts its own limits first: its ``rate_limits=`` apply to
    its calls, the block's ``rates`` do not; the pauses are the same store's when it uses the same store).
    Raises :class:`~telegram_fence.errors.ConfigurationError` when a fence journals calls in this process (its
    limits would be waited for twice) or when a block is open already. Yields the limits.
    """
    global _SHARED
    with _LOCK:
        if _FENCES:
            raise ConfigurationError("a fence journals calls in this process: its broadcasts and other calls wait "
                                     "for the shared limits already; do not open shared_limits() beside it")
        if _SHARED:
            raise ConfigurationError("shared_limits() is open already in this process")
        _SHARED += 1
    try:
        limits = Limits(rates, share=Journal(store))
        undo = install_request_sender(LimitedSender(limits))
        try:
            yield limits
        finally:
            undo()
    finally:
        with _LOCK:
            _SHARED -= 1


def shared_open() -> bool:
    """Whether a :func:`shared_limits` block is open in this process."""
    with _LOCK:
        return bool(_SHARED)
