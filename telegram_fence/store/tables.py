"""Which store's tables a connection of the PostgreSQL store belongs to (the store names it on each connection it
opens), and :func:`is_sqlite`, which tells an APSW connection without importing APSW."""

from __future__ import annotations

import sys

__all__ = ["is_sqlite", "outbox_table"]


def outbox_table(conn: object, default: str) -> str:
    """The outbox table of the PostgreSQL store that opened ``conn``, else ``default``."""
    return str(getattr(conn, "fence_outbox_table", default))


def is_sqlite(conn: object) -> bool:
    """Whether ``conn`` is an ``apsw.Connection``, without importing APSW."""
    apsw = sys.modules.get("apsw")
    return apsw is not None and isinstance(conn, apsw.Connection)
