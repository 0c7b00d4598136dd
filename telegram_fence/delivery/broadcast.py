"""Broadcasts: one message to a list of chats that ends, resumes by name, and sends nobody the message twice.

A broadcast lives in ``<directory>/<name>/``: ``broadcast.json`` (audience, text, options; written once,
atomically), ``journal.jsonl`` (an intent line before each send, an outcome line after it) and ``lock``
(``flock``-ed by the running process). The rules a run keeps are in docs/broadcast.md.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    BroadcastConflict,
    BroadcastError,
    BroadcastLocked,
    ConfigurationError,
    RetryAfter,
    TelegramError,
)
from ..telegram import call
from .broadcast_decisions import Pacer, RetryPolicy, decide
from .broadcast_input import normalize_audience, normalize_send_options, send_kwargs, validate_name
from .broadcast_journal import BroadcastReport, JournalState, JournalWriter, replay
from .message_limits import check_encodable, check_length

__all__ = ["Broadcast", "BroadcastReport", "RetryPolicy"]

SPEC_FILE = "broadcast.json"
JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = "lock"
_FORMAT = 1
_MAX_LEAD = 0.05  # never write an intent more than this long before its send may start

Progress = Callable[[BroadcastReport], object]


@dataclass(frozen=True)
class _Spec:
    audience: list[int | str]
    text: str
    options: dict[str, Any]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new_file(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; True if this call created it.

    The file appears complete or not at all: written to a temp file, fsynced, hard-linked to ``path``
    (which fails instead of replacing), and the directory fsynced.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        _fsync_dir(path.parent)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


class Broadcast:
    """One message to a fixed list of chats, sent by a telebot bot at most once per chat.

    ``bot`` is a ``telebot.TeleBot`` (it may be ``None`` for :meth:`create` and :meth:`status`);
    ``directory`` holds one sub-directory per broadcast ``name``. An instance is not thread-safe:
    use it from one thread, except :meth:`stop`, which any thread may call.
    Several processes may hold instances of the same broadcast; only one can :meth:`run` it at a time.
    """

    def __init__(
        self,
        bot: Any,
        directory: str | os.PathLike[str],
        name: str,
        *,
        policy: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Raise :class:`ConfigurationError` if ``name`` is not a safe directory name."""
        self.name = validate_name(name)
        self.bot = bot
        self.directory = Path(directory)
        self.path = self.directory / name
        self.policy = policy or RetryPolicy()
        self._clock = clock
        self._stop = threading.Event()

    def __repr__(self) -> str:
        return f"Broadcast({self.name!r} in {os.fspath(self.directory)!r})"

    def create(self, audience: Iterable[object], text: str, **send_options: Any) -> bool:
        """Write the audience and the message once; return True if this call wrote them (False: already written).

        ``audience``: chat ids (``int``, decimal strings, ``@channel`` names), de-duplicated in order;
        ``send_options``: ``parse_mode``, ``reply_markup``, … (``broadcast_input.SUPPORTED_OPTIONS``).
        Raises :class:`ConfigurationError` (nothing written) for a bad entry, option or text (empty, over 4096
        characters, a lone surrogate); :class:`BroadcastConflict` if the name exists with another audience,
        text or options; ``OSError`` if the files cannot be written.
        """
        if not isinstance(text, str) or not text.strip():
            raise ConfigurationError("broadcast text is empty: a broadcast needs a message to send")
        chats = normalize_audience(audience)
        options = normalize_send_options(send_options)
        check_length(text, options.get("parse_mode"))  # refused now, not halted mid-run with the name used up
        for key, value in options.items():
            check_encodable(json.dumps(value, ensure_ascii=False), f"send option {key!r} (as JSON)")
        spec = _Spec(chats, text, options)
        existing = self._read_spec(missing_ok=True)
        if existing is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                self.path.mkdir()
                _fsync_dir(self.directory)
            except FileExistsError:
                pass
            journal = self.path / JOURNAL_FILE
            fd = os.open(journal, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(self.path)
            body = {"format": _FORMAT, "name": self.name, "text": text, "options": options, "audience": chats}
            data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
            if _write_new_file(self.path / SPEC_FILE, data):
                return True
            existing = self._read_spec()  # another process created it meanwhile
        assert existing is not None
        self._check_same(existing, spec)
        return False

    def _check_same(self, existing: _Spec, wanted: _Spec) -> None:
        differs = [
            what
            for what, a, b in (
                ("audience", existing.audience, wanted.audience),
                ("text", existing.text, wanted.text),
                ("send options", existing.options, wanted.options),
            )
            if a != b
        ]
        if differs:
            raise BroadcastConflict(
                f"broadcast {self.name!r} already exists in {os.fspath(self.directory)!r} with another "
                f"{' and '.join(differs)}; a broadcast's message and audience never change - use a new name"
            )

    def exists(self) -> bool:
        """True once :meth:`create` has written this broadcast."""
        return (self.path / SPEC_FILE).is_file()

    def _read_spec(self, *, missing_ok: bool = False) -> _Spec | None:
        try:
            raw = (self.path / SPEC_FILE).read_bytes()
        except FileNotFoundError:
            if missing_ok:
                return None
            raise BroadcastError(
                f"no broadcast named {self.name!r} in {os.fspath(self.directory)!r}: create it first"
            ) from None
        try:
            body = json.loads(raw)
            if body.get("format") != _FORMAT:
                raise BroadcastError(f"broadcast {self.name!r} has format {body.get('format')!r}, not {_FORMAT}")
            return _Spec(list(body["audience"]), str(body["text"]), dict(body["options"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BroadcastError(f"{os.fspath(self.path / SPEC_FILE)!r} is damaged: {exc}") from exc

    def _read_journal(self, spec: _Spec) -> JournalState:
        try:
            data = (self.path / JOURNAL_FILE).read_bytes()
        except FileNotFoundError:
            raise BroadcastError(
                f"broadcast {self.name!r} has no journal ({JOURNAL_FILE}); without it nobody can tell "
                "who already got the message, so it will not be sent"
            ) from None
        try:
            return replay(data, spec.audience)
        except BroadcastError as exc:
            raise BroadcastError(f"{os.fspath(self.path / JOURNAL_FILE)!r}: {exc}") from exc

    def status(self) -> BroadcastReport:
        """Where the broadcast stands, read from its journal; safe while another process runs it.

        Raises :class:`BroadcastError` if the broadcast does not exist or its journal is damaged.
        """
        spec = self._read_spec()
        assert spec is not None
        return self._read_journal(spec).report(self.name)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                raise BroadcastLocked(
                    f"broadcast {self.name!r} is being run by another process (pid {holder}); "
                    "wait for it to end or stop it"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the flock

    def stop(self) -> None:
        """Ask the current (or, if none is running, the next) :meth:`run` to return after the send in progress.

        Safe from any thread and from a signal handler. The run returns its report with the rest pending;
        nothing is recorded as failed or uncertain because of the stop.
        """
        self._stop.set()

    def run(
        self,
        *,
        rate: float = 25.0,
        progress: Progress | None = None,
        dry_run: bool = False,
    ) -> BroadcastReport:
        """Send the message to every recipient not yet decided, resuming where earlier runs stopped.

        Returns the report when every recipient is decided, when the run halts (``report.halted``; a refused
        message halts for good) or after :meth:`stop`. ``rate``: messages per second overall (``math.inf``: no
        limit), one per second per chat. ``progress(report)`` runs after each outcome (what it raises ends the
        run). ``dry_run``: send nothing, return the report a run would start from. Raises
        :class:`BroadcastLocked`, :class:`BroadcastError` (missing or damaged), :class:`ConfigurationError`
        (bad ``rate``, no bot), ``OSError`` if the journal cannot be written (the recipient in flight is uncertain).
        """
        pacer = Pacer(rate)
        if not dry_run and self.bot is None:
            raise ConfigurationError("Broadcast.run needs a bot: Broadcast(telebot.TeleBot(token), ...)")
        spec = self._read_spec()
        assert spec is not None
        try:
            return self._run_locked(spec, pacer, progress, dry_run)
        finally:
            self._stop.clear()

    def _run_locked(self, spec: _Spec, pacer: Pacer, progress: Progress | None, dry_run: bool) -> BroadcastReport:
        with self._locked():
            state = self._read_journal(spec)
            if dry_run:
                report = state.report(self.name, in_flight_as_uncertain=True)
                if progress is not None:
                    progress(report)
                return report
            writer = JournalWriter(self.path / JOURNAL_FILE, state.valid_length)
            try:
                if state.halt is not None and state.halt.final:
                    return state.report(self.name)
                for index in state.in_flight_indexes():
                    self._record(writer, state, {"ev": "uncertain", "i": index, "reason": "interrupted"})
                self._record(writer, state, {"ev": "run", "pid": os.getpid()})
                owed = state.not_before - time.time()
                if owed > 0:  # a 429 wait that an earlier run did not live to finish
                    pacer.hold(self._clock() + owed)
                return self._send_all(spec, state, writer, pacer, progress)
            finally:
                writer.close()

    @staticmethod
    def _record(writer: JournalWriter, state: JournalState, event: dict[str, Any]) -> None:
        writer.append(event)
        state.apply(event)

    def _send_all(
        self, spec: _Spec, state: JournalState, writer: JournalWriter, pacer: Pacer, progress: Progress | None
    ) -> BroadcastReport:
        kwargs = send_kwargs(spec.options)
        clock, stop, record = self._clock, self._stop, self._record
        ambiguous_in_a_row = 0
        # The intent is written while the pacer's wait runs out: the wait ends ``lead`` seconds early (the
        # recent cost of an intent line, at most _MAX_LEAD), then only the rest of the wait remains. The send is
        # never earlier than the pacer allows.
        lead = 0.0
        for index in state.pending_indexes():
            chat = spec.audience[index]
            transient = limited = 0
            while True:
                delay = pacer.delay(chat, clock())
                if (delay > lead and stop.wait(delay - lead)) or stop.is_set():
                    return state.report(self.name)
                began = clock()
                record(writer, state, {"ev": "intent", "i": index, "chat": chat})
                now = clock()
                lead = min(_MAX_LEAD, 0.8 * lead + 0.2 * (now - began))
                delay = pacer.delay(chat, now)
                if delay > 0:  # at most _MAX_LEAD: one short bounded wait, not a polling loop
                    time.sleep(delay)
                pacer.sent(chat, clock())
                try:
                    message = call("sendMessage", self.bot.send_message, chat, spec.text, **kwargs)
                except TelegramError as error:
                    decision = decide(
                        error,
                        transient_failures=transient,
                        rate_limited=limited,
                        ambiguous_in_a_row=ambiguous_in_a_row,
                        policy=self.policy,
                    )
                    outcome: dict[str, Any] = {
                        "ev": decision.outcome, "i": index, "reason": decision.reason, "detail": str(error)[:300]
                    }
                    if decision.wait is not None:
                        outcome["wait"] = decision.wait
                    record(writer, state, outcome)
                    ambiguous_in_a_row = ambiguous_in_a_row + 1 if decision.outcome == "uncertain" else 0
                    if decision.halt is not None:
                        record(
                            writer, state, {"ev": "halt", "i": index, "reason": decision.halt, "final": decision.final}
                        )
                        report = state.report(self.name)
                        if progress is not None:
                            progress(report)
                        return report
                    if decision.wait is not None:
                        if isinstance(error, RetryAfter):
                            limited += 1
                        else:
                            transient += 1
                        pacer.hold(clock() + decision.wait)
                        continue
                else:
                    ambiguous_in_a_row = 0
                    record(writer, state, {"ev": "sent", "i": index, "msg": getattr(message, "message_id", None)})
                break
            if progress is not None:
                progress(state.report(self.name))
        return state.report(self.name)
