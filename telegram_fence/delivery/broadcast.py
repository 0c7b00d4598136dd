"""Broadcasts: one message to a list of chats that ends, resumes by name, and sends nobody the message twice.

A broadcast lives in ``<directory>/<name>/``: ``broadcast.json`` (audience, text, options; written once,
atomically), ``journal.jsonl`` and ``lock`` (``flock``-ed by the running process). The journal holds JSON lines,
each made durable before the next: ``run`` (clears a non-final halt), ``intent`` (a send to recipient ``i`` is about
to start), the outcomes ``sent``, ``failed``, ``uncertain`` and ``not_sent`` (pending again; ``wait`` is a 429's
``retry_after``), and ``halt`` (``final`` ones end the broadcast); every line has ``t`` (epoch ms). An intent without
an outcome when a run starts is recorded ``uncertain`` and never sent again. The rules a run keeps are in
docs/broadcast.md."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    Ambiguous,
    BroadcastConflict,
    BroadcastError,
    BroadcastLocked,
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
from ..telegram import call, is_certificate_failure
from .broadcast_journal import IN_FLIGHT, BroadcastReport, JournalState, JournalWriter, _fsync, _write_new_file, replay
from .broadcast_message import (
    TEXT_LIMIT,
    _send_kwargs,
    check_encodable,
    check_length,
    normalize_audience,
    normalize_send_options,
    utf16_length,
    validate_name,
    visible_text,
)

__all__ = ["TEXT_LIMIT", "Broadcast", "BroadcastReport", "utf16_length", "visible_text"]

SPEC_FILE = "broadcast.json"
JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = "lock"
_FORMAT = 1


# --------------------------------------------------------------------------------------------------- decisions


# How long a run keeps trying before it halts: transient failures and 429s for one recipient, uncertain outcomes in a
# row for the run; the backoff between transient failures.
TRANSIENT_ATTEMPTS = 5
RATE_LIMITED_ATTEMPTS = 20
AMBIGUOUS_IN_A_ROW = 5
BACKOFF_BASE, BACKOFF_CAP = 0.5, 30.0


@dataclass(frozen=True)
class Decision:
    """After a failed send: the journal ``outcome`` and ``reason``; retry after ``wait`` s; or ``halt`` (``final``)."""

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
    return next((reason for marker, reason in _GONE_REASONS if marker in text),
                "forbidden" if error.error_code == 403 else "gone")


def decide(error: TelegramError, *, transient_failures: int = 0, rate_limited: int = 0,
           ambiguous_in_a_row: int = 0) -> Decision:
    """What to do after the send to one recipient raised ``error`` (the counters are those before it; the rules are
    in docs/broadcast.md). Never raises."""
    detail = str(error)[:300]
    if isinstance(error, RetryAfter):
        if rate_limited + 1 >= RATE_LIMITED_ATTEMPTS:
            return Decision("not_sent", "retry_after", halt=f"rate limited {rate_limited + 1} times in a row: {detail}")
        return Decision("not_sent", "retry_after", wait=retry_after_wait(error.seconds))
    if isinstance(error, Transient):
        count = transient_failures + 1
        if count >= TRANSIENT_ATTEMPTS:
            return Decision("not_sent", "transient", halt=f"{count} transient errors in a row: {detail}")
        return Decision("not_sent", "transient", wait=exponential(count, BACKOFF_BASE, BACKOFF_CAP))
    if isinstance(error, Ambiguous):
        count = ambiguous_in_a_row + 1
        if count >= AMBIGUOUS_IN_A_ROW:
            return Decision("uncertain", "ambiguous", halt=f"{count} uncertain sends in a row: {detail}")
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


@dataclass(frozen=True)
class _Spec:
    audience: list[int | str]
    text: str
    options: dict[str, Any]


Progress = Callable[[BroadcastReport], object]


class Broadcast:
    """One message to a fixed list of chats, sent by a telebot bot at most once per chat. ``bot`` may be ``None`` for
    :meth:`create` and :meth:`status`; ``directory`` holds one sub-directory per broadcast ``name``. Not thread-safe,
    except :meth:`stop`. Only one process can :meth:`run` a broadcast at a time."""

    def __init__(self, bot: Any, directory: str | os.PathLike[str], name: str) -> None:
        """Raise :class:`ConfigurationError` if ``name`` is not a safe directory name."""
        self.name, self.bot = validate_name(name), bot
        self.directory = Path(directory)
        self.path = self.directory / name
        self._stop = threading.Event()

    def create(self, audience: Iterable[object], text: str, **send_options: Any) -> bool:
        """Write the audience and the message once; return True if this call wrote them (False: already written). Raises
        :class:`ConfigurationError` (nothing written) for a bad entry, option or text (empty, too long, a lone
        surrogate); :class:`BroadcastConflict` if the name exists with another audience, text or options; ``OSError`` if
        the files cannot be written."""
        if not isinstance(text, str) or not text.strip():
            raise ConfigurationError("broadcast text is empty: a broadcast needs a message to send")
        chats = normalize_audience(audience)
        options = normalize_send_options(send_options)
        check_length(text, options.get("parse_mode"))  # refused now, not halted mid-run with the name used up
        for key, value in options.items():
            check_encodable(json.dumps(value, ensure_ascii=False), f"send option {key!r} (as JSON)")
        if not self.exists():
            self.path.mkdir(parents=True, exist_ok=True)
            _fsync(self.directory)
            _fsync(self.path / JOURNAL_FILE, os.O_WRONLY | os.O_CREAT)
            _fsync(self.path)
            body = {"format": _FORMAT, "name": self.name, "text": text, "options": options, "audience": chats}
            if _write_new_file(self.path / SPEC_FILE, json.dumps(body, ensure_ascii=False).encode() + b"\n"):
                return True  # else another process created it meanwhile
        existing = self._read_spec()
        differs = [what for what, a, b in (("audience", existing.audience, chats), ("text", existing.text, text),
                                           ("send options", existing.options, options)) if a != b]
        if differs:
            raise BroadcastConflict(
                f"broadcast {self.name!r} already exists in {os.fspath(self.directory)!r} with another "
                f"{' and '.join(differs)}; a broadcast's message and audience never change - use a new name"
            )
        return False

    def exists(self) -> bool:
        """True once :meth:`create` has written this broadcast."""
        return (self.path / SPEC_FILE).is_file()

    def _read(self, file: str, missing: str) -> bytes:
        try:
            return (self.path / file).read_bytes()
        except FileNotFoundError:
            raise BroadcastError(missing) from None

    def _read_spec(self) -> _Spec:
        raw = self._read(SPEC_FILE, f"no broadcast named {self.name!r} in {os.fspath(self.directory)!r}: create it "
                         "first")
        try:
            body = json.loads(raw)
            if body.get("format") != _FORMAT:
                raise BroadcastError(f"broadcast {self.name!r} has format {body.get('format')!r}, not {_FORMAT}")
            return _Spec(list(body["audience"]), str(body["text"]), dict(body["options"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BroadcastError(f"{os.fspath(self.path / SPEC_FILE)!r} is damaged: {exc}") from exc

    def _read_journal(self, spec: _Spec) -> JournalState:
        data = self._read(JOURNAL_FILE, f"broadcast {self.name!r} has no journal ({JOURNAL_FILE}); without it nobody "
                          "can tell who already got the message, so it will not be sent")
        try:
            return replay(data, spec.audience)
        except BroadcastError as exc:
            raise BroadcastError(f"{os.fspath(self.path / JOURNAL_FILE)!r}: {exc}") from exc

    def status(self) -> BroadcastReport:
        """Where the broadcast stands (safe while another process runs it); :class:`BroadcastError` if missing or
        damaged."""
        return self._read_journal(self._read_spec()).report(self.name)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                raise BroadcastLocked(f"broadcast {self.name!r} is being run by another process (pid {holder}); "
                                      "wait for it to end or stop it") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the flock

    def stop(self) -> None:
        """Make the current (or else the next) :meth:`run` return after the send in progress, the rest pending. Safe
        from any thread and from a signal handler."""
        self._stop.set()

    def run(self, *, rate: float = 25.0, progress: Progress | None = None) -> BroadcastReport:
        """Send the message to every recipient not yet decided, resuming where earlier runs stopped. Returns the report
        when every recipient is decided, when the run halts (``report.halted``) or after :meth:`stop`. ``rate``:
        messages per second (``math.inf``: no limit), each send at least ``1/rate`` after the previous one (no burst
        after a pause). ``progress(report)`` runs after each outcome (what it raises ends the run). Raises
        :class:`BroadcastLocked`, :class:`BroadcastError`, :class:`ConfigurationError` (bad ``rate``, no bot),
        ``OSError`` if the journal cannot be written."""
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or math.isnan(rate) or rate <= 0:
            raise ConfigurationError(f"rate must be a number of messages per second above 0, not {rate!r}")
        if self.bot is None:
            raise ConfigurationError("Broadcast.run needs a bot: Broadcast(telebot.TeleBot(token), ...)")
        spec = self._read_spec()
        try:
            with self._locked():
                state = self._read_journal(spec)
                with contextlib.closing(JournalWriter(self.path / JOURNAL_FILE, state.valid_length)) as writer:
                    if state.halt_final:
                        return state.report(self.name)
                    for index in [i for i, s in enumerate(state.states) if s == IN_FLIGHT]:
                        writer.record(state, {"ev": "uncertain", "i": index, "reason": "interrupted"})
                    writer.record(state, {"ev": "run", "pid": os.getpid()})
                    owed = max(0.0, state.not_before - time.time())  # a 429 wait an earlier run did not finish
                    interval = 0.0 if math.isinf(rate) else 1.0 / rate
                    return self._send_all(spec, state, writer, interval, time.monotonic() + owed, progress)
        finally:
            self._stop.clear()

    def _send_all(self, spec: _Spec, state: JournalState, writer: JournalWriter, interval: float, next_send: float,
                  progress: Progress | None) -> BroadcastReport:
        """Send to the pending recipients, none before ``next_send`` (monotonic), each ``interval`` after the last."""
        kwargs = _send_kwargs(spec.options)
        clock, stop = time.monotonic, self._stop
        ambiguous_in_a_row = 0
        for index in state.pending_indexes():
            chat = spec.audience[index]
            transient = limited = 0
            while True:
                delay = next_send - clock()
                if stop.wait(delay) if delay > 0 else stop.is_set():
                    return state.report(self.name)
                writer.record(state, {"ev": "intent", "i": index, "chat": chat})
                next_send = max(next_send, clock() + interval)
                try:
                    message = call("sendMessage", self.bot.send_message, chat, spec.text, **kwargs)
                except TelegramError as error:
                    decision = decide(error, transient_failures=transient, rate_limited=limited,
                                      ambiguous_in_a_row=ambiguous_in_a_row)
                    outcome: dict[str, Any] = {
                        "ev": decision.outcome, "i": index, "reason": decision.reason, "detail": str(error)[:300]
                    }
                    if decision.wait is not None:
                        outcome["wait"] = decision.wait
                    writer.record(state, outcome)
                    ambiguous_in_a_row = ambiguous_in_a_row + 1 if decision.outcome == "uncertain" else 0
                    if decision.halt is not None:
                        writer.record(state, {"ev": "halt", "i": index, "reason": decision.halt,
                                              "final": decision.final})
                        break
                    if decision.wait is not None:
                        limited += isinstance(error, RetryAfter)
                        transient += not isinstance(error, RetryAfter)
                        next_send = max(next_send, clock() + decision.wait)
                        continue
                else:
                    ambiguous_in_a_row = 0
                    writer.record(state, {"ev": "sent", "i": index, "msg": getattr(message, "message_id", None)})
                break
            if progress is not None:
                progress(state.report(self.name))
            if state.halted is not None:
                break
        return state.report(self.name)
