"""Messages to an operator chat that never slow the bot down (see docs/operator.md).

Logs go to ``telegram_fence.operator`` and never carry the message text."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from ..errors import Ambiguous, ConfigurationError, MessageRefused, RecipientGone, RetryAfter, TelegramError, Transient
from ..retry import exponential, retry_after_wait
from ..telegram import call, mask_tokens
from ..updates import escape_lone_surrogates
from .broadcast_message import TEXT_LIMIT, utf16_length

__all__ = ["OperatorChannel", "split_text"]

_EMPTY = "(empty operator message)"

log = logging.getLogger("telegram_fence.operator")


def split_text(text: str, limit: int = TEXT_LIMIT) -> list[str]:
    """Split ``text`` into pieces of at most ``limit`` UTF-16 units that join back to it (``[]`` for ``""``). Cuts after
    the last line break in the second half of a piece, else after the last space there, else at the limit. Raises
    :class:`~telegram_fence.errors.ConfigurationError` when ``limit`` < 2."""
    if not isinstance(limit, int) or limit < 2:
        raise ConfigurationError(f"limit must be an int >= 2; got {limit!r}")
    pieces: list[str] = []
    rest = text
    while utf16_length(rest) > limit:
        end, units = 0, 0
        while units + (2 if ord(rest[end]) > 0xFFFF else 1) <= limit:
            units += 2 if ord(rest[end]) > 0xFFFF else 1
            end += 1
        window = rest[:end]
        cut = window.rfind("\n", end // 2) + 1 or window.rfind(" ", end // 2) + 1 or end
        pieces.append(rest[:cut])
        rest = rest[cut:]
    return [*pieces, rest] if rest else pieces


class OperatorChannel:
    """A bounded, non-blocking queue of messages to one operator chat, sent in order by a background thread.
    ``capacity`` bounds the queue; ``max_attempts``, ``backoff`` and ``max_backoff`` bound retries; ``secrets`` are
    masked besides the bot's token. The thread (``fence-operator``) starts with the first :meth:`post`; :meth:`close`
    stops and joins it. Thread-safe. Bad settings raise :class:`~telegram_fence.errors.ConfigurationError`."""

    def __init__(self, bot: Any, chat_id: int | str, *, capacity: int = 100, secrets: Iterable[str] = (),
                 max_attempts: int = 5, backoff: float = 0.5, max_backoff: float = 30.0,
                 disable_notification: bool = False) -> None:
        if not callable(getattr(bot, "send_message", None)):
            raise ConfigurationError(f"bot must have a send_message method (a telebot.TeleBot); got {bot!r}")
        if isinstance(chat_id, bool) or not isinstance(chat_id, (int, str)) or chat_id == "":
            raise ConfigurationError(f"chat_id must be an int or a non-empty '@channel' string; got {chat_id!r}")
        for label, count in (("capacity", capacity), ("max_attempts", max_attempts)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ConfigurationError(f"{label} must be an int >= 1; got {count!r}")
        for label, seconds in (("backoff", backoff), ("max_backoff", max_backoff)):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
                raise ConfigurationError(f"{label} must be a number of seconds >= 0; got {seconds!r}")
        secret_list = [secrets] if isinstance(secrets, str) else [s for s in secrets if s]
        if isinstance(secrets, str) or not all(isinstance(s, str) for s in secret_list):
            raise ConfigurationError("secrets must be a sequence of strings")
        token = getattr(bot, "token", None)
        self._secrets = tuple(sorted({*secret_list, *([token] if isinstance(token, str) and token else [])},
                                     key=len, reverse=True))
        self._bot, self._chat_id, self._capacity, self._max_attempts = bot, chat_id, capacity, max_attempts
        self._backoff, self._max_backoff = float(backoff), float(max_backoff)
        self._send_kwargs: dict[str, Any] = {"timeout": 30, "disable_notification": disable_notification or None}
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[str] = collections.deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._in_flight = self._closed = False
        self._unreported = self._dropped = self._delivered = self._failed = 0
        self._sent_since_report = capacity  # the first drop is reported at once

    def post(self, text: object) -> None:
        """Queue ``str(text)`` (else a placeholder naming its type); never blocks or raises. A full queue drops (and
        counts) its oldest message; after :meth:`close` the message itself is dropped and counted."""
        try:
            try:
                message = str(text)
            except Exception:
                message = f"<unprintable {type(text).__name__}>"
            with self._cond:
                if self._closed:
                    self._dropped += 1
                else:
                    if len(self._queue) >= self._capacity:
                        self._queue.popleft()
                        self._dropped += 1
                        self._unreported += 1
                    self._queue.append(message)
                    if self._thread is None:
                        self._start_locked()
                    self._cond.notify()
        except Exception:  # post() must never raise into the caller
            pass

    @property
    def dropped(self) -> int:
        """Messages pushed out of a full queue or posted after close."""
        return self._dropped

    @property
    def delivered(self) -> int:
        """Messages (drop reports included) Telegram accepted."""
        return self._delivered

    @property
    def failed(self) -> int:
        """Messages given up: refused, or still failing after ``max_attempts``."""
        return self._failed

    @property
    def pending(self) -> int:
        """Messages queued or being sent (a pending drop report counts as one)."""
        with self._cond:
            return len(self._queue) + int(self._in_flight) + int(self._unreported > 0)

    def _idle_locked(self) -> bool:
        return not self._queue and not self._in_flight and self._unreported == 0

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every message was sent or given up; False if that did not happen within ``timeout`` seconds
        (``None``: no limit) or the thread was stopped first. A negative timeout raises ``ConfigurationError``."""
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise ConfigurationError(f"timeout must be a number of seconds >= 0 or None; got {timeout!r}")
        with self._cond:
            if self._idle_locked():
                return True
            if threading.current_thread() is self._thread or self._stop.is_set():
                return False
            if self._thread is None:
                self._start_locked()
            self._cond.wait_for(lambda: self._idle_locked() or self._stop.is_set(), timeout)
            return self._idle_locked()

    def close(self, timeout: float = 10.0) -> bool:
        """Stop accepting posts, drain for up to ``timeout`` seconds, then stop and join the thread (at most half a
        second more: a send on the wire may finish later). True only when everything posted was delivered."""
        if not isinstance(timeout, (int, float)) or timeout < 0:
            raise ConfigurationError(f"timeout must be a number of seconds >= 0; got {timeout!r}")
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
        drained = self.drain(timeout)
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.5, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("operator channel thread still busy after close",
                            extra={"chat_id": self._chat_id, "thread_name": thread.name})
        with self._cond:
            return drained and self._idle_locked() and self._dropped == 0 and self._failed == 0

    def __enter__(self) -> OperatorChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_locked(self) -> None:
        thread = threading.Thread(target=self._run, name="fence-operator", daemon=True)
        thread.start()  # a RuntimeError (no threads left) leaves _thread None: the next post() tries again
        self._thread = thread

    def _next_locked(self) -> tuple[str, int] | None:
        """``(text, 0)`` for the oldest message, or ``(drop report, count)``: at most one report per ``capacity``
        messages sent, so a steady overload is reported without doubling the traffic."""
        if self._unreported and (self._sent_since_report >= self._capacity or not self._queue):
            count = self._unreported
            self._unreported = 0
            self._sent_since_report = 0
            noun = "message" if count == 1 else "messages"
            return f"{count} operator {noun} dropped (queue full)", count
        if self._queue:
            self._sent_since_report += 1
            return self._queue.popleft(), 0
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop.is_set() or not self._idle_locked())
                picked = None if self._stop.is_set() else self._next_locked()
                if picked is None:
                    return
                self._in_flight = True
            text, report_count = picked
            outcome = "failed"
            try:
                if report_count:
                    log.warning("operator messages dropped", extra={"chat_id": self._chat_id, "dropped": report_count})
                outcome = self._deliver(text)
            except Exception as exc:  # a bug here must not end the thread
                log.error("operator channel send crashed",
                          extra={"chat_id": self._chat_id, "error": f"{type(exc).__name__}: {exc}"})
            with self._cond:
                self._in_flight = False
                if outcome == "sent":
                    self._delivered += 1
                elif outcome == "failed":
                    self._failed += 1
                elif report_count:  # abandoned by close(): kept visible as pending
                    self._unreported += report_count
                else:
                    self._queue.appendleft(text)
                self._cond.notify_all()

    def _deliver(self, text: str) -> str:
        """Send one message (maybe in pieces); return "sent", "failed" or "abandoned"."""
        masked = escape_lone_surrogates(mask_tokens(text, self._secrets))  # a lone surrogate cannot be sent
        for piece in split_text(masked) if masked.strip() else [_EMPTY]:
            outcome = self._send_piece(piece) if piece.strip() else "sent"
            if outcome != "sent":
                return outcome
        return "sent"

    def _send_piece(self, piece: str) -> str:
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            try:
                call("sendMessage", self._bot.send_message, self._chat_id, piece, **self._send_kwargs)
                return "sent"
            except RetryAfter as err:
                attempt -= 1  # Telegram's wait is not a failed attempt
                wait = retry_after_wait(err.seconds)  # capped: an absurd value must not park the channel
                log.info("operator channel waiting for retry_after",
                         extra={"chat_id": self._chat_id, "retry_after": err.seconds, "wait": wait})
                if self._stop.wait(wait):
                    return "abandoned"
            except TelegramError as err:
                # The classified error's text is token-masked; its __cause__ (the raw exception) is not logged.
                fields = {"chat_id": self._chat_id, "attempt": attempt, "error": f"{type(err).__name__}: {err}"}
                if not isinstance(err, (Transient, Ambiguous)):
                    refused = isinstance(err, (MessageRefused, RecipientGone))
                    log.log(logging.WARNING if refused else logging.ERROR,
                            "operator message refused" if refused else "operator message failed", extra=fields)
                    return "failed"
                if attempt >= self._max_attempts:
                    log.error("operator message given up after %d attempts (%s)", attempt, fields["error"],
                              extra=fields)
                    return "failed"
                log.info("operator message send failed (%s), will retry", fields["error"], extra=fields)
                if self._stop.wait(exponential(attempt, self._backoff, self._max_backoff)):
                    return "abandoned"
        return "abandoned"
