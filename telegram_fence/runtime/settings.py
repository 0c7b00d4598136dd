"""What a ``Fence`` is given, checked in one place: its options as one validated frozen value (:class:`FenceSettings`),
and the checks of the bot, the store and the capture it runs with.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..calls.frame import UncertainCall
from ..calls.limits import Rates
from ..errors import ConfigurationError
from ..records import Record
from ..retry import RetryPolicy, default_retry
from ..store import Exhaustion, UpdateStore, missing_methods
from ..store.values import check_claim

__all__ = [
    "FENCE_INIT_DOC", "FenceSettings", "OperatorPost", "check_bot", "open_store", "polling_options", "split_capture",
]

class OperatorPost(Protocol):
    """What the fence needs of an operator channel (:class:`~telegram_fence.OperatorChannel` has it): ``post(text)``,
    which must not block for long."""

    def post(self, text: str) -> object: ...


class FenceSettings(Record):
    """The options of a :class:`~telegram_fence.Fence`, checked when made (immutable, so any thread may read them).

    - ``workers``: the most handler threads at once (they start as handlers are in flight and end after
      :data:`~telegram_fence.runtime.workers.IDLE_SECONDS` without work; one chat runs one update at a time, so a
      slow handler holds its own chat's thread only); ``lease``: seconds a claim lasts without renewal (renewed every
      ``lease / 3``); ``max_attempts``: attempts before an update is exhausted; ``retry``:
      ``fn(error, attempt) -> seconds | None`` (``None`` means :func:`~telegram_fence.retry.default_retry`);
    - ``long_poll_timeout``, ``allowed_updates``: passed to ``getUpdates``; ``authorize(raw_update)``:
      ``False`` records the update as skipped (the cursor advances, no handler runs; an authorize
      that raises also skips: it fails closed);
    - ``handler_timeout``: seconds after which a running handler loses its update to another worker;
    - ``on_exhausted(exhaustion)``: told of every terminal failure at least once (also at start);
      the exhaustion is acknowledged only after it returned; ``on_ended(reason)``: called once when
      the fence ended on its own; ``operator``: an :class:`~telegram_fence.OperatorChannel` told of
      ends, exhaustions and watchdog events;
    - ``retention``: seconds settled rows are kept before pruning; ``shutdown_timeout``: how long running handlers
      get on stop; ``conflict_grace``: how long a 409 (another instance polling) is retried before the poller ends;
      ``watchdog_margin``: how far past ``long_poll_timeout`` a getUpdates may run before the poller counts as stalled;
    - ``metrics``: ``(host, port)`` to serve ``GET /metrics``, ``/livez`` and ``/readyz`` on (thread
      ``fence-metrics``; port 0 picks a free one), or ``None``; ``skip_pending``: on the first start of
      a database (no cursor stored yet) drop what waits at Telegram but the newest update (see ``run``);
      ``request_timeout``: the least time each ``getUpdates`` answer is waited for (the bound is
      ``max(long_poll_timeout + 10, request_timeout)``; telebot's ``timeout``), or ``None``;
    - ``logger``: where the fence logs (``None``: ``telegram_fence.fence``); ``states``: where telebot's
      conversation state lives (``None``: in the fence's store where the bot uses telebot's in-memory defaults;
      ``True``: always; ``False``: where the bot keeps it; see ``docs/states.md``);
    - ``journal_calls``: keep the Bot API calls of handlers in the call journal (see ``docs/calls.md``);
      ``on_uncertain(call)``: told of a call whose outcome is unknown; ``uncertain_calls``: ``"continue"`` (such
      a call returns ``None``) or ``"raise"`` (it raises ``CallUncertain``); ``rate_limits``: proactive
      :class:`~telegram_fence.calls.limits.Rates`, or ``None`` (only the pauses a 429 asks for).

    These fields are the one place the options are documented, their defaults kept and their values checked
    (:data:`_CHECKS`): a wrong one raises :class:`ConfigurationError` naming it.
    """

    __slots__ = ("allowed_updates", "authorize", "conflict_grace", "handler_timeout", "journal_calls",
                 "lease", "logger", "long_poll_timeout", "max_attempts", "metrics", "on_ended",
                 "on_exhausted", "on_uncertain", "operator", "rate_limits", "request_timeout", "retention", "retry",
                 "shutdown_timeout", "skip_pending", "states", "uncertain_calls", "watchdog_margin", "workers")
    workers: int
    lease: float
    max_attempts: int
    retry: RetryPolicy  # None given: default_retry
    long_poll_timeout: float
    allowed_updates: Sequence[str] | None
    authorize: Callable[[Mapping[str, Any]], bool] | None
    handler_timeout: float
    on_exhausted: Callable[[Exhaustion], Any] | None
    on_ended: Callable[[str], Any] | None
    operator: OperatorPost | None
    retention: float
    shutdown_timeout: float
    conflict_grace: float
    watchdog_margin: float
    metrics: tuple[str, int] | None
    skip_pending: bool
    request_timeout: float | None
    logger: logging.Logger | None
    states: bool | None
    journal_calls: bool
    on_uncertain: Callable[[UncertainCall], Any] | None
    uncertain_calls: str
    rate_limits: Rates | None

    def __init__(self, workers: int = 64, lease: float = 30.0, max_attempts: int = 5,
                 retry: RetryPolicy | None = None, long_poll_timeout: float = 25,
                 allowed_updates: Sequence[str] | None = None,
                 authorize: Callable[[Mapping[str, Any]], bool] | None = None, handler_timeout: float = 300.0,
                 on_exhausted: Callable[[Exhaustion], Any] | None = None,
                 on_ended: Callable[[str], Any] | None = None, operator: OperatorPost | None = None,
                 retention: float = 86400.0, shutdown_timeout: float = 10.0,
                 conflict_grace: float = 60.0, watchdog_margin: float = 30.0,
                 metrics: tuple[str, int] | None = None, skip_pending: bool = False,
                 request_timeout: float | None = None, logger: logging.Logger | None = None,
                 states: bool | None = None, journal_calls: bool = True,
                 on_uncertain: Callable[[UncertainCall], Any] | None = None, uncertain_calls: str = "continue",
                 rate_limits: Rates | None = None) -> None:
        for name, value in list(locals().items())[1:]:  # the parameters, self aside
            object.__setattr__(self, name, value)
        self._check()

    def _check(self) -> None:
        for name, (test, wants) in _CHECKS:
            value = getattr(self, name)
            if not test(value):
                raise ConfigurationError(f"{name}={value!r}{wants}")
        check_claim(self.lease, self.max_attempts)  # the stores' own bounds (max_attempts at most 2**63 - 1)
        for name in ("allowed_updates", "metrics"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "lease", float(self.lease))
        object.__setattr__(self, "retry", default_retry if self.retry is None else self.retry)


#: The docstring of ``Fence.__init__``: what it checks and raises (the checks of this module), then the options as
#: this class documents them (its docstring's second paragraph), so they are written once.
FENCE_INIT_DOC = """Check every option, open the store (for a path), and make a threaded bot run its handlers on the
fence's threads; nothing runs until :meth:`start` or :meth:`run`.

Raises :class:`ConfigurationError` naming the option, or the bot, that is wrong (checked before anything is
opened; the bot is then left as it was); for a path, the store's errors: :class:`StoreUnavailable` (its directory
does not exist, the file stayed locked), :class:`StoreCorrupt` (not a SQLite file, a directory),
:class:`SchemaError` (a schema version newer than this library's).

The options (the fields of ``FenceSettings``, which checks them):

""" + "".join(inspect.cleandoc(FenceSettings.__doc__ or "").split("\n\n")[1:2])  # (none under python -OO)


def check_bot(bot: Any) -> None:
    """Accept only a bot the fence can run (threaded or not): one with a token, else :class:`ConfigurationError`."""
    token = getattr(bot, "token", None)
    if not isinstance(token, str) or not token:
        raise ConfigurationError("the bot has no token; pass a telebot.TeleBot created with its token")


#: What telebot's ``polling()`` takes beyond ``infinity_polling``'s own arguments, accepted (so
#: ``infinity_polling(none_stop=True, interval=0)`` moves unchanged) and changing nothing: the fence long-polls without
#: a pause, and never stops polling on an error it can retry. Each with the check of :data:`_CHECKS`'s form.
_POLLING_ACCEPTED: dict[str, _Check] = {
    "interval": (lambda v: _is_number(v) and v >= 0, " must be a number of seconds (0 or more)"),
    "none_stop": (lambda v: v is None or isinstance(v, bool), " must be True or False"),
    "non_stop": (lambda v: v is None or isinstance(v, bool), " must be True or False"),
}


def polling_options(settings: FenceSettings, *, timeout: float | None, skip_pending: bool,
                    long_polling_timeout: float | None, logger_level: int | None, allowed_updates: Sequence[str] | None,
                    restart_on_change: bool, path_to_watch: str | None, other: Mapping[str, Any]) -> FenceSettings:
    """``settings`` with what ``bot.infinity_polling(...)`` was given, so ``Fence(bot, db).run(...)`` keeps it.

    ``long_polling_timeout`` is ``long_poll_timeout``; ``timeout`` (telebot's HTTP timeout) is ``request_timeout``,
    and ``watchdog_margin`` grows so the watchdog never ends a call that may still answer; ``logger_level`` and
    :data:`_POLLING_ACCEPTED` change nothing. :class:`ConfigurationError` for ``restart_on_change``/``path_to_watch``,
    any other name, a value its setting refuses, and ``allowed_updates`` differing from the one given to ``Fence()``.
    """
    for name, value in other.items():
        if name not in _POLLING_ACCEPTED:
            raise ConfigurationError(f"run() does not take {name}=: telebot's infinity_polling() does not take it "
                                     "either; remove it")
        test, wants = _POLLING_ACCEPTED[name]
        if not test(value):
            raise ConfigurationError(f"{name}={value!r}{wants}")
    if restart_on_change or path_to_watch is not None:
        raise ConfigurationError(
            "run() does not take restart_on_change/path_to_watch: a fenced bot is restarted by its supervisor "
            "(systemd, Docker, or a file watcher that restarts the script; the fence stops cleanly on SIGTERM and "
            "loses nothing); remove them"
        )
    if logger_level is not None and (isinstance(logger_level, bool) or not isinstance(logger_level, int)):
        raise ConfigurationError(f"logger_level={logger_level!r} must be a logging level such as logging.ERROR")
    changes: dict[str, Any] = {}
    if allowed_updates is not None:  # its type is checked by the settings, as when given to Fence()
        if (settings.allowed_updates is not None and not isinstance(allowed_updates, str)
                and list(settings.allowed_updates) != list(allowed_updates)):
            raise ConfigurationError("allowed_updates was given to Fence() and to run() with different values; "
                                     "give it once")
        changes["allowed_updates"] = allowed_updates
    long_poll = settings.long_poll_timeout
    if long_polling_timeout is not None:
        changes["long_poll_timeout"] = long_poll = long_polling_timeout
    if timeout is not None:
        changes["request_timeout"] = timeout
        if isinstance(timeout, (int, float)) and isinstance(long_poll, (int, float)):
            changes["watchdog_margin"] = max(settings.watchdog_margin, timeout - long_poll + 5)
    if skip_pending is not False:
        changes["skip_pending"] = skip_pending  # checked by the settings
    return settings._replace(**changes) if changes else settings


def split_capture(capture: Any) -> tuple[Any, Callable[..., Any] | None]:
    """``(the outbox to start and stop, or None; the record hook, or None)`` for the ``capture`` option (an Outbox
    is captured into and delivered by the fence; a hook or rule only captures). :class:`ConfigurationError` for an
    Outbox without a rule or a capture that is no hook."""
    outbox = capture if callable(getattr(capture, "start", None)) and hasattr(capture, "join") else None
    if outbox is not None and getattr(outbox, "rule", True) is None:
        raise ConfigurationError("capture=Outbox(...) needs rule=CaptureRule(...): without one nothing is captured")
    hook = getattr(capture, "record_hook", capture)
    if hook is not None and not callable(hook):
        raise ConfigurationError("capture must be an Outbox, a CaptureRule or a hook fn(conn, new_updates)")
    return outbox, hook


def open_store(store_or_path: str | os.PathLike[str] | UpdateStore
               ) -> tuple[UpdateStore, Callable[[], None] | None]:
    """``(the store, how to close it when the fence opened it, else None)``: a path opens a ``SqliteUpdateStore``
    there (its errors propagate); another object must have every method of :class:`~telegram_fence.store.UpdateStore`,
    else :class:`ConfigurationError`."""
    if isinstance(store_or_path, (str, os.PathLike)):
        from ..store.sqlite import SqliteUpdateStore

        opened = SqliteUpdateStore(store_or_path)
        return opened, opened.close
    store = store_or_path
    missing = missing_methods(store)
    if missing:
        raise ConfigurationError(
            f"the store {type(store).__name__} has no {', '.join(missing)}; the fence needs every method of "
            "telegram_fence.store.UpdateStore (telegram_fence.testing.conformance checks a store against it)"
        )
    return store, None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


_Check = tuple[Callable[[Any], bool], str]
_POSITIVE: _Check = (lambda v: _is_number(v) and 0 < v < math.inf, " must be a positive number")
_SECONDS: _Check = (lambda v: _is_number(v) and 0 <= v < math.inf, " must be a number of seconds, 0 or more")
_WHOLE: _Check = (lambda v: isinstance(v, int), " must be a whole number")
_FUNCTION: _Check = (lambda v: v is None or callable(v), " must be a function or None")
_FLAG: _Check = (lambda v: isinstance(v, bool), " must be True or False")

#: The checks of :class:`FenceSettings`, in the order they run: ``(option, (test, the error's end))``.
_CHECKS: tuple[tuple[str, _Check], ...] = (
    ("request_timeout", (lambda v: v is None or _POSITIVE[0](v), _POSITIVE[1])),
    *((name, _POSITIVE) for name in ("workers", "lease", "max_attempts", "long_poll_timeout", "watchdog_margin")),
    ("workers", _WHOLE),
    ("max_attempts", _WHOLE),
    ("handler_timeout", (lambda v: _is_number(v) and v > 0, _POSITIVE[1])),  # math.inf: never
    *((name, _SECONDS) for name in ("retention", "shutdown_timeout", "conflict_grace")),
    *((name, _FUNCTION) for name in ("retry", "authorize", "on_exhausted", "on_ended", "on_uncertain")),
    ("operator", (lambda v: v is None or callable(getattr(v, "post", None)),
                  " must be an OperatorChannel (anything with post(text)) or None")),
    ("logger", (lambda v: v is None or isinstance(v, logging.Logger), " must be a logging.Logger or None")),
    ("states", (lambda v: v is None or isinstance(v, bool),
                " must be True, False or None (the default: replace telebot's in-memory defaults only)")),
    ("journal_calls", _FLAG),
    ("skip_pending", _FLAG),
    ("uncertain_calls", (lambda v: v in ("continue", "raise"),
                         ": use 'continue' (an uncertain call returns None) or 'raise' (it raises CallUncertain)")),
    ("rate_limits", (lambda v: v is None or isinstance(v, Rates),
                     " must be telegram_fence.calls.limits.Rates(...) or None")),
    ("metrics", (lambda v: v is None or (isinstance(v, (tuple, list)) and len(v) == 2 and isinstance(v[0], str)
                                         and v[0] != "" and type(v[1]) is int and 0 <= v[1] <= 65535),
                 " must be (host, port), such as ('127.0.0.1', 9464); port 0 picks a free one")),
    ("allowed_updates", (lambda v: v is None or (not isinstance(v, str) and all(isinstance(u, str) for u in v)),
                         " must be a list of update types such as ['message', 'callback_query'], or None")),
)
