"""The update-store conformance suite: the rules every store backend must keep, runnable with or without pytest.

``check_store(factory)`` lists the broken rules; ``pytest_suite(factory)`` is one test per rule. ``factory(clock)``
returns a fresh, empty store reading time only from the :class:`ManualClock`. See docs/testing.md.
"""

from __future__ import annotations

from .harness import (
    LEASE,
    LEVELS,
    RACE_ROUNDS,
    RACE_TIMEOUT,
    RACERS,
    Level,
    ManualClock,
    NotApplicable,
    Outcome,
    Probe,
    Rule,
    SqlProbe,
    StoreFactory,
    default_probe,
)
from .running import RULES, assert_conforms, check_store, pytest_suite, rule, run_rules, sqlite_factory

__all__ = [
    "LEASE", "LEVELS", "RACERS", "RACE_ROUNDS", "RACE_TIMEOUT", "RULES", "Level", "ManualClock", "NotApplicable",
    "Outcome", "Probe", "Rule", "SqlProbe", "StoreFactory", "assert_conforms", "check_store", "default_probe",
    "pytest_suite", "rule", "run_rules", "sqlite_factory"
]

