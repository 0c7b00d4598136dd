"""What a Telegram error means for a broadcast recipient and run (:func:`decide`), and the :class:`Pacer`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import (
    Ambiguous,
    ConfigurationError,
    Conflict,
    Fatal,
    MessageRefused,
    RecipientGone,
    RetryAfter,
    TelegramError,
    Transient,
    Unauthorized,
)
from ..retry import exponential, retry_after_wait
from ..telegram import is_certificate_failure

__all__ = ["Decision", "Pacer", "RetryPolicy", "decide", "gone_reason"]


@dataclass(frozen=True)
class RetryPolicy:
    """How long a run keeps trying one recipient before it halts.

    ``transient_attempts``: sends that ended in a :class:`Transient` error before the run halts
    (waiting :func:`backoff` between them). ``rate_limited_attempts``: 429 answers for the same
    recipient before the run halts. ``ambiguous_in_a_row``: uncertain outcomes in a row (with no
    answer from Telegram between them) before the run halts instead of spending more recipients.
    """

    transient_attempts: int = 5
    rate_limited_attempts: int = 20
    ambiguous_in_a_row: int = 5
    backoff_base: float = 0.5
    backoff_cap: float = 30.0

    def __post_init__(self) -> None:
        for key in ("transient_attempts", "rate_limited_attempts", "ambiguous_in_a_row"):
            if getattr(self, key) < 1:
                raise ConfigurationError(f"RetryPolicy.{key} must be at least 1")
        if not (self.backoff_base >= 0 and self.backoff_cap >= self.backoff_base):
            raise ConfigurationError("RetryPolicy needs 0 <= backoff_base <= backoff_cap")


@dataclass(frozen=True)
class Decision:
    """What a run does after a failed send.

    ``outcome`` is the journal event that ends the intent (``failed``, ``uncertain`` or ``not_sent``)
    with ``reason``. If ``wait`` is not ``None`` the same recipient is tried again after ``wait``
    seconds. If ``halt`` is not ``None`` the run stops with that reason; ``final`` halts end the broadcast.
    """

    outcome: str
    reason: str
    wait: float | None = None
    halt: str | None = None
    final: bool = False


_GONE_REASONS = (
    ("blocked", "blocked"),
    ("deactivated", "deactivated"),
    ("chat not found", "chat_not_found"),
    ("user not found", "chat_not_found"),
    ("peer_id_invalid", "chat_not_found"),
    ("kicked", "kicked"),
    ("upgraded", "migrated"),
)


def gone_reason(error: TelegramError) -> str:
    """A short, stable reason for a :class:`RecipientGone` error: blocked, deactivated, chat_not_found, …"""
    text = error.description.lower()
    for marker, reason in _GONE_REASONS:
        if marker in text:
            return reason
    return "forbidden" if error.error_code == 403 else "gone"


def decide(
    error: TelegramError,
    *,
    transient_failures: int = 0,
    rate_limited: int = 0,
    ambiguous_in_a_row: int = 0,
    policy: RetryPolicy = RetryPolicy(),
) -> Decision:
    """Return what to do after the send to one recipient raised ``error``; never raises.

    The counters are those *before* this error: ``transient_failures`` and ``rate_limited`` for the current
    recipient, ``ambiguous_in_a_row`` for the run. The rules are listed in docs/broadcast.md.
    """
    detail = str(error)[:300]
    if isinstance(error, RetryAfter):
        if rate_limited + 1 >= policy.rate_limited_attempts:
            return Decision("not_sent", "retry_after", halt=f"rate limited {rate_limited + 1} times in a row: {detail}")
        return Decision("not_sent", "retry_after", wait=retry_after_wait(error.seconds))
    if isinstance(error, Transient):
        if transient_failures + 1 >= policy.transient_attempts:
            return Decision(
                "not_sent", "transient", halt=f"{transient_failures + 1} transient errors in a row: {detail}"
            )
        return Decision(
            "not_sent", "transient", wait=exponential(transient_failures + 1, policy.backoff_base, policy.backoff_cap)
        )
    if isinstance(error, Ambiguous):
        if ambiguous_in_a_row + 1 >= policy.ambiguous_in_a_row:
            return Decision(
                "uncertain", "ambiguous", halt=f"{ambiguous_in_a_row + 1} uncertain sends in a row: {detail}"
            )
        return Decision("uncertain", "ambiguous")
    if isinstance(error, RecipientGone):
        return Decision("failed", gone_reason(error))
    if isinstance(error, MessageRefused):
        return Decision("not_sent", "message_refused", halt=f"message refused: {detail}", final=True)
    if isinstance(error, (Unauthorized, Conflict)):
        name = "unauthorized" if isinstance(error, Unauthorized) else "conflict"
        return Decision("not_sent", name, halt=f"{name}: {detail}")
    if isinstance(error, Fatal) and (error.error_code is not None or is_certificate_failure(error)):
        # An answer from Telegram, or a TLS handshake that failed before anything was sent.
        return Decision("not_sent", "fatal", halt=f"fatal: {detail}")
    return Decision("uncertain", "fatal", halt=f"fatal (unknown whether sent): {detail}")


class Pacer:
    """Spaces sends: at most ``rate`` per second overall and one per ``per_chat`` seconds to each chat.

    Time is whatever the caller passes (any monotonic clock), so the pacer is a pure function of the
    calls made to it. Sends are spaced by at least ``1/rate`` from the previous one (no bursts, no
    catching up after a slow send), so no window of sends is ever faster than ``rate``.
    Not thread-safe.
    """

    def __init__(self, rate: float, per_chat: float = 1.0) -> None:
        """Raise :class:`ConfigurationError` unless ``rate`` > 0 (``math.inf``: no global limit)."""
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or math.isnan(rate) or rate <= 0:
            raise ConfigurationError(f"rate must be a number of messages per second above 0, not {rate!r}")
        if isinstance(per_chat, bool) or not isinstance(per_chat, (int, float)) or not per_chat >= 0:
            raise ConfigurationError(f"per_chat must be a number of seconds >= 0, not {per_chat!r}")
        self.rate = float(rate)
        self.interval = 0.0 if math.isinf(rate) else 1.0 / rate
        self.per_chat = float(per_chat)
        self._next = -math.inf
        self._chat_next: dict[int | str, float] = {}

    def delay(self, chat: int | str, now: float) -> float:
        """Seconds from ``now`` until a send to ``chat`` is allowed (0.0: now)."""
        allowed = max(self._next, self._chat_next.get(chat, -math.inf))
        return max(0.0, allowed - now)

    def sent(self, chat: int | str, now: float) -> None:
        """Record that a send to ``chat`` started at ``now``."""
        self._next = max(self._next, now + self.interval)
        if self.per_chat > 0:
            chats = self._chat_next
            chats[chat] = now + self.per_chat
            if len(chats) > 4096:
                for key in [key for key, until in chats.items() if until <= now]:
                    del chats[key]

    def hold(self, until: float) -> None:
        """Allow no send to anyone before ``until`` (Telegram's ``retry_after``, a backoff)."""
        self._next = max(self._next, until)
