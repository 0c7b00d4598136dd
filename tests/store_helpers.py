"""Claims through the one claiming call of the store contract, ``exchange``, for tests that need a claim in hand."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from telegram_fence.store import Claim


def claim_one(store: Any, lease: float, *, max_attempts: int | None = None) -> Claim | None:
    """The claim of the oldest claimable update, or ``None`` when none is due."""
    claims = claim_up_to(store, lease, 1, max_attempts=max_attempts)
    return claims[0] if claims else None


def claim_up_to(store: Any, lease: float, limit: int, *, max_attempts: int | None = None,
                known: Mapping[int, Mapping[str, Any]] | None = None) -> list[Claim]:
    """Up to ``limit`` claims, at most one per chat, in ``update_id`` order."""
    return list(store.exchange((), lease, limit, max_attempts=max_attempts, known=known)[1])
