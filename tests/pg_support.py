"""What the PostgreSQL tests share: the DSN from ``TELEGRAM_FENCE_PG_DSN``, a skip marker when it is
absent, unique table names that are dropped afterwards, a split round made to fail on the server, and a watch on
which thread begins and which reads each split round."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from telegram_fence.store.postgres import table_names

#: The server the PostgreSQL tests use; ``None`` skips them (with the reason below).
DSN = os.environ.get("TELEGRAM_FENCE_PG_DSN") or None

requires_pg = pytest.mark.skipif(
    DSN is None,
    reason="TELEGRAM_FENCE_PG_DSN is not set: the PostgreSQL backend is untested here "
    "(e.g. TELEGRAM_FENCE_PG_DSN='host=127.0.0.1 port=5432 user=postgres dbname=test')",
)


def dsn_with(**settings: str) -> str:
    """:data:`DSN` with ``settings`` added (``application_name=...``, ``options=...``), whether it is a
    ``key=value`` string or a ``postgresql://`` URL (text appended to a URL would not parse)."""
    from psycopg.conninfo import make_conninfo

    assert DSN is not None
    return make_conninfo(DSN, **settings)


def new_table(prefix: str = "tf_test") -> str:
    """A table name no other test uses."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def drop_tables(*tables: str) -> None:
    """Drop ``tables`` and every table the store made beside them."""
    import psycopg

    assert DSN is not None
    with psycopg.connect(DSN, autocommit=True) as conn:
        for table in tables:
            for name in (*table_names(table), f"{table}_marks", f"{table}_domain"):
                conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(f"DROP FUNCTION IF EXISTS {table}_calls_prune()")  # the call journal's prune trigger
            conn.execute(f"DROP FUNCTION IF EXISTS {table}_step_results_prune()")  # the durable steps' one


@contextmanager
def fresh_tables() -> Iterator[list[str]]:
    """A list to note table names in; every table noted is dropped when the block ends."""
    made: list[str] = []
    try:
        yield made
    finally:
        if made:
            drop_tables(*made)


@contextmanager
def store_of(kind: str, tmp_path: Path, prefix: str = "tf_test", **options: Any) -> Iterator[Any]:
    """A fresh store of backend ``kind``: ``"sqlite"`` on ``tmp_path/bot.db``, ``"postgres"`` on tables of its
    own (named from ``prefix``, dropped afterwards); ``options`` go to the store's constructor. Closed after."""
    from telegram_fence import SqliteUpdateStore

    if kind == "sqlite":
        with SqliteUpdateStore(tmp_path / "bot.db", **options) as sqlite:
            yield sqlite
        return
    from telegram_fence.store.postgres import PostgresUpdateStore

    assert DSN is not None
    table = new_table(prefix)
    postgres = PostgresUpdateStore(DSN, table=table, **options)
    try:
        yield postgres
    finally:
        postgres.close()
        drop_tables(table)


@pytest.fixture(name="store")
def pg_store(tmp_path: Path) -> Iterator[Any]:
    """A PostgreSQL store on a table of its own, dropped afterwards (``store_of("postgres", tmp_path)``): a test
    module takes it as its ``store`` fixture with ``from pg_support import pg_store``."""
    with store_of("postgres", tmp_path) as opened:
        yield opened


#: A test parametrised over both backends; the PostgreSQL case is skipped without a server.
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(DSN is None, reason="no PostgreSQL"))]


def no_wait(error: BaseException, attempt: int) -> float:
    """A retry policy that retries at once."""
    return 0.0
