"""Removes a PostgreSQL store a benchmark made: its tables and its trigger functions."""

from __future__ import annotations

import psycopg

from telegram_fence.store.postgres import table_names


def drop_store(dsn: str, table: str, *more: str) -> None:
    """Drop every table of the store named ``table`` (and the tables ``more``) and its prune functions; what is
    already gone is skipped."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in (*table_names(table), *more):
            conn.execute(f"DROP TABLE IF EXISTS {name}")
        for journal in ("calls", "step_results"):
            conn.execute(f"DROP FUNCTION IF EXISTS {table}_{journal}_prune()")
