"""The bounds of a claim's ``lease`` and ``max_attempts`` and of an attempt count, alike on both backends and at each
door they come through (a store's claim calls, ``Fence(...)``, the outbox): a value out of range is
refused with a ConfigurationError naming it, before anything is read or written: ``max_attempts`` above
2**63 - 1 (on PostgreSQL every claim would fail on the server, "bigint out of range"), and a NaN or infinite
lease."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_support import BACKENDS, DSN, store_of
from store_helpers import claim_one, claim_up_to, renew_one

from telegram_fence.errors import ConfigurationError

LEASE = 30.0
BAD_MAX_ATTEMPTS = [2**63, 2**70, True, 1.0, 0, -1]
BAD_LEASES = [math.nan, math.inf, -math.inf, 0, True, "30"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with store_of(request.param, tmp_path, "tf_bounds") as opened:
        opened.record([_update(1, 7), _update(2, 8)], 3)
        yield opened


def _update(update_id: int, chat: int) -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "text": "x",
                                                 "chat": {"id": chat, "type": "private"}}}


def _unchanged(store: Any) -> None:
    stats = store.stats()
    assert (stats["pending"], stats["claimed"]) == (2, 0)
    assert store.next_offset() == 3


@pytest.mark.parametrize("bad", BAD_MAX_ATTEMPTS, ids=repr)
def test_a_claim_with_max_attempts_out_of_range_is_refused_by_name(store: Any, bad: Any) -> None:
    """Claims of one and of many refuse a ``max_attempts`` that is no whole number from 1 to
    2**63 - 1 with a ConfigurationError naming it; nothing is claimed."""
    for call in (lambda: claim_one(store, LEASE, max_attempts=bad),
                 lambda: claim_up_to(store, LEASE, 5, max_attempts=bad),
                 lambda: store.exchange([], LEASE, 5, max_attempts=bad)):
        with pytest.raises(ConfigurationError, match=f"max_attempts={bad!r} must be a whole number from 1"):
            call()
    _unchanged(store)


def test_the_largest_max_attempts_claims(store: Any) -> None:
    """``max_attempts`` = 2**63 - 1 (the bound itself) claims on both backends."""
    claims = claim_up_to(store, LEASE, 5, max_attempts=2**63 - 1)
    assert sorted(c.update_id for c in claims) == [1, 2]


@pytest.mark.parametrize("bad", BAD_LEASES, ids=repr)
def test_a_claim_or_record_with_a_lease_out_of_range_is_refused_by_name(store: Any, bad: Any) -> None:
    """A NaN, infinite, non-positive or non-number lease is refused by claims of one and of many, naming it;
    nothing is claimed."""
    calls = [lambda: claim_one(store, bad), lambda: claim_up_to(store, bad, 5)]
    for call in calls:
        with pytest.raises(ConfigurationError, match="lease="):
            call()
    _unchanged(store)


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_fence_given_max_attempts_above_the_bound_is_refused_before_it_opens_anything(
    kind: str, tmp_path: Path,
) -> None:
    """``Fence(bot, db, max_attempts=2**63)`` raises a ConfigurationError naming it, on a SQLite path (no file is
    made) and on a PostgreSQL store (nothing of it changed)."""
    import telebot

    from telegram_fence import Fence

    bot = telebot.TeleBot("1:token", threaded=False)
    if kind == "sqlite":
        path = tmp_path / "bot.db"
        with pytest.raises(ConfigurationError, match="max_attempts=9223372036854775808"):
            Fence(bot, str(path), max_attempts=2**63)
        assert not path.exists()
        return
    with store_of(kind, tmp_path, "tf_bounds") as opened:
        opened.record([_update(1, 7)], 2)
        with pytest.raises(ConfigurationError, match="max_attempts=9223372036854775808"):
            Fence(bot, opened, max_attempts=2**63)
        assert opened.stats()["pending"] == 1 and opened.next_offset() == 2


@pytest.mark.parametrize("bad", [2**63, True, 0], ids=repr)
def test_an_outbox_given_max_attempts_out_of_range_is_refused_by_name(store: Any, bad: Any) -> None:
    """The capture outbox compares its ``max_attempts`` in the store's statements: one out of range is refused when
    it is made, on both backends."""
    from telegram_fence.delivery.outbox import Outbox

    with pytest.raises(ConfigurationError, match=f"max_attempts={bad!r}"):
        Outbox(store, "http://127.0.0.1:9/c", max_attempts=bad)


@pytest.mark.parametrize("bad", [math.inf, math.nan, -math.inf, True, "soon"], ids=repr)
def test_a_retry_due_at_no_finite_time_is_refused_by_name(store: Any, bad: Any) -> None:
    """``retry_owned(identity, at, error)`` with an ``at`` that is no finite time raises a ConfigurationError naming
    it; the claim stays live (before: PostgreSQL stored the update due at NaN or infinity, never due again)."""
    claim = claim_one(store, LEASE)
    assert claim is not None
    with pytest.raises(ConfigurationError, match="at="):
        store.retry_owned(claim.identity, bad, "boom")
    assert store.owns(claim.identity)
    assert store.retry_owned(claim.identity, store.clock() + 5.0, "boom")


@pytest.mark.parametrize("bad", BAD_LEASES, ids=repr)
def test_a_renewal_with_a_lease_out_of_range_is_refused_by_name(store: Any, bad: Any) -> None:
    """``renew_many`` refuses a NaN, infinite, non-positive or non-number
    lease, naming it; the claim keeps its lease (before: PostgreSQL kept a NaN or infinite lease as never ending, so
    a claim whose worker died was never taken again; SQLite failed a NaN with a StoreError)."""
    claim = claim_one(store, LEASE)
    assert claim is not None
    with pytest.raises(ConfigurationError, match="lease="):
        store.renew_many([claim.identity], bad)
    assert store.owns(claim.identity)
    assert not store.owns(claim.identity, at=store.clock() + LEASE + 1)  # the lease ends where it did
    assert renew_one(store, claim.identity, 5.0)


@pytest.mark.parametrize("bad", [0, -1, True, 2**63, 1.5], ids=repr)
def test_a_limit_out_of_range_is_refused_by_name(store: Any, bad: Any) -> None:
    """``exchange`` (0: settle only) and ``due_exhaustions`` refuse a limit that is no whole number up to 2**63 - 1
    alike (before: True claimed one on SQLite and failed on PostgreSQL; 2**63 overflowed the driver)."""
    if bad != 0:
        with pytest.raises(ConfigurationError, match=f"limit={bad!r}"):
            claim_up_to(store, LEASE, bad)
    with pytest.raises(ConfigurationError, match=f"limit={bad!r}"):
        store.due_exhaustions(limit=bad)
    _unchanged(store)


@pytest.mark.skipif(DSN is None, reason="no PostgreSQL")
def test_a_huge_claim_limit_on_postgresql_takes_a_rounds_worth_without_making_its_ids(tmp_path: Path) -> None:
    """A claim with a limit of a million on PostgreSQL, 1,500 updates due: one call claims at most
    MAX_ROUND_CLAIMS (the next claims the rest), and the call allocates far less than a million claim ids (before:
    ~150 MB and over a second per call, whatever was due; a fence with a huge ``batch_size`` paid it every round)."""
    import tracemalloc

    from telegram_fence.store.postgres.claims import MAX_ROUND_CLAIMS

    with store_of("postgres", tmp_path, "tf_bounds") as store:
        store.record([_update(n, 10_000 + n) for n in range(1, 1501)], 1501)
        tracemalloc.start()
        try:
            first = claim_up_to(store, LEASE, 10**6)
            _size, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(first) == MAX_ROUND_CLAIMS
        assert peak < 30 * 2**20, f"{peak / 2**20:.0f} MB traced for one claim call"
        rest = claim_up_to(store, LEASE, 10**6)
        assert sorted(c.update_id for c in first + rest) == list(range(1, 1501))
