"""Scripted faults of the fake Bot API: errors, drops, delays, non-JSON answers, latency, a rate limiter."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from ...errors import ConfigurationError
from .answers import ApiError

__all__ = ["Fault", "FaultScript", "check_method_name"]


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


