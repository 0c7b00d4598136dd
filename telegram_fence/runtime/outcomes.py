"""Running one attempt of the handler and recording how it ended: settle, retry or exhaust.

:func:`adopt` makes a threaded bot run its handlers on the fence's threads. :class:`Attempts` runs on the worker
threads, several at once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from telebot import types as tb_types

from ..errors import OwnershipLost
from ..retry import RetryPolicy
from ..store import UpdateStore
from ..textlog import IN_MESSAGE
from .attempt import (
    AttemptContext,
    current_attempt,
    error_line,
    error_text,
    log_extra,
    raised_at,
    refusal,
)
from .mailbox import Writer
from .state import PoolState

__all__ = ["POLICY_FALLBACK_DELAY", "Attempts", "Handler", "Parser", "adopt", "policy_delay", "telebot_update"]

log = logging.getLogger("telegram_fence.workers")

Handler = Callable[[Any, AttemptContext], None]
Parser = Callable[[Mapping[str, Any]], Any]

#: The delay used when the retry policy raised, or answered something that is no delay (see :func:`policy_delay`).
POLICY_FALLBACK_DELAY = 60.0


def policy_delay(answer: object) -> float | None:
    """A retry policy's ``answer`` as the delay to use: ``None`` (exhaust now) or a finite number of seconds. Anything
    else (NaN, an infinity, a bool, no number) raises ``ValueError`` naming it: an infinite delay would leave the
    update, and its chat's later updates, waiting forever."""
    if answer is None:
        return None
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
        raise ValueError(f"the retry policy answered {answer!r}: not a finite number of seconds, nor None")
    return float(answer)


def telebot_update(raw: Mapping[str, Any]) -> tb_types.Update:
    """The telebot ``Update`` of a stored update; raises ``ValueError`` when telebot parses it as empty."""
    # telebot reads the top level without changing it and copies each nested object it parses.
    update = tb_types.Update.de_json(raw if type(raw) is dict else dict(raw))
    if update is None:
        raise ValueError("telebot parsed the update as empty")
    return update


def adopt(bot: Any) -> Callable[[], None]:
    """Make a threaded ``bot`` (telebot's default) run its handlers on the calling fence thread; return the undo.

    telebot hands every handler to ``_exec_task``, which for a threaded bot queues it on the bot's pool and returns
    before it ran: the fence could not tell a handled update from a lost one. The installed ``_exec_task`` runs the
    task right there on a thread running a fence attempt (an exception the bot's ``exception_handler`` does not take
    propagates to the fence), and hands it to telebot's own path elsewhere. A bot that is not threaded is left alone.
    """
    if not getattr(bot, "threaded", False) or not callable(getattr(type(bot), "_exec_task", None)):
        return lambda: None
    telebots_own = type(bot)._exec_task

    def exec_task(task: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if current_attempt() is None:  # not a fence thread: telebot's path (its worker pool)
            telebots_own(bot, task, *args, **kwargs)
            return
        try:
            task(*args, **kwargs)
        except Exception as exc:
            handler = getattr(bot, "exception_handler", None)
            if handler is None or not handler.handle(exc):
                raise

    bot._exec_task = exec_task

    def undo() -> None:
        if bot.__dict__.get("_exec_task") is exec_task:
            del bot._exec_task

    return undo


class Attempts:
    """Runs attempts and records their failures; owned by the pool."""

    def __init__(self, state: PoolState, *, writer: Writer, store: UpdateStore, handle: Handler, parse: Parser,
                 max_attempts: int, retry: RetryPolicy, on_exhausted: Callable[[], None]) -> None:
        self._state = state
        self._mailbox = writer.mailbox
        self._writer = writer
        self._store = store
        self._handle = handle
        self._parse = parse
        self._max_attempts = max_attempts
        self._retry = retry
        self._on_exhausted = on_exhausted
        self._clock = store.clock
        self._see = _where_to_see(getattr(store, "path", None))

    def run(self, ctx: AttemptContext) -> str:
        """Run one attempt; ``"settle"`` when the writer should settle the update, else ``"completed"``,
        ``"retried"``, ``"exhausted"`` or ``"lost"``. A handler's ``Exception`` is recorded as a retry or an
        exhaustion, never raised."""
        try:
            update = self._parse(ctx.raw)
        except Exception as exc:
            self._exhaust(ctx, f"the update could not be parsed: {error_text(exc)}", log_extra(ctx), exc)
            return "exhausted"
        try:
            self._handle(update, ctx)
        except OwnershipLost:
            self._state.count("lost")
            log.warning("update %s: attempt %s lost ownership; its writes were refused", ctx.update_id, ctx.attempt,
                        extra=log_extra(ctx))
            return "lost"
        except Exception as exc:
            return self._failed(ctx, exc, log_extra(ctx))
        if ctx.completed:
            self._state.count("handled")
            return "completed"
        return "settle"

    def _failed(self, ctx: AttemptContext, exc: Exception, extra: dict[str, Any]) -> str:
        text = error_text(exc)
        try:
            delay = policy_delay(self._retry(exc, ctx.attempt))
        except Exception as refused:  # a policy that raised or answered no delay: the fallback, said so
            log.error("update %s: the retry policy failed (%s); using %s s", ctx.update_id, refused,
                      POLICY_FALLBACK_DELAY, exc_info=True, extra=extra)
            delay = POLICY_FALLBACK_DELAY
        if delay is None or ctx.attempt >= self._max_attempts:
            self._exhaust(ctx, text, extra, exc)
            return "exhausted"
        where = raised_at(exc)  # the traceback comes with the exhaustion: until then, the line says where
        log.warning("update %s: handler failed (attempt %s of %s): %s%s; will retry in %s s", ctx.update_id,
                    ctx.attempt, self._max_attempts, error_line(exc), "" if where is None else f" (at {where})",
                    f"{round(max(0.0, delay), 1):g}",
                    extra={**extra, **_refusal_fields(exc), "retry_in": delay, "err": exc, "raised_at": where,
                           IN_MESSAGE: ("retry_in", "err", "raised_at", *_REFUSAL_KEYS)})  # stated once
        try:
            at = self._clock() + max(0.0, delay)
            store = self._store
            retried = self._writer.call(lambda: store.retry_owned(ctx.identity, at, text), durable=False)
        except Exception:
            log.error("update %s: recording the retry failed; the update is retried after its lease",
                      ctx.update_id, exc_info=True, extra=extra)
            return "retried"
        self._state.count("retried" if retried else "lost")
        if retried:
            self._mailbox.retry_due(time.monotonic() + max(0.0, delay))
        return "retried"

    def _exhaust(self, ctx: AttemptContext, text: str, extra: dict[str, Any], exc: BaseException) -> None:
        """Record that ``ctx``'s update failed for good; logs one line with the error and its traceback."""
        store = self._store
        try:
            exhausted = self._writer.call(lambda: store.exhaust(ctx.identity, text))
        except Exception:
            log.error("update %s: recording the exhaustion failed; the update is retried after its lease",
                      ctx.update_id, exc_info=True, extra=extra)
            return
        if exhausted:
            self._state.count("exhausted")
            fields = _refusal_fields(exc)
            # a refusal by Telegram is told in full by its line; any other error brings its traceback
            log.error("update %s exhausted after attempt %s: %s; see it with: %s", ctx.update_id, ctx.attempt,
                      error_line(exc), self._see,
                      extra={**extra, **fields, "error": text.splitlines()[-1] if text else "",
                             IN_MESSAGE: ("error", *_REFUSAL_KEYS)},  # the text line states them once
                      exc_info=None if fields else exc)
            self._on_exhausted()
        else:
            self._state.count("lost")


#: The fields of a refusal, which the message of its line also states (``Telegram refused METHOD (error CODE): …``).
_REFUSAL_KEYS = ("method", "error_code", "description")


def _refusal_fields(exc: BaseException) -> dict[str, Any]:
    """The log fields of a call Telegram refused (``method``, ``error_code``, ``description``), else none."""
    answer = refusal(exc)
    if answer is None:
        return {}
    return {"method": answer.method, "error_code": answer.error_code, "description": answer.description}


def _where_to_see(path: object) -> str:
    """The command that lists the store's exhaustions: with its file's ``path`` (SQLite), else a placeholder for
    the DSN (never a DSN's password)."""
    if isinstance(path, str) and path:
        import shlex  # (here: one log line of an exhaustion is its only use)

        return f"telegram-fence exhaustions {shlex.quote(path)}"
    return "telegram-fence exhaustions DSN (the database's connection string)"

