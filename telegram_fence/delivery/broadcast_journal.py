"""The broadcast journal and the pure decisions a broadcast run makes.

Nothing here sends a message. This module holds:

- input checks: :func:`validate_name`, :func:`normalize_audience`, :func:`normalize_send_options`;
- the journal: :func:`replay` (bytes -> :class:`JournalState`), :class:`JournalState.apply` (one event),
  :class:`JournalWriter` (append + ``fdatasync``, torn-tail repair);
- the decisions: :func:`decide` (a classified Telegram error -> what to record, whether to wait and retry,
  whether to halt), :func:`backoff`, :func:`gone_reason`;
- the pacer: :class:`Pacer`, a function of the time it is given.

The journal is JSON lines, one event per line, appended and made durable one at a time:

=============  =========================================================================
``run``        a run started (clears a halt that was not final); ``pid``
``intent``     a send to recipient ``i`` (``chat``) is about to start
``sent``       the intent ended: Telegram accepted the message (``msg`` = message id)
``failed``     the intent ended: the recipient is gone (``reason``: blocked, deactivated, ...)
``uncertain``  the intent ended without knowing: the request may have been executed
``not_sent``   the intent ended: Telegram proved nothing was sent; the recipient is pending again
               (after a 429, ``wait`` is its ``retry_after``, at most 600 s: a later run waits it out too)
``halt``       the run stopped for ``reason``; ``final`` halts can never be resumed
=============  =========================================================================

Every line also has ``t`` (epoch milliseconds). A recipient's life is ``pending -> intent -> outcome``;
an intent without an outcome when a run starts is recorded ``uncertain`` and never sent again.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    Ambiguous,
    BroadcastError,
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

__all__ = [
    "BroadcastReport",
    "Decision",
    "JournalState",
    "JournalWriter",
    "Pacer",
    "RetryPolicy",
    "backoff",
    "decide",
    "gone_reason",
    "normalize_audience",
    "normalize_send_options",
    "replay",
    "validate_name",
]

#: Recipient states, one byte each in :attr:`JournalState.states`.
PENDING, IN_FLIGHT, SENT, FAILED, UNCERTAIN = 0, 1, 2, 3, 4

OUTCOMES = ("sent", "failed", "uncertain", "not_sent")
EVENTS = frozenset(("run", "intent", "halt", *OUTCOMES))

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_USERNAME = re.compile(r"@[A-Za-z][A-Za-z0-9_]{3,31}")
_DECIMAL = re.compile(r"-?[0-9]{1,19}")
# Telegram chat ids fit in 52 bits (documented for the Bot API); a larger number is a typo.
_MAX_CHAT_ID = 2**53 - 1
_DETAIL_LIMIT = 300


# ---------------------------------------------------------------------------------------------- input


def validate_name(name: object) -> str:
    """Return ``name`` if it can name a broadcast directory; raise :class:`ConfigurationError` otherwise.

    A name is 1-100 characters of letters, digits, ``_``, ``.`` and ``-``, starting with a letter or
    digit: no path separators, no ``..``, nothing a shell or a file system treats specially.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ConfigurationError(
            f"broadcast name {name!r} is not allowed: use 1-100 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit (no path separators, no '..')"
        )
    return name


def _chat_id(entry: object, position: int) -> int | str:
    if isinstance(entry, bool):
        raise ConfigurationError(f"audience entry #{position} ({entry!r}) is a bool, not a chat id")
    if isinstance(entry, int):
        value = entry
    elif isinstance(entry, str) and _USERNAME.fullmatch(entry.strip()):
        return entry.strip()
    elif isinstance(entry, str) and _DECIMAL.fullmatch(entry.strip()):
        value = int(entry.strip())
    else:
        raise ConfigurationError(
            f"audience entry #{position} ({entry!r}) is not a chat id: pass an integer or an "
            "'@channelusername' (5-32 letters, digits or '_', starting with a letter)"
        )
    if value == 0 or abs(value) > _MAX_CHAT_ID:
        raise ConfigurationError(f"audience entry #{position} ({entry!r}) is not a valid chat id")
    return value


def normalize_audience(entries: Iterable[object]) -> list[int | str]:
    """Return the chat ids of ``entries`` in their first-seen order, each once.

    An entry is an ``int`` chat id, a decimal string of one (converted to ``int``), or an
    ``@username`` (compared case-insensitively, first spelling kept). Raises :class:`ConfigurationError`
    naming the first entry (1-based position and value) that is none of these, or when nothing is left.
    """
    if isinstance(entries, (str, bytes)):
        raise ConfigurationError("audience must be a list of chat ids, not a single string")
    seen: set[int | str] = set()
    result: list[int | str] = []
    for position, entry in enumerate(entries, start=1):
        chat = _chat_id(entry, position)
        key = chat.lower() if isinstance(chat, str) else chat
        if key not in seen:
            seen.add(key)
            result.append(chat)
    if not result:
        raise ConfigurationError("audience is empty: a broadcast needs at least one chat id")
    return result


_SCALAR_OPTIONS: dict[str, tuple[type, ...]] = {
    "parse_mode": (str,),
    "disable_notification": (bool,),
    "protect_content": (bool,),
    "disable_web_page_preview": (bool,),
    "message_effect_id": (str,),
    "allow_paid_broadcast": (bool,),
    "timeout": (int, float),
}
_JSON_OPTIONS = ("reply_markup", "link_preview_options")
SUPPORTED_OPTIONS = tuple(sorted((*_SCALAR_OPTIONS, *_JSON_OPTIONS)))


def normalize_send_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``options`` as plain JSON values that can be stored and handed to ``send_message`` later.

    Scalar options keep their value; ``reply_markup`` and ``link_preview_options`` accept a ``dict`` or a
    telebot object with ``to_json()`` and are stored as parsed JSON. Raises :class:`ConfigurationError`
    naming an unsupported option or a value of the wrong type. Per-chat options (``reply_to_message_id``,
    ``message_thread_id``, …) make no sense for a list of chats and are refused.
    """
    result: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key in _SCALAR_OPTIONS:
            types_ = _SCALAR_OPTIONS[key]
            if not isinstance(value, types_) or (bool not in types_ and isinstance(value, bool)):
                raise ConfigurationError(
                    f"send option {key}={value!r} must be {' or '.join(t.__name__ for t in types_)}"
                )
            result[key] = value
        elif key in _JSON_OPTIONS:
            if hasattr(value, "to_json"):
                value = json.loads(value.to_json())
            if not isinstance(value, dict):
                raise ConfigurationError(f"send option {key} must be a dict or a telebot object, not {value!r}")
            try:
                json.dumps(value)
                if key == "link_preview_options":
                    _link_preview(value)
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"send option {key} cannot be used: {exc}") from exc
            result[key] = value
        else:
            raise ConfigurationError(
                f"send option {key!r} is not supported for a broadcast; supported: {', '.join(SUPPORTED_OPTIONS)}"
            )
    return result


def send_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """Return stored ``options`` as keyword arguments for ``TeleBot.send_message``."""
    kwargs = dict(options)
    if "reply_markup" in kwargs:  # telebot passes a str through as is
        kwargs["reply_markup"] = json.dumps(kwargs["reply_markup"], separators=(",", ":"))
    if "link_preview_options" in kwargs:  # telebot reads its attributes
        kwargs["link_preview_options"] = _link_preview(kwargs["link_preview_options"])
    return kwargs


def _link_preview(value: Mapping[str, Any]) -> Any:
    from telebot import types

    return types.LinkPreviewOptions(**value)


# --------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class BroadcastReport:
    """Where a broadcast stands.

    ``total = sent + failed_total + uncertain + pending + in_flight``. ``failed`` counts recipients
    that are gone by reason (``blocked``, ``deactivated``, ``chat_not_found``, ``kicked``, ``forbidden``,
    ``gone``). ``in_flight`` is a send that started and has no outcome yet: a live run will settle it;
    without one, the next run records it as ``uncertain``. ``halted`` is the reason the last run stopped
    early, or ``None``; ``halt_final`` says that no run can go on (the message itself was refused).
    """

    name: str
    total: int
    sent: int
    failed: Mapping[str, int]
    uncertain: int
    pending: int
    in_flight: int = 0
    halted: str | None = None
    halt_final: bool = False

    @property
    def failed_total(self) -> int:
        """Recipients charged as failed, all reasons together."""
        return sum(self.failed.values())

    @property
    def decided(self) -> int:
        """Recipients that will never be sent to again (sent, failed or uncertain)."""
        return self.sent + self.failed_total + self.uncertain

    @property
    def done(self) -> bool:
        """True when every recipient is decided."""
        return self.decided == self.total

    def summary(self) -> str:
        """One line for people: counts, failures by reason, and the halt if any."""
        failed = ", ".join(f"{reason} {count}" for reason, count in sorted(self.failed.items()))
        text = (
            f"{self.name}: {self.decided}/{self.total} decided - sent {self.sent}, "
            f"failed {self.failed_total}{f' ({failed})' if failed else ''}, uncertain {self.uncertain}, "
            f"pending {self.pending}"
        )
        if self.in_flight:
            text += f", in flight {self.in_flight}"
        if self.halted:
            text += f" - HALTED{' for good' if self.halt_final else ''}: {self.halted}"
        return text


# -------------------------------------------------------------------------------------------- journal


@dataclass
class Halt:
    """Why a run stopped early; ``final`` halts end the broadcast."""

    reason: str
    final: bool


@dataclass
class JournalState:
    """The state a journal describes: one byte per recipient, counters, the halt.

    Built by :func:`replay` and kept current by :meth:`apply`. Not thread-safe.
    """

    audience: list[int | str]
    states: bytearray = field(init=False)
    sent: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    uncertain: int = 0
    in_flight: int = 0
    halt: Halt | None = None
    lines: int = 0
    valid_length: int = 0
    torn_bytes: int = 0
    #: Epoch seconds before which Telegram asked for no send (a 429's ``retry_after``, kept across runs).
    not_before: float = 0.0

    def __post_init__(self) -> None:
        self.states = bytearray(len(self.audience))

    @property
    def pending(self) -> int:
        return len(self.audience) - self.sent - sum(self.failed.values()) - self.uncertain - self.in_flight

    def in_flight_indexes(self) -> list[int]:
        """Recipients with an intent and no outcome, in audience order."""
        return [i for i, s in enumerate(self.states) if s == IN_FLIGHT]

    def pending_indexes(self) -> Iterator[int]:
        """Recipients still to send, in audience order (read lazily: safe while events are applied)."""
        states = self.states
        for i in range(len(states)):
            if states[i] == PENDING:
                yield i

    def report(self, name: str, *, in_flight_as_uncertain: bool = False) -> BroadcastReport:
        """A :class:`BroadcastReport` of this state (optionally counting in-flight sends as uncertain)."""
        uncertain, in_flight = self.uncertain, self.in_flight
        if in_flight_as_uncertain:
            uncertain, in_flight = uncertain + in_flight, 0
        halt = self.halt
        return BroadcastReport(
            name=name,
            total=len(self.audience),
            sent=self.sent,
            failed=dict(self.failed),
            uncertain=uncertain,
            pending=self.pending,
            in_flight=in_flight,
            halted=halt.reason if halt else None,
            halt_final=bool(halt and halt.final),
        )

    def apply(self, event: Mapping[str, Any]) -> None:
        """Change the state by one journal event; raise :class:`BroadcastError` if it cannot follow.

        The transitions are the journal's rules: an intent only for a pending recipient, an outcome
        only for a recipient in flight, nothing after a final halt.
        """
        kind = event.get("ev")
        if kind not in EVENTS:
            raise BroadcastError(f"unknown journal event {kind!r}")
        if kind == "run":
            if self.halt is not None and self.halt.final:
                raise BroadcastError("a run was recorded after a final halt")
            self.halt = None
            return
        if kind == "halt":
            self.halt = Halt(str(event.get("reason", "")), bool(event.get("final", False)))
            return
        index = event.get("i")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.audience):
            raise BroadcastError(f"journal event {kind!r} names no recipient of the audience (i={index!r})")
        if "chat" in event and event["chat"] != self.audience[index]:
            raise BroadcastError(
                f"journal names chat {event['chat']!r} for recipient {index}, the audience has "
                f"{self.audience[index]!r}: the journal does not belong to this audience"
            )
        state = self.states[index]
        if kind == "intent":
            if state != PENDING:
                raise BroadcastError(f"intent for recipient {index}, which is not pending (state {state})")
            self.states[index] = IN_FLIGHT
            self.in_flight += 1
            return
        if state != IN_FLIGHT:
            raise BroadcastError(f"outcome {kind!r} for recipient {index}, which has no open intent")
        self.in_flight -= 1
        if kind == "sent":
            self.states[index] = SENT
            self.sent += 1
        elif kind == "failed":
            self.states[index] = FAILED
            self.failed[str(event.get("reason", "gone"))] += 1
        elif kind == "uncertain":
            self.states[index] = UNCERTAIN
            self.uncertain += 1
        else:  # not_sent
            self.states[index] = PENDING
            wait, at = event.get("wait"), event.get("t")
            if isinstance(wait, (int, float)) and isinstance(at, (int, float)) and math.isfinite(at):
                # Capped again: a journal written before the cap (or edited) may hold years or infinity.
                self.not_before = max(self.not_before, at / 1000.0 + retry_after_wait(wait))


def replay(data: bytes, audience: list[int | str]) -> JournalState:
    """Return the state the journal bytes ``data`` describe for ``audience``.

    A last line without its newline is a write torn by a crash: it is ignored, and
    :attr:`JournalState.valid_length` says where the complete lines end (a writer cuts the file there).
    Any complete line that is not a valid event, or an event that cannot follow the ones before it,
    raises :class:`BroadcastError` naming the line: the journal was damaged or edited, and sending on
    from it could send someone the message twice.
    """
    state = JournalState(audience)
    end = data.rfind(b"\n") + 1
    state.valid_length = end
    state.torn_bytes = len(data) - end
    lines = data[:end].split(b"\n")[:-1]
    state.lines = len(lines)
    events = _parse_all(data[:end], len(lines))
    if events is None:  # something does not parse: find and name the line
        events = [_parse_line(number, line) for number, line in enumerate(lines, start=1)]
    apply = state.apply
    for number, event in enumerate(events, start=1):
        if not isinstance(event, dict):
            raise BroadcastError(f"journal line {number} is not an event: {lines[number - 1][:80]!r}")
        try:
            apply(event)
        except BroadcastError as exc:
            raise BroadcastError(f"journal line {number}: {exc}") from None
    return state


def _parse_all(complete: bytes, count: int) -> list[Any] | None:
    """All lines in one parse (as a JSON array: several times faster); None if that does not work."""
    if not count:
        return []
    try:
        events = json.loads(b"[" + complete[:-1].replace(b"\n", b",") + b"]")
    except ValueError:
        return None
    return events if isinstance(events, list) and len(events) == count else None


def _parse_line(number: int, line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise BroadcastError(f"journal line {number} is not JSON: {line[:80]!r}") from exc


class JournalWriter:
    """Appends events to a journal file, each made durable (``fdatasync``) before ``append`` returns.

    Not thread-safe; one writer per journal at a time (the broadcast lock guarantees it).
    """

    def __init__(self, path: str | os.PathLike[str], valid_length: int) -> None:
        """Open ``path`` for appending and cut it to ``valid_length`` bytes (dropping a torn last line).

        Raises :class:`BroadcastError` if the file is missing or shorter than ``valid_length`` (it was
        changed behind the caller's back).
        """
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as exc:
            raise BroadcastError(f"journal {os.fspath(path)!r} is missing") from exc
        try:
            size = os.fstat(self._fd).st_size
            if size < valid_length:
                raise BroadcastError(f"journal {os.fspath(path)!r} shrank while being read")
            if size > valid_length:
                os.ftruncate(self._fd, valid_length)
                _datasync(self._fd)
        except BaseException:
            os.close(self._fd)
            raise
        self._dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

    def append(self, event: dict[str, Any]) -> None:
        """Write ``event`` as one line and wait until it is on disk; raises ``OSError`` if it cannot."""
        event["t"] = int(time.time() * 1000)
        data = (self._dumps(event) + "\n").encode()
        written = os.write(self._fd, data)
        if written != len(data):  # a regular file short-writes only when the disk is full
            raise OSError(f"journal write cut short ({written} of {len(data)} bytes)")
        _datasync(self._fd)

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _datasync(fd: int) -> None:
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


# ------------------------------------------------------------------------------------------ decisions


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


def backoff(attempt: int, base: float = 0.5, cap: float = 30.0) -> float:
    """Seconds to wait after the ``attempt``-th failure (1-based): ``base * 2**(attempt-1)``, at most ``cap``."""
    return exponential(attempt, base, cap)


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


def _detail(error: TelegramError) -> str:
    return str(error)[:_DETAIL_LIMIT]


def decide(
    error: TelegramError,
    *,
    transient_failures: int = 0,
    rate_limited: int = 0,
    ambiguous_in_a_row: int = 0,
    policy: RetryPolicy = RetryPolicy(),
) -> Decision:
    """Return what to do after the send to one recipient raised ``error``.

    The counters are those *before* this error: ``transient_failures`` and ``rate_limited`` for the
    current recipient, ``ambiguous_in_a_row`` for the run. Never raises.

    - 429: not sent; wait ``retry_after`` (as :func:`~telegram_fence.retry.retry_after_wait` caps it: at most
      600 s) and send again (halt after ``policy.rate_limited_attempts``).
    - transient (proves non-delivery): not sent; back off and send again, halting (not failing the
      recipient) once ``policy.transient_attempts`` are spent - an outage is not the recipient's fault.
    - ambiguous: uncertain, never sent again; halt after ``policy.ambiguous_in_a_row`` in a row.
    - recipient gone: failed with :func:`gone_reason`.
    - message refused: not sent, final halt - the message cannot change under the same name.
    - unauthorized, conflict, a fatal answer from Telegram, a certificate that failed verification:
      not sent, halt (a later run may go on).
    - a fatal error with no answer from Telegram (e.g. a bug below us): uncertain, halt.
    """
    detail = _detail(error)
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
            "not_sent", "transient", wait=backoff(transient_failures + 1, policy.backoff_base, policy.backoff_cap)
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


# ---------------------------------------------------------------------------------------------- pacer


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
