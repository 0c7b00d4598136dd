"""The update-store conformance suite: the rules every store backend must keep, runnable with or without pytest.

``check_store(factory)`` lists the broken rules; ``pytest_suite(factory)`` is one test per rule. ``factory(clock)``
returns a fresh, empty store reading time only from the :class:`ManualClock`. See docs/testing.md.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from . import rules_base, rules_durable, rules_fenced, rules_runtime  # noqa: F401  (registers the rules, in order)
from .harness import (
    _RULES,
    LEASE,
    RACE_ROUNDS,
    RACE_TIMEOUT,
    RACERS,
    ManualClock,
    NotApplicable,
    Probe,
    Rule,
    SqlProbe,
    StoreFactory,
)

__all__ = [
    "LEASE", "RACERS", "RACE_ROUNDS", "RACE_TIMEOUT", "RULES", "ManualClock", "NotApplicable", "Probe", "Rule",
    "SqlProbe", "StoreFactory", "check_store", "pytest_suite", "rule", "sqlite_factory"
]

#: Every rule, in the order they run: base, then fenced, durable, runtime.
RULES: tuple[Rule, ...] = tuple(_RULES)

_BY_NAME = {r.name: r for r in RULES}


def rule(name: str) -> Rule:
    """The rule called ``name``; ``KeyError`` naming the known rules when there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no conformance rule {name!r}; known rules: {', '.join(_BY_NAME)}") from None


def check_store(factory: StoreFactory, *, probe: Probe | None = None, rules: Sequence[Rule] = RULES) -> list[str]:
    """The rules the stores from ``factory`` break, as ``"rule_name: what went wrong"`` (an unexpected exception
    breaks its rule; a rule that does not apply is left out); ``[]`` when they conform."""
    problems = []
    for r in rules:
        try:
            r.run(factory, probe)
        except NotApplicable:
            pass
        except AssertionError as exc:
            problems.append(f"{r.name}: {exc}")
        except Exception as exc:
            problems.append(f"{r.name}: raised {type(exc).__name__}: {exc}")
    return problems


def pytest_suite(
    factory: StoreFactory | None = None, *, probe: Probe | None = None, rules: Sequence[Rule] = RULES
) -> Callable[..., None]:
    """A pytest test function parametrised over ``rules``, to assign to a name starting with ``test``; with
    ``factory=None`` it uses the fixture ``store_factory``. Rules that do not apply are skipped."""
    import pytest

    @pytest.mark.parametrize("conformance_rule", rules, ids=[r.name for r in rules])
    def test_store_conformance(conformance_rule: Rule, request: Any) -> None:
        """The store (of ``factory``, else of the ``store_factory`` fixture) keeps the rule named in the test id."""
        try:
            conformance_rule.run(factory or request.getfixturevalue("store_factory"), probe)
        except NotApplicable as exc:
            pytest.skip(str(exc))

    return test_store_conformance


def sqlite_factory(directory: str | os.PathLike[str], **options: Any) -> StoreFactory:
    """A factory of ``SqliteUpdateStore``\\ s (with ``options``), each in a new file inside ``directory``."""
    from ...store.sqlite import SqliteUpdateStore

    def make(clock: ManualClock) -> Any:
        name = f"conformance-{uuid.uuid4().hex[:16]}.db"
        return SqliteUpdateStore(os.path.join(os.fspath(directory), name), clock=clock, **options)

    return make
