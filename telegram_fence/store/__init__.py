"""The update store: its contract (re-exported from :mod:`.contract`) and its backends.

The one protocol the fence's runtime calls (``UpdateStore``) and the value types (``Identity``, ``Claim``,
``Exhaustion``) are defined in
:mod:`telegram_fence.store.contract` and importable from here. ``SqliteUpdateStore`` is imported
lazily, so the contract imports without the driver; ``store.postgres.PostgresUpdateStore`` needs
psycopg and is imported from its own package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .contract import Claim, Exhaustion, Identity, PollLeadership, RecordHook, UpdateStore, missing_methods

__all__ = [
    "Claim",
    "Exhaustion",
    "Identity",
    "PollLeadership",
    "RecordHook",
    "SqliteUpdateStore",
    "UpdateStore",
    "missing_methods",
]


if TYPE_CHECKING:  # a type checker sees the lazy name's class, and no __getattr__ that would make every other
    # name Any (a typo in an import would pass)
    from .sqlite import SqliteUpdateStore as SqliteUpdateStore
else:

    def __getattr__(name: str) -> Any:
        # Import the APSW implementation lazily so the contract imports without the driver.
        if name == "SqliteUpdateStore":
            from .sqlite import SqliteUpdateStore

            return SqliteUpdateStore
        raise AttributeError(name)
