"""Scripted faults of the fake Bot API (errors, drops, delays, non-JSON answers, latency, a rate limiter) and
:class:`FaultControls`, what tests use to script them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from ...errors import ConfigurationError
from .answers import ApiError, reason

__all__ = ["FaultControls", "FaultScript"]


@dataclass
class Fault:
    """One scripted fault, consumed ``times`` times (None: forever)."""

    kind: str  # "fail" | "drop" | "delay" | "malformed"
    times: int | None
    status: int = 0
    description: str = ""
    retry_after: int | None = None
    seconds: float = 0.0
    body: bytes = b""
    html: bool = False
    executed: bool = False


def check_method_name(method: str) -> str:
    """The lower-case key of a Bot API method name; raises ``ConfigurationError`` for a non-name."""
    if not method or not isinstance(method, str):
        raise ConfigurationError(f"method must be a Bot API method name like 'sendMessage', got {method!r}")
    return method.lower()


class FaultScript:
    """The queued faults, latencies and rate limits, keyed by lower-case method name. Thread-safe: every method
    takes ``cond`` (the fake's one re-entrant condition).
    """

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.latency: dict[str, float] = {}
        self.faults: dict[str, deque[Fault]] = {}
        self.rate_global: float | None = None
        self.rate_chat: float | None = None
        self.rate_retry_after = 1
        self._rate_all: deque[float] = deque()
        self._rate_by_chat: dict[int, deque[float]] = {}

    def latency_of(self, key: str) -> float:
        """Seconds to wait before answering ``key`` (0 for none)."""
        with self.cond:
            return self.latency.get(key, 0.0)

    def add(self, method: str, fault: Fault) -> None:
        """Queue ``fault`` for ``method`` (``"*"``: any method without a fault of its own)."""
        key = "*" if method == "*" else check_method_name(method)
        if fault.times is not None and fault.times < 1:
            raise ConfigurationError(f"times must be >= 1 or None (forever), got {fault.times!r}")
        with self.cond:
            self.faults.setdefault(key, deque()).append(fault)

    def take(self, key: str) -> Fault | None:
        """The fault that applies to this call of ``key`` (counting it down), or None."""
        with self.cond:
            for name in (key, "*"):
                queue = self.faults.get(name)
                if not queue:
                    continue
                fault = queue[0]
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        queue.popleft()
                return fault
            return None

    def set_rates(self, global_per_s: float | None, per_chat_per_s: float | None, retry_after: int) -> None:
        """Replace the rate limits and forget the sends counted so far."""
        with self.cond:
            self.rate_global = global_per_s
            self.rate_chat = per_chat_per_s
            self.rate_retry_after = int(retry_after)
            self._rate_all.clear()
            self._rate_by_chat.clear()

    def check_rate(self, chat_id: int) -> None:
        """Count a send to ``chat_id``, or raise the 429 if it is over a rate (then not counted)."""
        with self.cond:
            if self.rate_global is None and self.rate_chat is None:
                return
            now = time.monotonic()
            horizon = now - 1.0
            window = self._rate_all
            while window and window[0] <= horizon:
                window.popleft()
            chat_window = self._rate_by_chat.setdefault(chat_id, deque())
            while chat_window and chat_window[0] <= horizon:
                chat_window.popleft()
            over = (self.rate_global is not None and len(window) >= self.rate_global) or (
                self.rate_chat is not None and len(chat_window) >= self.rate_chat
            )
            if over:
                seconds = self.rate_retry_after
                raise ApiError(429, f"Too Many Requests: retry after {seconds}", retry_after=seconds)
            window.append(now)
            chat_window.append(now)


class FaultControls:
    """The fault-scripting methods of ``FakeBotAPI`` (a base class of it); state in ``self._faults``."""

    _faults: FaultScript

    def set_latency(self, method: str, seconds: float) -> None:
        """Answer every ``method`` call ``seconds`` later (0 removes the latency)."""
        key = check_method_name(method)
        if seconds < 0:
            raise ConfigurationError(f"latency for {method} must be >= 0 seconds, got {seconds!r}")
        with self._faults.cond:
            if seconds:
                self._faults.latency[key] = float(seconds)
            else:
                self._faults.latency.pop(key, None)

    def fail(
        self,
        method: str,
        status: int,
        description: str | None = None,
        retry_after: int | None = None,
        times: int | None = 1,
        *,
        html: bool = False,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` with ``status`` (``times=None``: forever).

        The answer is Telegram's JSON error (``description`` defaults to the standard reason);
        ``retry_after`` adds ``parameters.retry_after`` and a ``Retry-After`` header. ``html=True``
        answers a non-JSON HTML page with that status instead, like a proxy in front of Telegram.
        ``method="*"`` matches any method without a fault of its own.
        """
        if not 100 <= status <= 599:
            raise ConfigurationError(f"status must be an HTTP status 100..599, got {status!r}")
        if description is None and status == 429:
            description = f"Too Many Requests: retry after {1 if retry_after is None else retry_after}"
        description = reason(status) if description is None else description
        self._faults.add(method, Fault("fail", times, status=status, description=description,
                                       retry_after=retry_after, html=html))

    def drop(self, method: str, times: int | None = 1, *, executed: bool = False) -> None:
        """Close the connection of the next ``times`` calls of ``method`` without an answer.

        The request was fully received; with ``executed=True`` the server also carried it out
        (e.g. the message was sent) before hanging up, which is what makes a drop ambiguous.
        """
        self._faults.add(method, Fault("drop", times, executed=executed))

    def delay(self, method: str, seconds: float, times: int | None = 1) -> None:
        """Answer the next ``times`` calls of ``method`` after ``seconds`` (then normally)."""
        if seconds < 0:
            raise ConfigurationError(f"delay must be >= 0 seconds, got {seconds!r}")
        self._faults.add(method, Fault("delay", times, seconds=float(seconds)))

    def malformed(self, method: str, times: int | None = 1, *, body: bytes | None = None) -> None:
        """Answer the next ``times`` calls of ``method`` with HTTP 200 and a body that is not the API's JSON.

        ``body`` defaults to an HTML page; pass e.g. ``b'{"result": true}'`` for JSON without ``ok``.
        The call is not carried out.
        """
        page = body if body is not None else b"<html>upstream</html>"
        self._faults.add(method, Fault("malformed", times, body=page))

    def clear_faults(self) -> None:
        """Remove every scripted fault and the rate limiter (latencies stay)."""
        with self._faults.cond:
            self._faults.faults.clear()
            self._faults.set_rates(None, None, self._faults.rate_retry_after)

    def rate_limit(
        self,
        global_per_s: float | None = None,
        per_chat_per_s: float | None = None,
        retry_after: int = 1,
    ) -> None:
        """Answer ``429`` (with ``retry_after``) to send methods over these rates; both None turns it off.

        Rates are counted over a sliding one-second window of accepted sends; a call answered 429
        does not count.
        """
        for name, value in (("global_per_s", global_per_s), ("per_chat_per_s", per_chat_per_s)):
            if value is not None and value <= 0:
                raise ConfigurationError(f"{name} must be > 0 or None, got {value!r}")
        if retry_after < 0:
            raise ConfigurationError(f"retry_after must be >= 0, got {retry_after!r}")
        self._faults.set_rates(global_per_s, per_chat_per_s, retry_after)
