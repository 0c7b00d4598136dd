"""Which items of a ``getUpdates`` answer the poller records, as plain functions of values: what is an update the
store can keep (:func:`is_update`), what is a replay below the offset (:func:`screen`), and which updates
``authorize`` skips (:func:`unauthorized`, failing closed). What is dropped is logged. May import ``updates`` and
the standard library (layer 2, ingress).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ..updates import UnreadableUpdate

__all__ = ["is_update", "screen", "unauthorized"]

log = logging.getLogger("telegram_fence.poller.screening")

#: Update ids at or above this are not Telegram's (see :func:`is_update`).
MAX_UPDATE_ID = 2**62


def is_update(value: object) -> bool:
    """A mapping with an integer ``update_id`` in ``[0, 2**62)`` (plain dicts checked without the ABC).

    The bound keeps the id and the offset after it inside SQLite's 64-bit integers: a larger id (no
    Telegram id comes near it) could never be stored, and the same batch would be asked for forever.
    """
    if type(value) is not dict and not isinstance(value, Mapping):
        return False
    update_id = value.get("update_id")
    return type(update_id) is int and 0 <= update_id < MAX_UPDATE_ID


def screen(batch: Sequence[Any], offset: int) -> list[Mapping[str, Any]]:
    """The items of ``batch`` (asked for with ``offset``) to record: updates the store can keep, in order, without
    the replays below ``offset``. Telegram never answers an update below the offset it was sent: such items come
    from a faulty proxy, and their rows may be pruned already, so recording them would handle them again. What is
    dropped is logged (an error for unusable items, a warning for replays)."""
    valid = [u for u in batch if is_update(u)]
    if len(valid) != len(batch):
        log.error("getUpdates answered items without a usable update_id (an integer below 2**62); "
                  "they cannot be stored",
                  extra={"dropped": len(batch) - len(valid)})
    if offset > 0:
        fresh = [u for u in valid if u["update_id"] >= offset]
        if len(fresh) != len(valid):
            log.warning("getUpdates answered updates below the offset it was sent; dropped as replays",
                        extra={"offset": offset, "dropped": len(valid) - len(fresh)})
            valid = fresh
    return valid


def unauthorized(updates: Sequence[Mapping[str, Any]],
                 authorize: Callable[[Any], bool] | None) -> Collection[int]:
    """The ids among ``updates`` that ``authorize`` refuses (stored as skipped). An ``authorize`` that raises
    refuses (fail closed; logged); an :class:`~telegram_fence.updates.UnreadableUpdate` is never asked about (only
    its id is known: the store keeps it as an exhaustion)."""
    if authorize is None:
        return ()
    skip = set()
    for update in updates:
        if isinstance(update, UnreadableUpdate):
            continue
        try:
            allowed = bool(authorize(update))
        except Exception as exc:
            log.error("authorize() raised; the update is skipped",
                      extra={"update_id": update["update_id"], "err": exc})
            allowed = False
        if not allowed:
            skip.add(update["update_id"])
    return skip
