"""The update-store conformance suite: the rules every store backend must keep, runnable with or without pytest.

A backend proves itself by running the rules against fresh stores made by a **factory**::

    factory(clock) -> store

``clock`` is a :class:`ManualClock` (a ``() -> float`` the rules move forward; nothing ever sleeps).
The factory returns a *fresh, empty* store that reads the time only from ``clock`` and may be shared
by several threads at once (the fence's workers share one store). After each rule the suite calls
the store's ``close()`` when it has one. The store speaks the types of :mod:`telegram_fence.store`
(``Claim``, ``Identity``, ``Step``, ``Exhaustion``) and raises ``InvalidUpdate`` and ``OwnershipLost``
from :mod:`telegram_fence.errors`.

Without pytest (like ``trio.testing.check_*``)::

    from telegram_fence.testing import conformance
    problems = conformance.check_store(factory)      # [] when the store conforms
    assert not problems, "\\n".join(problems)

With pytest, one test id per rule (``test_my_store[owns_only_exact_live_identity]`` …)::

    test_my_store = conformance.pytest_suite(factory)

    # or, when the factory needs a fixture such as ``tmp_path``, name no factory and provide a
    # ``store_factory`` fixture:
    test_sqlite_store = conformance.pytest_suite()

    @pytest.fixture
    def store_factory(tmp_path):
        return conformance.sqlite_factory(tmp_path)

Levels: **base** rules run for every store; **fenced** rules when :func:`~telegram_fence.store.is_fenced`
holds; **durable** rules when :func:`~telegram_fence.store.is_durable` holds; **runtime** rules (the fast
paths of ``BatchedUpdateStore`` the fence's runtime calls, concurrent claimers of them, the exhaustion
listener) when the store is durable and :func:`~telegram_fence.store.is_batched`. A rule above the store's
level is *skipped*, never failed. Each rule has a positive control (the legitimate call succeeds, so the
setup is sound) and a stale-identity control (expiry, reclaim, renewal after loss, pruning and
``update_id`` reuse): a rule that only ever expects ``False`` could not tell a broken store from a
fenced one.

Writes through ``store.transaction()``: two rules check that a write made through the handle the
transaction yields commits (or is absent) together with the ownership decision. The suite cannot know
how to write through another backend's handle, so those rules use a :class:`Probe`: pass one to
``check_store``/``pytest_suite``, or leave it out and :func:`default_probe` picks one for a store with a
``write()`` method by the store's ``paramstyle``: :class:`SqlProbe` (qmark SQL through
``handle.execute``: APSW and ``sqlite3`` handles, e.g. ``SqliteUpdateStore``) or, for ``"format"``,
``PsycopgProbe`` (``%s`` SQL through a psycopg connection, e.g. ``PostgresUpdateStore``). Without a probe
those two rules are skipped; every other ``transaction`` rule needs none.

The package: :mod:`.harness` (rules, outcomes, clock, probes), :mod:`.helpers` (what rules share, the
registry), :mod:`.rules_base`, :mod:`.rules_fenced`, :mod:`.rules_durable`, :mod:`.rules_concurrency` (the rules, in
the order they run),
:mod:`.running` (``check_store``, ``pytest_suite``, ``sqlite_factory``).

Rules raise ``AssertionError`` with a sentence saying what the store did wrong (``assert`` statements
are not used, so ``python -O`` cannot silence them).
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
    "LEASE",
    "LEVELS",
    "RACERS",
    "RACE_ROUNDS",
    "RACE_TIMEOUT",
    "RULES",
    "Level",
    "ManualClock",
    "NotApplicable",
    "Outcome",
    "Probe",
    "Rule",
    "SqlProbe",
    "StoreFactory",
    "assert_conforms",
    "check_store",
    "default_probe",
    "pytest_suite",
    "rule",
    "run_rules",
    "sqlite_factory",
]

