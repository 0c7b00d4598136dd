"""Pure decisions of the SQLite store: which updates to store already claimed, and which due rows to claim.

No I/O, no clock, no randomness: each function's answer depends on its arguments only, so each is
tested with tables (``tests/test_store_decisions.py``). The values both backends share (validation,
encoding, identity keys, lapse reasons) are in :mod:`telegram_fence.store.values`. May import ``errors``,
``updates`` and ``store`` (the contract and its values) only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from ..values import lapsed_reason

__all__ = ["choose_inline", "pick_candidates"]

#: One candidate row as the store reads it: ``(update_id, chat_id, attempt, payload or None)``.
Candidate = tuple[int, int | None, int, Any]


def choose_inline(
    ids: Sequence[int],
    chats: Sequence[int | None],
    claimable: Sequence[bool],
    fresh: Sequence[int],
    blocked: Collection[int],
    limit: int,
    run: int,
) -> list[int]:
    """Which of a new batch's updates to store already claimed: their positions, in ``update_id`` order.

    ``ids[i]`` is update ``i``'s id, ``chats[i]`` its chat (``None``: chatless, its own line),
    ``claimable[i]`` whether it would be stored pending (not skipped); ``fresh`` the positions this
    call stores, ``blocked`` the chats with an open row in the file. Updates are taken in
    ``update_id`` order whatever the batch order: a free chat yields its first ``run`` fresh updates
    and none after the first it cannot take (order within a chat is kept); at most ``limit`` are
    chosen.
    """
    stopped: set[int] = set(blocked)
    taken: dict[int, int] = {}
    chosen: list[int] = []
    for index in sorted(fresh, key=ids.__getitem__):
        if not claimable[index]:
            continue
        chat_id = chats[index]
        if chat_id is None:
            if len(chosen) < limit:
                chosen.append(index)
            continue
        if chat_id in stopped:
            continue
        count = taken.get(chat_id, 0)
        if count >= run or len(chosen) >= limit:
            stopped.add(chat_id)  # a later update of this chat must not overtake this one
            continue
        taken[chat_id] = count + 1
        chosen.append(index)
    return chosen


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
