"""The conformance suite's harness: rules, outcomes, the manual clock and the probes that write through a
transaction's handle."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ...store import missing_methods

#: The group a rule belongs to; every rule applies to every store.
Level = Literal["base", "fenced", "durable", "runtime"]
#: The levels in the order their rules run.
LEVELS: tuple[Level, ...] = ("base", "fenced", "durable", "runtime")

#: ``factory(clock) -> store``: a fresh, empty store reading time only from ``clock``.
StoreFactory = Callable[["ManualClock"], Any]

#: The lease every rule claims with, in seconds of the manual clock.
LEASE = 30.0
#: Threads that race for one update in the "exactly one winner" rules, and how many rounds they race.
RACERS = 8
RACE_ROUNDS = 5
#: How long a racing thread may take before the rule fails.
RACE_TIMEOUT = 30.0


class ManualClock:
    """A thread-safe clock that moves only when told to: ``clock()`` returns the current time."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds`` and return the new time; ``ValueError`` for a negative amount."""
        if seconds < 0:
            raise ValueError(f"a ManualClock only moves forward; advance({seconds!r}) was asked")
        with self._lock:
            self._now += seconds
            return self._now


class Probe(Protocol):
    """Writes and reads a marker row through a backend's transaction handle (for two transaction rules)."""

    def prepare(self, store: Any) -> None:
        """Create whatever the marker needs (a table); called once on each fresh store before the rule runs."""
        ...

    def write(self, handle: Any, key: str) -> None:
        """Write marker ``key`` through ``handle``, the object ``store.transaction()`` yielded."""
        ...

    def exists(self, store: Any, key: str) -> bool:
        """Whether marker ``key`` is committed (read outside any transaction of the rule)."""
        ...


class SqlProbe:
    """A :class:`Probe` for stores whose handles take ``execute(sql, params)`` with ``?`` placeholders (APSW,
    ``sqlite3``), keeping its markers in the table ``conformance_marks``."""

    table = "conformance_marks"

    def prepare(self, store: Any) -> None:
        with store.write() as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table}(key TEXT PRIMARY KEY)")

    def write(self, handle: Any, key: str) -> None:
        handle.execute(f"INSERT INTO {self.table}(key) VALUES (?)", (key,))

    def exists(self, store: Any, key: str) -> bool:
        with store.write() as conn:
            return bool(list(conn.execute(f"SELECT 1 FROM {self.table} WHERE key = ?", (key,))))


def default_probe(store: Any) -> Probe | None:
    """The probe for a store with a ``write()`` method, by its ``paramstyle``: ``"qmark"`` or none gets
    :class:`SqlProbe`, ``"format"``/``"pyformat"`` (psycopg) ``PsycopgProbe``; ``None`` for another."""
    if not callable(getattr(store, "write", None)):
        return None
    style = getattr(store, "paramstyle", "qmark")
    if style in ("format", "pyformat"):
        from ..psycopg_probe import PsycopgProbe

        return PsycopgProbe()
    if style == "qmark":
        return SqlProbe()
    return None


class NotApplicable(Exception):
    """The rule does not apply to this store: it writes through ``transaction()`` and there is no probe for it."""


@dataclass(frozen=True)
class Rule:
    """One rule of the contract: its ``name`` (a stable test id), ``level``, whether it needs a :class:`Probe`, and
    the function that checks it."""

    name: str
    level: Level
    doc: str
    needs_probe: bool
    check: Callable[[_Harness], None]

    def run(self, factory: StoreFactory, probe: Probe | None = None) -> None:
        """Check this rule against a fresh store from ``factory`` (closed after): ``AssertionError`` saying what
        went wrong when it breaks the rule, :class:`NotApplicable`, or what the store raised."""
        clock = ManualClock()
        store = factory(clock)
        try:
            missing = missing_methods(store)
            if missing:
                raise AssertionError(f"{type(store).__name__} lacks {', '.join(missing)} of the store protocol "
                                     "(telegram_fence.store.UpdateStore)")
            chosen = probe
            if self.needs_probe:
                if chosen is None:
                    chosen = default_probe(store)
                if chosen is None:
                    raise NotApplicable("this rule writes through transaction(); pass a probe to run it")
                chosen.prepare(store)
            self.check(_Harness(store, clock, chosen))
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()


@dataclass(frozen=True)
class Outcome:
    """What one rule found: ``status`` is ``"passed"``, ``"failed"`` or ``"skipped"``; ``message`` says why."""

    rule: str
    status: Literal["passed", "failed", "skipped"]
    message: str = ""


@dataclass(frozen=True)
class _Harness:
    """What a rule function works with: the store, its clock, the probe (``None`` unless the rule needs one)."""

    store: Any
    clock: ManualClock
    probe: Any


