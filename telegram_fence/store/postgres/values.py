"""Plain functions of values for ``PostgresUpdateStore``: checking and encoding a batch, claim ids, and
identities as statement parameters.

May import the standard library, :mod:`telegram_fence.errors` and :mod:`telegram_fence.store` (types).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...errors import InvalidUpdate
from ..contract import Identity

__all__ = ["encode_update", "identity_arrays", "identity_params", "lapsed_reason", "new_claim_ids", "validate_batch"]


def encode_update(update: Mapping[str, Any], index: int) -> str:
    try:
        return json.dumps(update, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidUpdate(
            f"update #{index} of the batch (update_id={update.get('update_id')}) cannot be stored as JSON: {exc}; "
            "nothing was stored"
        ) from exc


def validate_batch(updates: Sequence[Any]) -> list[int]:
    """Each update's id, or :class:`InvalidUpdate` naming the first malformed item."""
    if isinstance(updates, (str, bytes)) or not isinstance(updates, Sequence):
        raise InvalidUpdate(f"record() takes a sequence of update dicts, got {type(updates).__name__}")
    checked = []
    for index, update in enumerate(updates):
        if not isinstance(update, Mapping):
            raise InvalidUpdate(
                f"update #{index} of the batch is a {type(update).__name__}, not a mapping; nothing was stored"
            )
        update_id = update.get("update_id")
        if not isinstance(update_id, int) or isinstance(update_id, bool) or update_id < 0:
            raise InvalidUpdate(
                f"update #{index} of the batch has update_id={update_id!r}; a non-negative integer is "
                "required; nothing was stored"
            )
        checked.append(update_id)
    return checked


def new_claim_ids(count: int) -> list[str]:
    """``count`` fresh claim ids (24 hex digits each)."""
    tokens = secrets.token_hex(12 * count)
    return [tokens[i:i + 24] for i in range(0, len(tokens), 24)]


def identity_params(identity: Identity) -> dict[str, Any]:
    if not isinstance(identity, Identity):
        raise TypeError(f"expected an Identity(update_id, attempt, claim_id), got {type(identity).__name__}")
    return {"u": identity.update_id, "a": identity.attempt, "c": identity.claim_id}


def identity_arrays(identities: Iterable[Identity]) -> dict[str, list[Any]]:
    keys = [identity_params(identity) for identity in identities]
    return {
        "ids": [k["u"] for k in keys], "attempts": [k["a"] for k in keys], "claim_ids": [k["c"] for k in keys],
    }


def lapsed_reason(attempt: int, max_attempts: int) -> str:
    return f"attempt {attempt} of {max_attempts} lost its lease (the worker died or hung)"
