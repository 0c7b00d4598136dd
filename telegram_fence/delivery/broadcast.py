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
import html
import json
import math
import os
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
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

__all__ = ["TEXT_LIMIT", "Broadcast", "BroadcastReport", "utf16_length", "visible_text"]

SPEC_FILE = "broadcast.json"
JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = "lock"
_FORMAT = 1
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

# -------------------------------------------------------------------------------------------- message length
# Telegram counts UTF-16 code units after entities parsing. visible_text removes at least the markup Telegram
# removes, so a text counted too long here is too long for Telegram too (not always the converse).

TEXT_LIMIT = 4096

_TAG = re.compile(r"<[^>]*>")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_FENCE_LANGUAGE = re.compile(r"```[^\s`]*\n")
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)
_MARKDOWN_MARKS = re.compile(r"[*_`\[\]]")
_MARKDOWN_V2_MARKS = re.compile(r"[*_~|`>\[\]]")


def utf16_length(text: str) -> int:
    """The length of ``text`` in UTF-16 code units, as Telegram counts it."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def check_encodable(text: str, what: str = "message text") -> None:
    """Raise :class:`ConfigurationError` naming the position (never the text) of a lone surrogate in ``text``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"the {what} holds a lone surrogate (U+{ord(text[exc.start]):04X}) at character "
                                 f"{exc.start}: it is not valid Unicode and cannot be sent to Telegram; fix the text "
                                 "(e.g. decode its source as UTF-8)") from None


def visible_text(text: str, parse_mode: str | None) -> str:
    """At most the text Telegram shows for ``text`` sent with ``parse_mode`` (see the module docstring)."""
    mode = (parse_mode or "").lower()
    if mode == "html":
        text = html.unescape(_TAG.sub("", text))
    elif mode in ("markdown", "markdownv2"):
        text = _FENCE_LANGUAGE.sub("", text)
        text = _LINK.sub(r"\1", text)
        marks = _MARKDOWN_V2_MARKS if mode == "markdownv2" else _MARKDOWN_MARKS
        # Escaped characters stay (without their backslash); every other markup character goes.
        pieces = _ESCAPED.split(text)
        text = "".join(piece if index % 2 else marks.sub("", piece) for index, piece in enumerate(pieces))
    return text.strip()


def check_length(text: str, parse_mode: str | None = None) -> int:
    """The counted length of ``text``; :class:`ConfigurationError` when it is over the limit or holds a lone
    surrogate."""
    check_encodable(text)
    length = utf16_length(visible_text(text, parse_mode))
    if length > TEXT_LIMIT:
        counted = "visible characters" if parse_mode else "characters"
        raise ConfigurationError(f"the message text is {length} {counted} long (UTF-16 code units, as Telegram counts"
                                 f"{', after ' + parse_mode + ' markup' if parse_mode else ''}); Telegram allows at "
                                 f"most {TEXT_LIMIT}: shorten it or split it into several messages")
    return length


# ------------------------------------------------------------------------------------------------------- input

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_USERNAME = re.compile(r"@[A-Za-z][A-Za-z0-9_]{3,31}")
_DECIMAL = re.compile(r"-?[0-9]{1,19}")
_MAX_CHAT_ID = 2**53 - 1  # Telegram chat ids fit in 52 bits: a larger number is a typo
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


def validate_name(name: object) -> str:
    """Return ``name`` if it is 1-100 letters, digits, ``_ . -`` (no ``..``); else raise :class:`ConfigurationError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ConfigurationError(f"broadcast name {name!r} is not allowed: use 1-100 letters, digits, '_', '.' or '-', "
                                 "starting with a letter or digit (no path separators, no '..')")
    return name


def _chat_id(entry: object, position: int) -> int | str:
    if isinstance(entry, bool):
        raise ConfigurationError(f"audience entry #{position} ({entry!r}) is a bool, not a chat id")
    text = entry.strip() if isinstance(entry, str) else None
    if isinstance(entry, int):
        value = entry
    elif text is not None and _USERNAME.fullmatch(text):
        return text
    elif text is not None and _DECIMAL.fullmatch(text):
        value = int(text)
    else:
        raise ConfigurationError(f"audience entry #{position} ({entry!r}) is not a chat id: pass an integer or an "
                                 "'@channelusername' (5-32 letters, digits or '_', starting with a letter)")
    if value == 0 or abs(value) > _MAX_CHAT_ID:
        raise ConfigurationError(f"audience entry #{position} ({entry!r}) is not a valid chat id")
    return value


def normalize_audience(entries: Iterable[object]) -> list[int | str]:
    """The chat ids of ``entries`` (ints, decimal strings, ``@usernames`` compared case-insensitively), each once.
    Raises :class:`ConfigurationError` naming the first entry (position and value) that is not a chat id, or when
    nothing is left."""
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


def normalize_send_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as plain JSON values for ``send_message`` (markup objects become dicts; ``None`` is dropped). Raises
    :class:`ConfigurationError` naming an unsupported option (per-chat ones included) or a wrong type."""
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
        else:
            raise ConfigurationError(
                f"send option {key!r} is not supported for a broadcast; supported: {', '.join(SUPPORTED_OPTIONS)}"
            )
        result[key] = value
    return result


def _send_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    kwargs = dict(options)
    if "reply_markup" in kwargs:  # telebot passes a str through as is
        kwargs["reply_markup"] = json.dumps(kwargs["reply_markup"], separators=(",", ":"))
    if "link_preview_options" in kwargs:  # telebot reads its attributes
        kwargs["link_preview_options"] = _link_preview(kwargs["link_preview_options"])
    return kwargs


def _link_preview(value: Mapping[str, Any]) -> Any:
    from telebot import types

    return types.LinkPreviewOptions(**value)


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


# ------------------------------------------------------------------------------------------------ the journal


#: Recipient states, one byte each in :attr:`JournalState.states`.
PENDING, IN_FLIGHT, SENT, FAILED, UNCERTAIN = 0, 1, 2, 3, 4

_OUTCOME_STATES = {"sent": SENT, "failed": FAILED, "uncertain": UNCERTAIN, "not_sent": PENDING}
EVENTS = frozenset(("run", "intent", "halt", *_OUTCOME_STATES))


@dataclass(frozen=True)
class BroadcastReport:
    """Where a broadcast stands: ``total = sent + failed_total + uncertain + pending + in_flight``. ``failed`` counts
    gone recipients by reason; ``in_flight`` sends have no outcome yet (the next run records them ``uncertain``);
    ``halted`` is why the last run stopped early; ``halt_final``: no run can go on."""

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
        return sum(self.failed.values())

    @property
    def decided(self) -> int:
        """Recipients never to be sent to again (sent, failed or uncertain)."""
        return self.sent + self.failed_total + self.uncertain

    @property
    def done(self) -> bool:
        return self.decided == self.total

    def summary(self) -> str:
        """One line for people."""
        failed = ", ".join(f"{reason} {count}" for reason, count in sorted(self.failed.items()))
        text = (f"{self.name}: {self.decided}/{self.total} decided - sent {self.sent}, failed {self.failed_total}"
                f"{f' ({failed})' if failed else ''}, uncertain {self.uncertain}, pending {self.pending}")
        if self.in_flight:
            text += f", in flight {self.in_flight}"
        if self.halted:
            text += f" - HALTED{' for good' if self.halt_final else ''}: {self.halted}"
        return text


@dataclass
class JournalState:
    """The state a journal describes, built by :func:`replay` and kept current by :meth:`apply`."""

    audience: list[int | str]
    states: bytearray = field(init=False)
    sent: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    uncertain: int = 0
    in_flight: int = 0
    halted: str | None = None  # why the last run stopped early
    halt_final: bool = False
    valid_length: int = 0
    #: Epoch seconds before which Telegram asked for no send (a 429's ``retry_after``, kept across runs).
    not_before: float = 0.0

    def __post_init__(self) -> None:
        self.states = bytearray(len(self.audience))

    @property
    def pending(self) -> int:
        return len(self.audience) - self.sent - sum(self.failed.values()) - self.uncertain - self.in_flight

    def in_flight_indexes(self) -> list[int]:
        return [i for i, s in enumerate(self.states) if s == IN_FLIGHT]

    def pending_indexes(self) -> Iterator[int]:
        """Recipients still to send, in audience order (lazily: safe while events are applied)."""
        states = self.states
        for i in range(len(states)):
            if states[i] == PENDING:
                yield i

    def report(self, name: str) -> BroadcastReport:
        return BroadcastReport(name, len(self.audience), self.sent, dict(self.failed), self.uncertain, self.pending,
                               self.in_flight, self.halted, self.halt_final)

    def apply(self, event: Mapping[str, Any]) -> None:
        """Change the state by one journal event; raise :class:`BroadcastError` if it cannot follow (an intent only
        for a pending recipient, an outcome only for one in flight, nothing after a final halt)."""
        kind = event.get("ev")
        if kind not in EVENTS:
            raise BroadcastError(f"unknown journal event {kind!r}")
        if kind == "run":
            if self.halt_final:
                raise BroadcastError("a run was recorded after a final halt")
            self.halted = None
            return
        if kind == "halt":
            self.halted, self.halt_final = str(event.get("reason", "")), bool(event.get("final", False))
            return
        index = event.get("i")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.audience):
            raise BroadcastError(f"journal event {kind!r} names no recipient of the audience (i={index!r})")
        if "chat" in event and event["chat"] != self.audience[index]:
            raise BroadcastError(f"journal names chat {event['chat']!r} for recipient {index}, the audience has "
                                 f"{self.audience[index]!r}: the journal does not belong to this audience")
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
        self.states[index] = _OUTCOME_STATES[kind]
        if kind == "sent":
            self.sent += 1
        elif kind == "failed":
            self.failed[str(event.get("reason", "gone"))] += 1
        elif kind == "uncertain":
            self.uncertain += 1
        else:  # not_sent
            wait, at = event.get("wait"), event.get("t")
            if isinstance(wait, (int, float)) and isinstance(at, (int, float)) and math.isfinite(at):
                # Capped again: a journal written before the cap (or edited) may hold years or infinity.
                self.not_before = max(self.not_before, at / 1000.0 + retry_after_wait(wait))


def replay(data: bytes, audience: list[int | str]) -> JournalState:
    """The state the journal bytes ``data`` describe for ``audience``. A last line without its newline (torn by a crash)
    is ignored: :attr:`JournalState.valid_length` ends before it. A complete line that is not an event that can follow
    the ones before raises :class:`BroadcastError` naming it."""
    state = JournalState(audience)
    end = data.rfind(b"\n") + 1
    state.valid_length = end
    for number, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise BroadcastError(f"journal line {number} is not JSON: {line[:80]!r}") from exc
        if not isinstance(event, dict):
            raise BroadcastError(f"journal line {number} is not an event: {line[:80]!r}")
        try:
            state.apply(event)
        except BroadcastError as exc:
            raise BroadcastError(f"journal line {number}: {exc}") from None
    return state


class JournalWriter:
    """Appends events to a journal file, each made durable (``fdatasync``) before ``append`` returns."""

    def __init__(self, path: str | os.PathLike[str], valid_length: int) -> None:
        """Open ``path`` and cut it to ``valid_length`` bytes (a torn last line); :class:`BroadcastError` if it is
        missing or shorter."""
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
                os.fdatasync(self._fd)
        except BaseException:
            os.close(self._fd)
            raise
        self._dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

    def record(self, state: JournalState, event: dict[str, Any]) -> None:
        """Write ``event`` as one line, wait until it is on disk, then apply it to ``state``; raises ``OSError`` if it
        cannot be written."""
        event["t"] = int(time.time() * 1000)
        data = (self._dumps(event) + "\n").encode()
        written = os.write(self._fd, data)
        if written != len(data):  # a regular file short-writes only when the disk is full
            raise OSError(f"journal write cut short ({written} of {len(data)} bytes)")
        os.fdatasync(self._fd)
        state.apply(event)

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# --------------------------------------------------------------------------------------------------- the files


@dataclass(frozen=True)
class _Spec:
    audience: list[int | str]
    text: str
    options: dict[str, Any]


def _fsync(path: Path, flags: int = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) -> None:
    fd = os.open(path, flags | _CLOEXEC, 0o600)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new_file(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data``, complete or not at all, unless it exists; True if this call created it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.touch(0o600, exist_ok=False)
        tmp.write_bytes(data)
        _fsync(tmp, os.O_RDONLY)
        try:
            os.link(tmp, path)  # fails instead of replacing
        except FileExistsError:
            return False
        _fsync(path.parent)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


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
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | _CLOEXEC, 0o600)
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
                    for index in state.in_flight_indexes():
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
