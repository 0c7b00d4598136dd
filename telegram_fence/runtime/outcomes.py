"""Running one attempt of the handler and recording how it ended: settle, retry or exhaust.

One job: :class:`Attempts` (parse the stored update, call the handler inside the attempt extensions, have a retry or
an exhaustion written by the writer through ``runtime.writer`` when it raised). Settling is the writer's round's;
lease renewal and handler timeouts are the heartbeat's. May import ``errors``, ``retry``, ``runtime.attempt``,
``runtime.decisions``, ``runtime.mailbox``, ``runtime.state``, ``runtime.writer`` and the standard library. Logs as
``telegram_fence.workers``.

Thread safety: :meth:`Attempts.run` runs on a worker thread, on several at once; it reaches the others through the
pool's parts and the mailbox, each thread-safe on its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import OwnershipLost
from ..retry import RetryPolicy
from ..textlog import IN_MESSAGE
from . import decisions
from .attempt import AttemptContext, error_line, error_text, log_extra, raised_at, refusal
from .capabilities import StoreCapabilities
from .mailbox import Mailbox
from .state import PoolState
from .writer import Writer

__all__ = ["Attempts", "Handler", "Parser"]

log = logging.getLogger("telegram_fence.workers")

Handler = Callable[[Any, AttemptContext], None]
Parser = Callable[[Mapping[str, Any]], Any]


class Attempts:
    """Runs attempts and records their failures; owned by the pool."""

    def __init__(
        self,
        state: PoolState,
        *,
        mailbox: Mailbox,
        writer: Writer,
        store: StoreCapabilities,
        handle: Handler,
        parse: Parser,
        max_attempts: int,
        retry: RetryPolicy,
        on_exhausted: Callable[[], None],
    ) -> None:
        self._state = state
        self._mailbox = mailbox
        self._writer = writer
        self._store = store.store
        self._handle = handle
        self._parse = parse
        self._max_attempts = max_attempts
        self._retry = retry
        self._on_exhausted = on_exhausted
        self._clock = store.store.clock
        self._see = _where_to_see(store.path)

    def run(self, ctx: AttemptContext) -> str:
        """Run one attempt; returns ``"settle"`` when the dispatcher should settle the update.

        Otherwise ``"completed"`` (the handler settled it), ``"retried"``, ``"exhausted"`` or ``"lost"``.
        Never raises for a handler's ``Exception``: it is recorded as a retry or an exhaustion.
        """
        try:
            update = self._parse(ctx.raw)
        except Exception as exc:
            self._exhaust(ctx, f"the update could not be parsed: {error_text(exc)}", log_extra(ctx), exc)
            return "exhausted"
        try:
            self._handle(update, ctx)
        except OwnershipLost:
            self._state.counters.add("lost")
            log.warning("update %s: attempt %s lost ownership; its writes were refused", ctx.update_id, ctx.attempt,
                        extra=log_extra(ctx))
            return "lost"
        except Exception as exc:
            return self._failed(ctx, exc, log_extra(ctx))
        if ctx.completed:
            self._state.counters.add("handled")
            return "completed"
        return "settle"

    def _failed(self, ctx: AttemptContext, exc: Exception, extra: dict[str, Any]) -> str:
        text = error_text(exc)
        delay = self._policy_delay(ctx, exc, extra)
        if decisions.exhausts(delay, ctx.attempt, self._max_attempts):
            self._exhaust(ctx, text, extra, exc)
            return "exhausted"
        where = raised_at(exc)  # the traceback comes with the exhaustion: until then, the line says where
        log.warning("update %s: handler failed (attempt %s of %s): %s%s; will retry in %s s", ctx.update_id,
                    ctx.attempt, self._max_attempts, error_line(exc), "" if where is None else f" (at {where})",
                    _seconds(delay),
                    extra={**extra, **_refusal_fields(exc), "retry_in": delay, "err": exc, "raised_at": where,
                           IN_MESSAGE: ("retry_in", "err", "raised_at", *_REFUSAL_KEYS)})  # stated once
        try:
            assert delay is not None
            at = decisions.retry_due(self._clock(), delay)
            store = self._store
            retried = self._writer.call(lambda: store.retry_owned(ctx.identity, at, text), durable=False)
        except Exception:
            log.error("update %s: recording the retry failed; the update is retried after its lease",
                      ctx.update_id, exc_info=True, extra=extra)
            return "retried"
        self._state.counters.add("retried" if retried else "lost")
        if retried:
            self._mailbox.retry_due(decisions.retry_due(time.monotonic(), delay))
        return "retried"

    def _policy_delay(self, ctx: AttemptContext, exc: Exception, extra: dict[str, Any]) -> float | None:
        """The retry policy's delay for ``ctx``'s failure ``exc`` (``None``: exhaust now); when the policy raises, or
        answers no delay (:func:`~.decisions.policy_delay`: NaN, an infinity, a bool, no number), an error line says
        so and :data:`~.decisions.POLICY_FALLBACK_DELAY` is used."""
        fallback = decisions.POLICY_FALLBACK_DELAY
        try:
            answer = self._retry(exc, ctx.attempt)
        except Exception:
            log.error("the retry policy raised; using %s s", fallback, exc_info=True, extra=extra)
            return fallback
        try:
            return decisions.policy_delay(answer)
        except ValueError as refused:
            log.error("update %s: %s; using %s s", ctx.update_id, refused, fallback, extra=extra)
            return fallback

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
            self._state.counters.add("exhausted")
            fields = _refusal_fields(exc)
            # A refusal by Telegram is told in full by its line (the traceback stays in the store: `show`);
            # any other error brings its traceback to the log.
            log.error("update %s exhausted after attempt %s: %s; see it with: %s", ctx.update_id, ctx.attempt,
                      error_line(exc), self._see,
                      extra={**extra, **fields, "error": text.splitlines()[-1] if text else "",
                             IN_MESSAGE: ("error", *_REFUSAL_KEYS)},  # the text line states them once
                      exc_info=None if fields else exc)
            self._on_exhausted()
        else:
            self._state.counters.add("lost")


#: The fields of a refusal, which the message of its line also states (``Telegram refused METHOD (error CODE): …``).
_REFUSAL_KEYS = ("method", "error_code", "description")


def _refusal_fields(exc: BaseException) -> dict[str, Any]:
    """The log fields of a call Telegram refused (``method``, ``error_code``, ``description``), else none."""
    answer = refusal(exc)
    if answer is None:
        return {}
    return {"method": answer.method, "error_code": answer.error_code, "description": answer.description}


def _where_to_see(path: str | None) -> str:
    """The command that lists the store's exhaustions: with its file's ``path`` (SQLite), else a placeholder for
    the DSN (never a DSN's password)."""
    if path is not None:
        import shlex  # (here: one log line of an exhaustion is its only use)

        return f"telegram-fence exhaustions {shlex.quote(path)}"
    return "telegram-fence exhaustions DSN (the database's connection string)"


def _seconds(delay: Any) -> str:
    """A retry delay for a log line (whatever the policy returned), to a tenth of a second."""
    try:
        return f"{round(max(0.0, float(delay)), 1):g}"
    except (TypeError, ValueError):
        return repr(delay)
