"""Scripted faults of the fake Bot API: errors, drops, delays, non-JSON answers, latency, a rate limiter."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from ...errors import ConfigurationError
from .answers import ApiError, reason

__all__ = ["Fault", "FaultControls", "FaultScript", "check_method_name"]


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
    """The queued faults, latencies and rate limits, keyed by lower-case method name; every method takes ``cond``."""

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.latency: dict[str, float] = {}
        self.faults: dict[str, deque[Fault]] = {}
        self.rates: tuple[float | None, float | None, int] = (None, None, 1)  # global, per chat, retry_after
        self.sends: list[tuple[float, int]] = []  # (time.monotonic(), chat id) of the sends in the last second

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
                if queue:
                    fault = queue[0]
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            queue.popleft()
                    return fault
            return None

    def check_rate(self, chat_id: int) -> None:
        """Count a send to ``chat_id``, or raise the 429 if it is over a rate (then not counted)."""
        with self.cond:
            global_rate, chat_rate, retry_after = self.rates
            if global_rate is None and chat_rate is None:
                return
            now = time.monotonic()
            self.sends = sends = [send for send in self.sends if send[0] > now - 1.0]
            over_all = global_rate is not None and len(sends) >= global_rate
            if over_all or (chat_rate is not None and sum(chat == chat_id for _, chat in sends) >= chat_rate):
                raise ApiError(429, f"Too Many Requests: retry after {retry_after}", retry_after=retry_after)
            sends.append((now, chat_id))


class FaultControls:
    """The methods of ``FakeBotAPI`` that script faults, latencies and the rate limiter in its ``_faults``."""

    _faults: FaultScript

    def set_latency(self, method: str, seconds: float) -> None:
        """Answer every ``method`` call ``seconds`` later (0 removes the latency)."""
        key = check_method_name(method)
        if seconds < 0:
            raise ConfigurationError(f"latency for {method} must be >= 0 seconds, got {seconds!r}")
        with self._faults.cond:
            self._faults.latency[key] = float(seconds)

    def fail(self, method: str, status: int, description: str | None = None, retry_after: int | None = None,
             times: int | None = 1, *, html: bool = False) -> None:
        """Answer the next ``times`` calls of ``method`` (``"*"``: any without a fault of its own; ``times=None``:
        forever) with Telegram's JSON error ``status`` (``description`` defaults to the standard reason);
        ``retry_after`` adds ``parameters.retry_after`` and a ``Retry-After`` header. ``html=True`` answers an HTML
        page with that status instead, like a proxy in front of Telegram.
        """
        if not 100 <= status <= 599:
            raise ConfigurationError(f"status must be an HTTP status 100..599, got {status!r}")
        if description is None and status == 429:
            description = f"Too Many Requests: retry after {1 if retry_after is None else retry_after}"
        description = reason(status) if description is None else description
        self._faults.add(method, Fault("fail", times, status=status, description=description,
                                       retry_after=retry_after, html=html))

    def drop(self, method: str, times: int | None = 1, *, executed: bool = False) -> None:
        """Close the connection of the next ``times`` calls of ``method`` without an answer, the request fully
        received; ``executed=True`` carries it out first (e.g. the message was sent): the ambiguous case.
        """
        self._faults.add(method, Fault("drop", times, executed=executed))

    def delay(self, method: str, seconds: float, times: int | None = 1) -> None:
        """Answer the next ``times`` calls of ``method`` after ``seconds`` (then normally)."""
        if seconds < 0:
            raise ConfigurationError(f"delay must be >= 0 seconds, got {seconds!r}")
        self._faults.add(method, Fault("delay", times, seconds=float(seconds)))

    def malformed(self, method: str, times: int | None = 1, *, body: bytes | None = None) -> None:
        """Answer the next ``times`` calls of ``method``, not carried out, with HTTP 200 and ``body``, which is not
        the API's JSON (default an HTML page; ``b'{"result": true}'`` is JSON without ``ok``).
        """
        self._faults.add(method, Fault("malformed", times, body=b"<html>upstream</html>" if body is None else body))

    def clear_faults(self) -> None:
        """Remove every scripted fault and the rate limiter (latencies stay)."""
        with self._faults.cond:
            self._faults.faults.clear()
            self._faults.rates = (None, None, 1)

    def rate_limit(self, global_per_s: float | None = None, per_chat_per_s: float | None = None,
                   retry_after: int = 1) -> None:
        """Answer ``429`` (with ``retry_after``) to sends over these rates, counted over a sliding second of
        accepted sends (a call answered 429 does not count); both None turns it off.
        """
        for name, value in (("global_per_s", global_per_s), ("per_chat_per_s", per_chat_per_s)):
            if value is not None and value <= 0:
                raise ConfigurationError(f"{name} must be > 0 or None, got {value!r}")
        if retry_after < 0:
            raise ConfigurationError(f"retry_after must be >= 0, got {retry_after!r}")
        with self._faults.cond:
            self._faults.rates = (global_per_s, per_chat_per_s, int(retry_after))
            self._faults.sends.clear()
