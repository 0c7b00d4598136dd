"""What a failed SQLite statement means to the user: the store's error for a foreign failure, and the message for a
lock that was not had. May import ``apsw``, ``errors`` and ``store.values``.
"""

from __future__ import annotations

import apsw

from ...errors import StoreCorrupt, StoreError, StoreUnavailable
from ..values import corrupt_message

__all__ = ["locked_message", "translate"]

_BUSY_SNAPSHOT = 517  # SQLITE_BUSY_SNAPSHOT: SQLite answers it at once, without the busy handler


def locked_message(path: str, exc: apsw.BusyError, waited: float, busy_timeout: float, doing: str) -> str:
    """What a user can act on when ``doing`` (e.g. "start a write transaction") failed with ``exc``: how long it
    waited and why (a stale snapshot of this connection, another connection's lock, or a conflict SQLite answered
    at once)."""
    if getattr(exc, "extendedresult", None) == _BUSY_SNAPSHOT:
        return (
            f"{path}: could not {doing} (SQLite answered busy after {waited:.3f} s, without waiting): this "
            "thread's connection still reads an old snapshot of the file, because a statement of an earlier "
            "transaction on this thread was left open; exhaust or close every cursor (fetchall(), or "
            "cursor.close() after fetchone()) before its write() block ends"
        )
    if waited + 0.05 >= busy_timeout:
        return (
            f"{path}: could not {doing}: the file stayed locked for {waited:.3f} s (busy_timeout="
            f"{busy_timeout:g}) by another connection to it (another process, or another store object "
            "on the same file in this process) holding a write transaction"
        )
    return (
        f"{path}: could not {doing}: SQLite answered busy after {waited:.3f} s without waiting out "
        f"busy_timeout={busy_timeout:g} (a lock conflict with another connection to the file that waiting "
        "cannot resolve); try again"
    )


def translate(exc: BaseException, path: str) -> StoreError:
    """The store's error for a foreign failure ``exc`` of a statement on the file ``path``: :class:`StoreCorrupt`
    for a damaged file, :class:`StoreUnavailable` for locks, a full disk, I/O or a closed connection,
    :class:`StoreError` for anything else."""
    if isinstance(exc, (apsw.CorruptError, apsw.NotADBError)):
        return StoreCorrupt(corrupt_message(f"the database file {path}", exc))
    if isinstance(exc, (apsw.BusyError, apsw.LockedError)):
        return StoreUnavailable(f"{path} stayed locked: {exc}")
    if isinstance(exc, apsw.FullError):
        return StoreUnavailable(f"{path}: the disk is full ({exc}); free some space, nothing was written")
    if isinstance(exc, (apsw.IOError, apsw.CantOpenError, apsw.ReadOnlyError, apsw.PermissionsError,
                        apsw.ConnectionClosedError, apsw.CursorClosedError, apsw.InterruptError)):
        return StoreUnavailable(f"{path} cannot be used now: {exc}")
    if isinstance(exc, UnicodeError):
        return StoreError(f"{path}: a value could not be stored as UTF-8 ({exc}); nothing was written")
    return StoreError(f"{path}: SQLite refused a statement of the store: {exc}")
