"""The conformance suite's harness: rules and their registry, the manual clock and the probe that writes through a
transaction's handle."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...store import missing_methods

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
    """A :class:`Probe` for SQL stores whose ``write()`` and ``transaction()`` yield a connection taking
    ``execute(sql, params)``: ``?`` placeholders (APSW, ``sqlite3``), or ``%s`` for a store whose ``paramstyle`` is
    ``"format"`` (psycopg). Its markers live in ``{store.table}_marks`` (``conformance_marks`` for a store without a
    ``table``) in the store's own database; whoever made the store drops it with the rest.
    """

    #: The ``paramstyle`` values it writes in.
    paramstyles = ("qmark", "format", "pyformat")

    def __init__(self) -> None:
        self._table, self._mark = "conformance_marks", "?"  # those of the store prepared last (one rule at a time)

    def prepare(self, store: Any) -> None:
        table = getattr(store, "table", None)
        self._table = f"{table}_marks" if isinstance(table, str) else "conformance_marks"
        self._mark = "?" if getattr(store, "paramstyle", "qmark") == "qmark" else "%s"
        with store.write() as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self._table} (key text PRIMARY KEY)")

    def write(self, handle: Any, key: str) -> None:
        handle.execute(f"INSERT INTO {self._table} (key) VALUES ({self._mark})", (key,))

    def exists(self, store: Any, key: str) -> bool:
        with store.write() as conn:
            return conn.execute(f"SELECT 1 FROM {self._table} WHERE key = {self._mark}", (key,)).fetchone() is not None


class NotApplicable(Exception):
    """The rule does not apply to this store: it writes through ``transaction()`` and there is no probe for it."""


@dataclass(frozen=True)
class Rule:
    """One rule of the contract: its ``name`` (a stable test id), whether it needs a :class:`Probe`, and the function
    that checks it (its docstring says what the rule is)."""

    name: str
    needs_probe: bool
    check: Callable[[_Harness], None]

    def run(self, factory: StoreFactory, probe: Probe | None = None) -> None:
        """Check this rule against a fresh store from ``factory`` (closed after): ``AssertionError`` saying what
        went wrong when it breaks the rule, :class:`NotApplicable`, or what the store raised. Without ``probe``, a
        store with a ``write()`` method and a ``paramstyle`` :class:`SqlProbe` knows gets a :class:`SqlProbe`."""
        clock = ManualClock()
        store = factory(clock)
        try:
            missing = missing_methods(store)
            if missing:
                raise AssertionError(f"{type(store).__name__} lacks {', '.join(missing)} of the store protocol "
                                     "(telegram_fence.store.UpdateStore)")
            if self.needs_probe:
                if probe is None and callable(getattr(store, "write", None)) \
                        and getattr(store, "paramstyle", "qmark") in SqlProbe.paramstyles:
                    probe = SqlProbe()
                if probe is None:
                    raise NotApplicable("this rule writes through transaction(); pass a probe to run it")
                probe.prepare(store)
            self.check(_Harness(store, clock, probe if self.needs_probe else None))
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()


@dataclass(frozen=True)
class _Harness:
    """What a rule function works with: the store, its clock, the probe (``None`` unless the rule needs one)."""

    store: Any
    clock: ManualClock
    probe: Any


#: Every rule, in the order the rule modules register them.
_RULES: list[Rule] = []


def _rule(*, probe: bool = False) -> Callable[[Callable[[_Harness], None]], Callable[[_Harness], None]]:
    def register(fn: Callable[[_Harness], None]) -> Callable[[_Harness], None]:
        _RULES.append(Rule(fn.__name__, probe, fn))
        return fn

    return register
