"""The conformance suite against PostgresUpdateStore: every rule runs (none skipped) and passes."""

from __future__ import annotations

from typing import Any

import pytest
from pg_support import DSN, fresh_tables, new_table, requires_pg

from telegram_fence.testing import conformance

pytestmark = requires_pg


def _check(make: Any) -> None:
    with fresh_tables() as made:

        def factory(clock: conformance.ManualClock) -> Any:
            table = new_table("tf_conf")
            made.append(table)
            return make(table, clock)

        assert conformance.check_store(factory, probe=conformance.SqlProbe()) == []  # a probe given: none skipped


def test_every_rule_passes_with_a_conninfo() -> None:
    """A store made from a connection string, with its default pool, keeps every conformance rule, none skipped."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    _check(lambda table, clock: PostgresUpdateStore(DSN, table=table, clock=clock))


@pytest.mark.parametrize("rule_name", ["transaction_commits_write_and_settle_together",
                                       "stale_transaction_write_is_absent"])
def test_probe_rules_fail_for_a_store_that_ignores_ownership(rule_name: str) -> None:
    """The probe rules can fail: a store whose transaction() never checks ownership breaks them."""
    from contextlib import contextmanager

    from telegram_fence.store.postgres import PostgresUpdateStore

    class Unfenced(PostgresUpdateStore):
        @contextmanager
        def transaction(self, identity: Any, complete: bool = False) -> Any:
            with self.write() as conn:
                yield conn

    with fresh_tables() as made:

        def factory(clock: conformance.ManualClock) -> Any:
            made.append(new_table("tf_conf"))
            return Unfenced(DSN, table=made[-1], clock=clock)

        problems = conformance.check_store(factory, probe=conformance.SqlProbe(), rules=[conformance.rule(rule_name)])
    assert len(problems) == 1 and problems[0].startswith(rule_name)
