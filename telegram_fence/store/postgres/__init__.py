"""The update store on PostgreSQL, for a bot whose workers run on several hosts.

``PostgresUpdateStore(conninfo, *, table="fence_updates", clock=None, create_table=True, ...)``
keeps all three contract levels with the semantics of ``SqliteUpdateStore``; ``schema_sql(table)``
is its DDL (importable without psycopg, for ``telegram-fence schema --postgres TABLE``). This package
is the only place that imports psycopg (install ``telegram_fence[postgres]``); ``import telegram_fence``
never reaches it.

May import psycopg, the standard library and level 0-1 modules of telegram_fence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .schema import schema_sql, table_names

__all__ = ["PostgresUpdateStore", "schema_sql", "table_names"]


if TYPE_CHECKING:  # a type checker sees the lazy name's class, and no __getattr__ that would make every other
    # name Any (a typo in an import would pass)
    from .store import PostgresUpdateStore as PostgresUpdateStore
else:

    def __getattr__(name: str) -> Any:
        # psycopg is imported only when the store itself is asked for.
        if name == "PostgresUpdateStore":
            from .store import PostgresUpdateStore

            return PostgresUpdateStore
        raise AttributeError(name)
