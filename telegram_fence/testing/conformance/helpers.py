"""What the rules share: sample updates, stale identities, racing threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...errors import OwnershipLost
from ...store import Identity
from .harness import LEASE, RACE_TIMEOUT, _Harness


def _expect(condition: object, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _update(update_id: int, chat: int | None = None, text: str = "hi") -> dict[str, Any]:
    """A raw Telegram update: a message in ``chat`` (default: its own chat), or with ``chat=-1`` none."""
    if chat == -1:
        return {
            "update_id": update_id,
            "inline_query": {
                "id": str(update_id),
                "from": {"id": 5, "is_bot": False, "first_name": "A"},
                "query": text,
                "offset": "",
            },
        }
    chat_id = 1000 + update_id if chat is None else chat
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 1_700_000_000,
            "chat": {"id": chat_id, "type": "private"},
            "text": text,
        },
    }


def _refuses_stale(ident: Identity, call: Callable[[Identity], object], name: str) -> None:
    """``call`` refuses (returns a false value for) each identity that differs from ``ident`` in exactly one field."""
    for what, other in (("another claim_id", replace(ident, claim_id=ident.claim_id + "0")),
                        ("the next attempt", replace(ident, attempt=ident.attempt + 1)),
                        ("the previous attempt", replace(ident, attempt=ident.attempt - 1)),
                        ("another update_id", replace(ident, update_id=ident.update_id + 1))):
        _expect(not call(other), f"{name} accepted {what} ({other})")


def _claim_one(store: Any, lease: float = LEASE, max_attempts: int | None = None) -> Any:
    """The claim of the oldest claimable update through ``exchange`` (``None`` when none is due)."""
    claims = store.exchange((), lease, 1, max_attempts=max_attempts)[1]
    return claims[0] if claims else None


def _settle(store: Any, identity: Identity) -> bool:
    """Settle exactly this live claim through ``settle_many``; whether it was live."""
    return bool(store.settle_many([identity]) == 1)


def _renew(store: Any, identity: Identity, lease: float) -> bool:
    """Renew exactly this live claim through ``renew_many``; whether it was live."""
    return identity in store.renew_many([identity], lease)


def _drain(store: Any) -> list[int]:
    """Claim and settle until nothing is due; return the update_ids in claim order."""
    seen: list[int] = []
    for _ in range(1000):
        claim = _claim_one(store)
        if claim is None:
            return seen
        seen.append(claim.update_id)
        _settle(store, claim.identity)
    raise AssertionError("exchange() kept returning updates after 1000 claims of a small store")


def _claim_id(h: _Harness, *, lease: float = LEASE, what: str) -> Any:
    claim = _claim_one(h.store, lease)
    _expect(claim is not None, f"exchange() claimed nothing although {what} was due")
    return claim


def _race(count: int, work: Callable[[], Any]) -> list[Any]:
    """Run ``work`` in ``count`` named threads released together by a barrier; return their results."""
    barrier = threading.Barrier(count, timeout=RACE_TIMEOUT)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = work()
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(i,), name=f"conformance-racer-{i}", daemon=True) for i in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RACE_TIMEOUT)
    _expect(not any(t.is_alive() for t in threads), f"racing claims did not finish within {RACE_TIMEOUT:g} s")
    if errors:
        raise AssertionError(f"a racing claim raised {type(errors[0]).__name__}: {errors[0]}") from errors[0]
    return results


def _commits(store: Any, identity: Identity, complete: bool = False, write: Callable[[Any], object] | None = None
             ) -> bool:
    """Whether ``transaction(identity, complete=complete)``, running ``write(handle)`` if given, commits (False: it
    raised OwnershipLost)."""
    try:
        with store.transaction(identity, complete=complete) as handle:
            if write is not None:
                write(handle)
    except OwnershipLost:
        return False
    return True
