"""The conformance suite against PostgresUpdateStore: every rule runs (none skipped) and passes."""

from __future__ import annotations

from typing import Any

import pytest
from pg_support import DSN, fresh_tables, new_table, requires_pg

from telegram_fence.testing import conformance
from telegram_fence.testing.psycopg_probe import PsycopgProbe

pytestmark = requires_pg


def _check(make: Any) -> None:
    with fresh_tables() as made:

        def factory(clock: conformance.ManualClock) -> Any:
            table = new_table("tf_conf")
            made.append(table)
            return make(table, clock)

        outcomes = conformance.run_rules(factory, probe=PsycopgProbe())
    assert [o for o in outcomes if o.status == "skipped"] == [], "a rule did not run against PostgreSQL"
    assert [f"{o.rule}: {o.message}" for o in outcomes if o.status != "passed"] == []
    assert len(outcomes) == len(conformance.RULES)


def test_every_rule_passes_with_a_conninfo() -> None:
    """A store made from a connection string, with its default pool, keeps every conformance rule, none skipped
    (so ``check_store()`` with the psycopg probe, the form the issue names, reports nothing: it is this run,
    filtered; a separate full run of it proved nothing more)."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    _check(lambda table, clock: PostgresUpdateStore(DSN, table=table, clock=clock))


def test_every_rule_passes_with_an_application_pool() -> None:
    """A store on the application's own psycopg_pool (connections not in autocommit) keeps every rule."""
    import psycopg_pool

    from telegram_fence.store.postgres import PostgresUpdateStore

    pool = psycopg_pool.ConnectionPool(DSN, min_size=1, max_size=12, open=True)
    try:
        _check(lambda table, clock: PostgresUpdateStore(pool, table=table, clock=clock))
        assert not pool.closed, "close() of a store closed the application's pool"
    finally:
        pool.close()


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

        problems = conformance.check_store(factory, probe=PsycopgProbe(), rules=[conformance.rule(rule_name)])
    assert len(problems) == 1 and problems[0].startswith(rule_name)


@pytest.mark.parametrize("wrong", [{"backlog": 1}, {"cursor": 1}])
def test_the_counts_rule_fails_for_a_round_that_carries_wrong_counts(wrong: dict[str, int]) -> None:
    """The rule on a split round's carried backlog and cursor can fail: a store whose round answers a backlog or a
    cursor one above what it committed breaks it (the poller would fetch past the backpressure or confirm an update
    never stored)."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    class Overcounts(PostgresUpdateStore):
        def _outcome(self, round_: Any, rows: Any) -> Any:
            outcome = super()._outcome(round_, rows)
            return outcome._replace(**{k: getattr(outcome, k) + v for k, v in wrong.items()})

    name = "begin_round_counts_what_it_committed"
    with fresh_tables() as made:

        def factory(clock: conformance.ManualClock) -> Any:
            made.append(new_table("tf_conf"))
            return Overcounts(DSN, table=made[-1], clock=clock)

        problems = conformance.check_store(factory, probe=PsycopgProbe(), rules=[conformance.rule(name)])
    assert len(problems) == 1 and problems[0].startswith(name)
