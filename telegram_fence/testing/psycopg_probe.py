"""``PsycopgProbe``: the conformance probe for stores whose handles are psycopg connections (never imports psycopg)."""

from __future__ import annotations

from typing import Any

__all__ = ["PsycopgProbe"]


class PsycopgProbe:
    """A conformance ``Probe`` for SQL stores whose ``write()`` and ``transaction()`` yield a psycopg connection, such
    as ``PostgresUpdateStore``. Its markers live in ``{store.table}_marks`` (``conformance_marks`` for a store without
    a ``table``) in the store's own database; whoever made the store drops it with the rest.
    """

    default_table = "conformance_marks"

    def __init__(self) -> None:
        self._current = self.default_table  # the marker table of the store prepared last

    def _table(self, store: Any) -> str:
        table = getattr(store, "table", None)
        return f"{table}_marks" if isinstance(table, str) else self.default_table

    def prepare(self, store: Any) -> None:
        """Create the marker table of ``store``; later ``write`` calls go to it (one rule at a time)."""
        self._current = self._table(store)
        with store.write() as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self._current} (key text PRIMARY KEY)")

    def write(self, handle: Any, key: str) -> None:
        """Insert marker ``key`` through ``handle`` (the yielded psycopg connection)."""
        handle.execute(f"INSERT INTO {self._current} (key) VALUES (%s)", (key,))

    def exists(self, store: Any, key: str) -> bool:
        """Whether marker ``key`` is committed in ``store``'s marker table."""
        with store.write() as conn:
            return conn.execute(f"SELECT 1 FROM {self._table(store)} WHERE key = %s", (key,)).fetchone() is not None
