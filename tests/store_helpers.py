"""Claims, settles and renewals of one claim through the store contract's calls (``exchange``, ``settle_many``,
``renew_many``), for tests that need one in hand."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from telegram_fence.store import Claim, Identity


def claim_one(store: Any, lease: float, *, max_attempts: int | None = None) -> Claim | None:
    """The claim of the oldest claimable update, or ``None`` when none is due."""
    claims = claim_up_to(store, lease, 1, max_attempts=max_attempts)
    return claims[0] if claims else None


def claim_up_to(store: Any, lease: float, limit: int, *, max_attempts: int | None = None,
                known: Mapping[int, Mapping[str, Any]] | None = None) -> list[Claim]:
    """Up to ``limit`` claims, at most one per chat, in ``update_id`` order."""
    return list(store.exchange((), lease, limit, max_attempts=max_attempts, known=known)[1])


def settle_one(store: Any, identity: Identity) -> bool:
    """Settle exactly this live claim (``settle_many`` of one); whether it was live."""
    return bool(store.settle_many([identity]) == 1)


def renew_one(store: Any, identity: Identity, lease: float) -> bool:
    """Renew exactly this live claim (``renew_many`` of one); whether it was live."""
    return identity in store.renew_many([identity], lease)
