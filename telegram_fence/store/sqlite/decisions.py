"""Pure decisions of the SQLite store: validating a batch, choosing which updates to claim, naming keys.

No I/O, no clock, no randomness: each function's answer depends on its arguments only, so each is
tested with tables (``tests/test_store_decisions.py``). May import ``errors``, ``updates`` and ``store`` (the
contract's data classes) only.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ...errors import InvalidUpdate
from ...updates import escape_lone_surrogates
from ..contract import Identity

__all__ = [
    "MAX_ID",
    "TOO_DEEP_TO_DECODE",
    "choose_inline",
    "decode",
    "key",
    "lapsed_reason",
    "pick_candidates",
    "storable_text",
    "validate",
]

#: The error of an update exhausted because its stored payload nests too deep for Python to decode.
TOO_DEEP_TO_DECODE = "the update nests too deep to be decoded from JSON; its payload was not kept"

#: The largest ``update_id`` (and offset) SQLite's 64-bit integers hold.
MAX_ID = 2**63 - 1

#: One candidate row as the store reads it: ``(update_id, chat_id, attempt, payload or None)``.
Candidate = tuple[int, int | None, int, Any]


def validate(updates: Sequence[Any]) -> list[int]:
    """Each update's id, in order; :class:`InvalidUpdate` naming the first malformed item."""
    if isinstance(updates, (str, bytes)) or not isinstance(updates, Sequence):
        raise InvalidUpdate(f"record() takes a sequence of update dicts, got {type(updates).__name__}")
    checked = []
    for index, update in enumerate(updates):
        if type(update) is dict:  # the common case, checked without the ABC
            update_id = update.get("update_id")
            if type(update_id) is int and 0 <= update_id <= MAX_ID:
                checked.append(update_id)
                continue
        if not isinstance(update, Mapping):
            raise InvalidUpdate(
                f"update #{index} of the batch is a {type(update).__name__}, not a mapping; nothing was stored"
            )
        update_id = update.get("update_id")
        if not isinstance(update_id, int) or isinstance(update_id, bool) or not 0 <= update_id <= MAX_ID:
            raise InvalidUpdate(
                f"update #{index} of the batch has update_id={update_id!r}; a non-negative integer below 2**63 "
                "is required; nothing was stored"
            )
        checked.append(update_id)
    return checked


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


def lapsed_reason(attempt: int, max_attempts: int) -> str:
    """The error kept for an update whose last attempt lost its lease."""
    return f"attempt {attempt} of {max_attempts} lost its lease (the worker died or hung)"


def storable_text(text: object) -> str:
    """``str(text)`` as SQLite can store it (UTF-8): lone surrogates become their ``\\uXXXX`` escapes.

    An error message may quote an update's text, and JSON's ``"\\ud800"`` decodes to a lone surrogate.
    """
    return escape_lone_surrogates(str(text))


def decode(text: str) -> Any | None:
    """``text`` decoded from JSON; ``None`` when it nests deeper than Python's reader goes (from the caller's
    stack: a payload SQLite stored from Telegram's bytes may be one). Raises ``ValueError`` for text that
    is not JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        return None


def key(identity: Identity) -> tuple[int, int, str]:
    """``identity`` as the three values every fenced statement compares; :class:`TypeError` for another type."""
    if not isinstance(identity, Identity):
        raise TypeError(f"expected an Identity(update_id, attempt, claim_id), got {type(identity).__name__}")
    return identity.update_id, identity.attempt, identity.claim_id
