"""The update store: its contract (re-exported from :mod:`.contract`) and its backends.

``SqliteUpdateStore`` is imported lazily, so the contract imports without the driver.
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


if TYPE_CHECKING:
    from .sqlite import SqliteUpdateStore as SqliteUpdateStore
else:

    def __getattr__(name: str) -> Any:
        if name == "SqliteUpdateStore":
            from .sqlite import SqliteUpdateStore

            return SqliteUpdateStore
        raise AttributeError(name)
