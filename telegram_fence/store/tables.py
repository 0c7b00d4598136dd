"""Which store's tables a connection lent out by the PostgreSQL store belongs to, kept beside the connection
(never on it: it may belong to the application's pool), for as long as its transaction runs; and
:func:`is_sqlite`, which tells an APSW connection without importing APSW. Safe from any thread.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["give_back", "is_sqlite", "lend", "lent", "outbox_table"]

_lock = threading.Lock()
_tables: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def lend(conn: object, outbox: str) -> None:
    """Note that ``conn`` carries a transaction of the store whose outbox table is ``outbox``, until
    :func:`give_back`."""
    with _lock:
        _tables[conn] = outbox


def give_back(conn: object) -> None:
    """Remove the note :func:`lend` made (nothing happens when there is none)."""
    with _lock:
        _tables.pop(conn, None)


@contextmanager
def lent(conn: object, outbox: str) -> Iterator[None]:
    """:func:`lend` for the block: the note is removed after it."""
    lend(conn, outbox)
    try:
        yield
    finally:
        give_back(conn)


def outbox_table(conn: object, default: str) -> str:
    """The outbox table of the store whose transaction ``conn`` carries now, else ``default``."""
    try:
        with _lock:
            return _tables.get(conn, default)
    except TypeError:  # a connection that takes no weak reference was never lent by the store
        return default


def is_sqlite(conn: object) -> bool:
    """Whether ``conn`` is an ``apsw.Connection``, without importing APSW."""
    apsw = sys.modules.get("apsw")
    return apsw is not None and isinstance(conn, apsw.Connection)
