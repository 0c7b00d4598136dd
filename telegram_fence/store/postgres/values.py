"""Identities as the statement parameters of ``PostgresUpdateStore`` (``%(u)s``, ``%(a)s``, ``%(c)s`` and
their arrays).

The values every backend shares (validation, encoding, claim ids, identity keys, lapse reasons, the stats
shape) are in :mod:`telegram_fence.store.values`; the two it names here are re-exported for the mixins.
May import the standard library and :mod:`telegram_fence.store` (its contract and values).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..contract import Identity
from ..values import key, lapsed_reason, new_claim_ids

__all__ = ["identity_arrays", "identity_params", "lapsed_reason", "new_claim_ids"]


def identity_params(identity: Identity) -> dict[str, Any]:
    """``identity`` as the ``u``, ``a``, ``c`` parameters of a fenced statement; :class:`TypeError` for
    another type."""
    update_id, attempt, claim_id = key(identity)
    return {"u": update_id, "a": attempt, "c": claim_id}


def identity_arrays(identities: Iterable[Identity]) -> dict[str, list[Any]]:
    """``identities`` as the ``ids``, ``attempts``, ``claim_ids`` array parameters of a batched statement."""
    keys = [key(identity) for identity in identities]
    return {"ids": [k[0] for k in keys], "attempts": [k[1] for k in keys], "claim_ids": [k[2] for k in keys]}
