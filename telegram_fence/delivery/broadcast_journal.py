"""A broadcast's append-only journal: :func:`replay` reads it into a :class:`JournalState`, :class:`JournalWriter`
appends events each made durable first; and the fsync-ed file writes a broadcast's directory needs."""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BroadcastError
from ..retry import retry_after_wait

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
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
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


def _fsync(path: Path, flags: int = os.O_RDONLY | os.O_DIRECTORY) -> None:
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
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
