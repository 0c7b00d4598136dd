"""Which due rows the SQLite store claims, as a pure function (and, from the value core, which new ones).

No I/O, no clock, no randomness: each function's answer depends on its arguments only, so each is
tested with tables (``tests/test_store_decisions.py``). The values both backends share (validation,
encoding, identity keys, lapse reasons) are in :mod:`telegram_fence.store.values`. May import ``errors``,
``updates`` and ``store`` (the contract and its values) only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from ..values import choose_inline, lapsed_reason

__all__ = ["choose_inline", "pick_candidates"]

# Which new updates to store already claimed is the same choice on every backend: it lives in store.values.

#: One candidate row as the store reads it: ``(update_id, chat_id, attempt, payload or None)``.
Candidate = tuple[int, int | None, int, Any]


def pick_candidates(
    candidates: Sequence[Candidate],
    limit: int,
    max_attempts: int | None,
    exclude_chats: Collection[int],
) -> tuple[list[Candidate], list[list[Any]]]:
    """From due rows in ``update_id`` order, the ones to claim (at most one per chat) and the spent ones.

    Returns ``(picked, lapsed)``: ``picked`` holds ``(update_id, chat_id, next attempt, payload)``,
    at most ``limit``, none of a chat in ``exclude_chats``; ``lapsed`` holds ``[update_id, reason]``
    for each row seen whose attempts are spent (``attempt >= max_attempts``) before the limit was met.
    """
    picked: list[Candidate] = []
    lapsed: list[list[Any]] = []
    taken_chats = set(exclude_chats)
    for update_id, chat_id, attempt, payload in candidates:
        if chat_id is not None and chat_id in taken_chats:
            continue
        if max_attempts is not None and attempt >= max_attempts:
            lapsed.append([update_id, lapsed_reason(attempt, max_attempts)])
            continue
        picked.append((update_id, chat_id, attempt + 1, payload))
        if chat_id is not None:
            taken_chats.add(chat_id)
        if len(picked) >= limit:
            break
    return picked, lapsed
