"""Running the rules, with or without pytest, and a factory of SQLite stores."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from . import (  # noqa: F401  (registers the rules, in this order)
    rules_base,
    rules_durable,
    rules_fenced,
    rules_runtime,
)
from .harness import LEVELS, ManualClock, NotApplicable, Outcome, Probe, Rule, StoreFactory
from .helpers import _RULES

#: Every rule, in the order they run: base, then fenced, durable, runtime.
RULES: tuple[Rule, ...] = tuple(sorted(_RULES, key=lambda r: LEVELS.index(r.level)))

_BY_NAME = {r.name: r for r in RULES}


def rule(name: str) -> Rule:
    """The rule called ``name``; ``KeyError`` naming the known rules when there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no conformance rule {name!r}; known rules: {', '.join(_BY_NAME)}") from None


def run_rules(factory: StoreFactory, *, probe: Probe | None = None, rules: Sequence[Rule] = RULES) -> list[Outcome]:
    """Run ``rules`` against fresh stores from ``factory``; one :class:`Outcome` per rule, in order (an unexpected
    exception is a failed rule)."""
    outcomes = []
    for r in rules:
        try:
            r.run(factory, probe)
        except NotApplicable as exc:
            outcomes.append(Outcome(r.name, "skipped", str(exc)))
        except AssertionError as exc:
            outcomes.append(Outcome(r.name, "failed", str(exc)))
        except Exception as exc:
            outcomes.append(Outcome(r.name, "failed", f"raised {type(exc).__name__}: {exc}"))
        else:
            outcomes.append(Outcome(r.name, "passed"))
    return outcomes


def check_store(factory: StoreFactory, *, probe: Probe | None = None, rules: Sequence[Rule] = RULES) -> list[str]:
    """The rules the stores from ``factory`` break, as ``"rule_name: what went wrong"``; ``[]`` when they conform."""
    return [f"{o.rule}: {o.message}" for o in run_rules(factory, probe=probe, rules=rules) if o.status == "failed"]


def assert_conforms(factory: StoreFactory, *, probe: Probe | None = None, rules: Sequence[Rule] = RULES) -> None:
    """Raise ``AssertionError`` listing every broken rule; return quietly when the store conforms."""
    problems = check_store(factory, probe=probe, rules=rules)
    if problems:
        raise AssertionError(f"{len(problems)} conformance rule(s) broken:\n" + "\n".join(problems))


def pytest_suite(
    factory: StoreFactory | None = None, *, probe: Probe | None = None, rules: Sequence[Rule] = RULES
) -> Callable[..., None]:
    """A pytest test function parametrised over ``rules``, to assign to a name starting with ``test``; with
    ``factory=None`` it uses the fixture ``store_factory``. Rules that do not apply are skipped."""
    import pytest

    ids = [r.name for r in rules]

    @pytest.mark.parametrize("conformance_rule", rules, ids=ids)
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
