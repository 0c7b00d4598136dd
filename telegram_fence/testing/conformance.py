"""The update-store conformance suite: the rules every store backend must keep, runnable with or without pytest.

A backend proves itself by running the rules against fresh stores made by a **factory**::

    factory(clock) -> store

``clock`` is a :class:`ManualClock` (a ``() -> float`` the rules move forward; nothing ever sleeps).
The factory returns a *fresh, empty* store that reads the time only from ``clock`` and may be shared
by several threads at once (the fence's workers share one store). After each rule the suite calls
the store's ``close()`` when it has one. The store speaks the types of :mod:`telegram_fence.store`
(``Claim``, ``Identity``, ``Step``, ``Exhaustion``) and raises ``InvalidUpdate`` and ``OwnershipLost``
from :mod:`telegram_fence.errors`.

Without pytest (like ``trio.testing.check_*``)::

    from telegram_fence.testing import conformance
    problems = conformance.check_store(factory)      # [] when the store conforms
    assert not problems, "\\n".join(problems)

With pytest, one test id per rule (``test_my_store[owns_only_exact_live_identity]`` …)::

    test_my_store = conformance.pytest_suite(factory)

    # or, when the factory needs a fixture such as ``tmp_path``, name no factory and provide a
    # ``store_factory`` fixture:
    test_sqlite_store = conformance.pytest_suite()

    @pytest.fixture
    def store_factory(tmp_path):
        return conformance.sqlite_factory(tmp_path)

Levels: **base** rules run for every store; **fenced** rules when :func:`~telegram_fence.store.is_fenced`
holds; **durable** rules when :func:`~telegram_fence.store.is_durable` holds. A rule above the store's
level is *skipped*, never failed. Each rule has a positive control (the legitimate call succeeds, so the
setup is sound) and a stale-identity control (expiry, reclaim, renewal after loss, pruning and
``update_id`` reuse): a rule that only ever expects ``False`` could not tell a broken store from a
fenced one.

Writes through ``store.transaction()``: two rules check that a write made through the handle the
transaction yields commits (or is absent) together with the ownership decision. The suite cannot know
how to write through another backend's handle, so those rules use a :class:`Probe`: pass one to
``check_store``/``pytest_suite``, or leave it out and a store with a ``write()`` method (such as
``SqliteUpdateStore``) gets :class:`SqlProbe`, which runs qmark SQL through ``handle.execute``
(APSW and ``sqlite3`` handles). Without a probe those two rules are skipped; every other
``transaction`` rule needs none.

Rules raise ``AssertionError`` with a sentence saying what the store did wrong (``assert`` statements
are not used, so ``python -O`` cannot silence them).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from ..errors import InvalidUpdate, OwnershipLost
from ..store import Identity, Step, is_durable, is_fenced

__all__ = [
    "RULES",
    "Level",
    "ManualClock",
    "NotApplicable",
    "Outcome",
    "Probe",
    "Rule",
    "SqlProbe",
    "StoreFactory",
    "assert_conforms",
    "check_store",
    "pytest_suite",
    "rule",
    "run_rules",
    "sqlite_factory",
]

Level = Literal["base", "fenced", "durable"]

#: ``factory(clock) -> store``: a fresh, empty store reading time only from ``clock``.
StoreFactory = Callable[["ManualClock"], Any]

#: The lease every rule claims with, in seconds of the manual clock.
LEASE = 30.0
#: Threads that race for one update in the "exactly one winner" rules, and how many rounds they race.
RACERS = 8
RACE_ROUNDS = 5
#: How long a racing thread may take before the rule gives up (a hung store fails, it does not hang the suite).
RACE_TIMEOUT = 30.0


class ManualClock:
    """A clock that moves only when told to: ``clock()`` returns the current time.

    Thread-safe. Starts at ``start`` (a plausible epoch second, so stores that format times do not trip).
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds`` (never backwards) and return the new time.

        Raises ``ValueError`` for a negative amount.
        """
        if seconds < 0:
            raise ValueError(f"a ManualClock only moves forward; advance({seconds!r}) was asked")
        with self._lock:
            self._now += seconds
            return self._now


class Probe(Protocol):
    """Writes and reads a marker row through a backend's transaction handle (for two transaction rules)."""

    def prepare(self, store: Any) -> None:
        """Create whatever the marker needs (a table); called once on each fresh store before the rule runs."""
        ...

    def write(self, handle: Any, key: str) -> None:
        """Write marker ``key`` through ``handle``, the object ``store.transaction()`` yielded."""
        ...

    def exists(self, store: Any, key: str) -> bool:
        """Whether marker ``key`` is committed (read outside any transaction of the rule)."""
        ...


class SqlProbe:
    """A :class:`Probe` for SQL stores whose ``write()`` and ``transaction()`` yield a handle with
    ``execute(sql, params)`` taking ``?`` placeholders (APSW, ``sqlite3``). Keeps its markers in
    the table ``conformance_marks`` of the store's own database.
    """

    table = "conformance_marks"

    def prepare(self, store: Any) -> None:
        with store.write() as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table}(key TEXT PRIMARY KEY)")

    def write(self, handle: Any, key: str) -> None:
        handle.execute(f"INSERT INTO {self.table}(key) VALUES (?)", (key,))

    def exists(self, store: Any, key: str) -> bool:
        with store.write() as conn:
            return bool(list(conn.execute(f"SELECT 1 FROM {self.table} WHERE key = ?", (key,))))


class NotApplicable(Exception):
    """The rule does not apply to this store: its level is above the store's, or it needs a probe."""


@dataclass(frozen=True)
class Rule:
    """One rule of the contract: ``name`` (a stable test id), the capability ``level`` it needs,
    whether it needs a :class:`Probe`, and the function that checks it.
    """

    name: str
    level: Level
    doc: str
    needs_probe: bool
    check: Callable[[_Harness], None]

    def run(self, factory: StoreFactory, probe: Probe | None = None) -> None:
        """Check this rule against a fresh store from ``factory``.

        Returns when the store keeps the rule; raises ``AssertionError`` (saying what went wrong) when
        it does not, :class:`NotApplicable` when the rule does not apply, and whatever the store raised
        when it raised something unexpected. Closes the store in every case.
        """
        clock = ManualClock()
        store = factory(clock)
        try:
            if self.level == "fenced" and not is_fenced(store):
                raise NotApplicable(f"{type(store).__name__} has no fenced methods")
            if self.level == "durable" and not is_durable(store):
                raise NotApplicable(f"{type(store).__name__} has no durable methods")
            chosen = probe
            if self.needs_probe:
                if chosen is None and callable(getattr(store, "write", None)):
                    chosen = SqlProbe()
                if chosen is None:
                    raise NotApplicable("this rule writes through transaction(); pass a probe to run it")
                chosen.prepare(store)
            self.check(_Harness(store, clock, chosen))
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()

    def __repr__(self) -> str:
        return f"Rule({self.name!r}, level={self.level!r})"


@dataclass(frozen=True)
class Outcome:
    """What one rule found: ``status`` is ``"passed"``, ``"failed"`` or ``"skipped"``; ``message`` says why."""

    rule: str
    status: Literal["passed", "failed", "skipped"]
    message: str = ""


class _Harness:
    """What a rule function works with: the store, its clock, the probe (when the rule needs one)."""

    def __init__(self, store: Any, clock: ManualClock, probe: Probe | None) -> None:
        self.store = store
        self.clock = clock
        self._probe = probe

    @property
    def probe(self) -> Probe:
        if self._probe is None:  # pragma: no cover - Rule.run guarantees it
            raise NotApplicable("no probe")
        return self._probe


# --- helpers the rules use ----------------------------------------------------------------------


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


def _stale(identity: Identity) -> list[tuple[str, Identity]]:
    """Identities that differ from ``identity`` in exactly one field."""
    return [
        ("another claim_id", replace(identity, claim_id=identity.claim_id + "0")),
        ("the next attempt", replace(identity, attempt=identity.attempt + 1)),
        ("the previous attempt", replace(identity, attempt=identity.attempt - 1)),
        ("another update_id", replace(identity, update_id=identity.update_id + 1)),
    ]


def _drain(store: Any, owned: bool) -> list[int]:
    """Claim (and settle) until nothing is due; return the update_ids in claim order."""
    seen = []
    for _ in range(1000):
        claim = store.claim_owned(LEASE) if owned else store.claim(LEASE)
        if claim is None:
            return seen
        seen.append(claim.update_id)
        if owned:
            store.settle_owned(claim.identity)
        else:
            store.settle(claim.step)
    raise AssertionError("claim() kept returning updates after 1000 claims of a small store")


def _claim(h: _Harness, owned: bool, lease: float = LEASE) -> Any:
    return h.store.claim_owned(lease) if owned else h.store.claim(lease)


def _claim_id(h: _Harness, owned: bool, *, lease: float = LEASE, what: str) -> Any:
    claim = _claim(h, owned, lease)
    _expect(claim is not None, f"claim returned None although {what} was due")
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


@contextmanager
def _raises_ownership_lost(what: str) -> Iterator[None]:
    try:
        yield
    except OwnershipLost:
        return
    raise AssertionError(f"transaction() with {what} committed instead of raising OwnershipLost")


# --- the rules ----------------------------------------------------------------------------------

_RULES: list[Rule] = []


def _rule(level: Level, *, probe: bool = False) -> Callable[[Callable[[_Harness], None]], Callable[[_Harness], None]]:
    def register(fn: Callable[[_Harness], None]) -> Callable[[_Harness], None]:
        doc = (fn.__doc__ or "").strip().splitlines()[0]
        _RULES.append(Rule(fn.__name__, level, doc, probe, fn))
        return fn

    return register


# base ---------------------------------------------------------------------------------------------


@_rule("base")
def record_counts_new_updates_and_is_idempotent(h: _Harness) -> None:
    """record() returns how many updates were new; recording them again stores nothing twice."""
    s = h.store
    _expect(s.record([_update(1), _update(2), _update(3)], 4) == 3, "record() of 3 new updates did not return 3")
    got = s.record([_update(2), _update(3), _update(4)], 5)
    _expect(got == 1, f"record() of 2 known and 1 new update returned {got}, not 1")
    _expect(s.record([_update(1)], 5) == 0, "record() of an already recorded update did not return 0")
    seen = _drain(s, owned=False)
    _expect(seen == [1, 2, 3, 4], f"each recorded update must be claimable exactly once, got {seen}")


@_rule("base")
def record_keeps_the_first_payload(h: _Harness) -> None:
    """A different payload for a recorded update_id is not stored: the first payload stays."""
    s = h.store
    _expect(s.record([_update(1, text="first")], 2) == 1, "record() of a new update did not return 1")
    _expect(s.record([_update(1, text="second")], 2) == 0, "a second payload for update 1 was counted as new")
    claim = _claim_id(h, False, what="update 1")
    text = claim.update.get("message", {}).get("text")
    _expect(text == "first", f"the claimed update carries {text!r}; the first payload ('first') must be kept")
    _expect(_claim(h, False) is None, "update 1 was stored twice")


@_rule("base")
def cursor_never_moves_backwards(h: _Harness) -> None:
    """next_offset() starts at 0, rises with record(), and never moves backwards."""
    s = h.store
    _expect(s.next_offset() == 0, f"an empty store's next_offset() is {s.next_offset()}, not 0")
    s.record([_update(1)], 2)
    _expect(s.next_offset() == 2, f"next_offset() is {s.next_offset()} after record(..., 2)")
    s.record([], 10)
    _expect(s.next_offset() == 10, f"next_offset() is {s.next_offset()} after an empty record(..., 10)")
    s.record([_update(3)], 4)
    _expect(s.next_offset() == 10, f"next_offset() moved back to {s.next_offset()} after record(..., 4)")
    s.record([], 0)
    _expect(s.next_offset() == 10, f"next_offset() moved back to {s.next_offset()} after record(..., 0)")
    _expect(s.record([_update(3)], 11) == 0, "an update recorded with an older cursor was lost")
    _expect(s.next_offset() == 11, "the cursor did not rise after it was held back once")


@_rule("base")
def invalid_batch_stores_nothing(h: _Harness) -> None:
    """A batch with any malformed item raises InvalidUpdate and stores nothing; the cursor stays."""
    s = h.store
    s.record([_update(1)], 2)
    bad_items: list[Any] = [
        "not a mapping",
        None,
        {"message": {"text": "no update_id"}},
        {"update_id": "7"},
        {"update_id": 7.0},
        {"update_id": True},
    ]
    for bad in bad_items:
        try:
            s.record([_update(5), bad, _update(6)], 100)
        except InvalidUpdate as exc:
            _expect(str(exc), f"InvalidUpdate for {bad!r} has an empty message")
        else:
            raise AssertionError(f"record() accepted the malformed item {bad!r} instead of raising InvalidUpdate")
        _expect(s.next_offset() == 2, f"a refused batch moved the cursor to {s.next_offset()}")
    _expect(s.record([_update(5), _update(6)], 7) == 2, "a refused batch stored some of its valid updates")
    seen = _drain(s, owned=False)
    _expect(seen == [1, 5, 6], f"after refused batches the store holds {seen}, not [1, 5, 6]")


@_rule("base")
def claims_come_in_update_id_order(h: _Harness) -> None:
    """claim() takes the oldest due update by update_id, whatever the recording order; None when none is due."""
    s = h.store
    _expect(_claim(h, False) is None, "an empty store returned a claim")
    s.record([_update(30), _update(10), _update(20)], 31)
    s.record([_update(5)], 31)
    seen = []
    for _ in range(4):
        seen.append(_claim_id(h, False, what="an update").update_id)
    _expect(seen == [5, 10, 20, 30], f"claims came in the order {seen}, not [5, 10, 20, 30]")
    _expect(_claim(h, False) is None, "a fifth claim returned an update although all four were claimed")


@_rule("base")
def expired_lease_is_reclaimable(h: _Harness) -> None:
    """A live claim blocks its update; once the lease expires the update is claimed again as attempt 2."""
    s = h.store
    s.record([_update(1)], 2)
    start = h.clock()
    first = _claim_id(h, False, what="update 1")
    _expect(first.attempt == 1, f"the first claim has attempt {first.attempt}, not 1")
    _expect(
        abs(first.lease_until - (start + LEASE)) < 1e-6,
        f"lease_until is {first.lease_until}, not now + lease ({start + LEASE})",
    )
    _expect(_claim(h, False) is None, "an update with a live claim was claimed again")
    h.clock.advance(LEASE - 1)
    _expect(_claim(h, False) is None, "an update was claimed again 1 s before its lease ended")
    h.clock.advance(2)
    second = _claim_id(h, False, what="update 1 (its lease expired)")
    _expect(second.update_id == 1 and second.attempt == 2, f"the reclaim is {second.step}, not Step(1, 2)")
    _expect(not s.renew(first.step, LEASE), "renew() of the reclaimed first attempt returned True")
    _expect(not s.settle(first.step), "settle() of the reclaimed first attempt returned True")
    _expect(s.settle(second.step), "settle() of the live second attempt returned False")


@_rule("base")
def renew_extends_and_never_shortens(h: _Harness) -> None:
    """renew() extends a live claim, never shortens it, and fails once the lease has lapsed."""
    s = h.store
    s.record([_update(1)], 2)
    claim = _claim_id(h, False, what="update 1")  # lease ends at t0 + 30
    h.clock.advance(20)
    _expect(s.renew(claim.step, LEASE), "renew() of a live claim returned False")  # now ends at t0 + 50
    h.clock.advance(25)  # t0 + 45
    _expect(_claim(h, False) is None, "the renewed claim was taken by another claim before its new end")
    _expect(s.renew(claim.step, 1), "renew() with a short lease of a live claim returned False")
    h.clock.advance(3)  # t0 + 48: a shortened lease (t0 + 46) would have ended
    _expect(_claim(h, False) is None, "renew() with a shorter lease shortened the claim")
    h.clock.advance(3)  # t0 + 51: the lease ended
    _expect(not s.renew(claim.step, LEASE), "renew() after the lease lapsed returned True")
    again = _claim_id(h, False, what="update 1 (its lease lapsed)")
    _expect(again.attempt == 2, f"the reclaim after a lapsed renewal has attempt {again.attempt}, not 2")


@_rule("base")
def settle_finishes_only_a_live_claim(h: _Harness) -> None:
    """settle() finishes exactly the live step once; a wrong, repeated or expired step changes nothing."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    claim = _claim_id(h, False, what="update 1")
    _expect(not s.settle(Step(1, 2)), "settle() of a step that was never claimed returned True")
    _expect(not s.settle(Step(2, 1)), "settle() of another update's step returned True")
    _expect(s.settle(claim.step), "settle() of the live claim returned False")
    _expect(not s.settle(claim.step), "a second settle() of the same step returned True")
    other = _claim_id(h, False, what="update 2")
    _expect(other.update_id == 2, f"after update 1 was settled the claim took {other.update_id}, not 2")
    h.clock.advance(LEASE + 1)
    _expect(not s.settle(other.step), "settle() of an expired claim returned True")
    again = _claim_id(h, False, what="update 2 (its lease expired)")
    _expect(again.update_id == 2, f"a settled update was claimed again ({again.update_id})")
    _expect(s.settle(again.step), "settle() of the live reclaim returned False")
    h.clock.advance(10 * LEASE)
    _expect(_claim(h, False) is None, "a settled update was claimed again")


def _chat_lines(h: _Harness, owned: bool) -> None:
    s = h.store

    def settle(claim: Any) -> None:
        done = s.settle_owned(claim.identity) if owned else s.settle(claim.step)
        _expect(done, f"settling the live claim of update {claim.update_id} failed")

    # Updates 1 and 2 share chat 7; 3 is in chat 8; 4 and 5 have no chat (each its own line).
    s.record([_update(1, 7), _update(2, 7), _update(3, 8), _update(4, -1), _update(5, -1)], 6)
    first = _claim_id(h, owned, what="update 1")
    others = [_claim_id(h, owned, what="an update of another line") for _ in range(3)]
    order = [first.update_id] + [c.update_id for c in others]
    _expect(order == [1, 3, 4, 5], f"claims took {order}; update 2 shares chat 7 with the live update 1")
    _expect(_claim(h, owned) is None, "update 2 was claimed while update 1 of the same chat was live")
    _expect(first.chat_id == 7, f"the claim of update 1 reports chat {first.chat_id}, not 7")
    for claim in others:
        settle(claim)
    # Stale control: after update 1's lease lapses, update 1 (older) comes back before update 2,
    # and its new claim blocks update 2 again.
    h.clock.advance(LEASE + 1)
    again = _claim_id(h, owned, what="update 1 (expired)")
    _expect(again.update_id == 1, f"after update 1's lease lapsed the claim took {again.update_id}, not 1")
    _expect(_claim(h, owned) is None, "update 2 was claimed while the reclaimed update 1 of the same chat was live")
    settle(again)
    nxt = _claim_id(h, owned, what="update 2 (update 1 is settled)")
    _expect(nxt.update_id == 2, f"after update 1 was settled the claim took {nxt.update_id}, not 2")


@_rule("base")
def one_live_claim_per_chat(h: _Harness) -> None:
    """Two updates of one chat are never claimed at once; an update without a chat is its own line."""
    _chat_lines(h, owned=False)


def _one_winner(h: _Harness, owned: bool) -> None:
    for round_ in range(1, RACE_ROUNDS + 1):
        h.store.record([_update(round_)], round_ + 1)
        results = _race(RACERS, lambda: _claim(h, owned))
        winners = [r for r in results if r is not None]
        _expect(
            len(winners) == 1,
            f"round {round_}: {len(winners)} of {RACERS} threads claiming at once won the single due update",
        )
        _expect(winners[0].update_id == round_, f"round {round_}: the winner claimed update {winners[0].update_id}")
        if owned:
            _expect(h.store.settle_owned(winners[0].identity), f"round {round_}: the winner could not settle")
        else:
            _expect(h.store.settle(winners[0].step), f"round {round_}: the winner could not settle")


@_rule("base")
def racing_claims_have_one_winner(h: _Harness) -> None:
    """8 threads claiming at once: exactly one gets the single due update."""
    _one_winner(h, owned=False)


@_rule("base")
def prune_removes_only_finished_rows(h: _Harness) -> None:
    """prune() deletes settled rows older than the cutoff, never pending, live or lapsed claims."""
    s = h.store
    s.record([_update(1), _update(2), _update(3), _update(4)], 5)
    done = _claim_id(h, False, what="update 1")
    _expect(s.settle(done.step), "settle() of a live claim returned False")
    settled_at = h.clock()
    live = _claim_id(h, False, lease=100 * LEASE, what="update 2")
    lapsed = _claim_id(h, False, lease=LEASE, what="update 3")
    _expect(lapsed.update_id == 3, f"setup: the third claim took update {lapsed.update_id}, not 3")
    h.clock.advance(LEASE + 1)  # update 3's lease lapsed; update 4 never claimed
    _expect(s.prune(settled_at - 1) == 0, "prune() deleted a row settled after the cutoff")
    deleted = s.prune(h.clock() + 1)
    _expect(deleted == 1, f"prune() deleted {deleted} rows; only the one settled row was prunable")
    _expect(s.renew(live.step, LEASE), "prune() removed a live claim (it can no longer be renewed)")
    again = _claim_id(h, False, what="update 3 (its lease lapsed)")
    _expect((again.update_id, again.attempt) == (3, 2), f"after prune() the lapsed update 3 came back as {again.step}")
    pending = _claim_id(h, False, what="update 4 (never claimed)")
    _expect(pending.update_id == 4, f"prune() removed the pending update 4 (claim took {pending.update_id})")
    _expect(s.settle(live.step), "settle() of the live claim failed after prune()")


@_rule("base")
def pruned_update_id_is_new_again(h: _Harness) -> None:
    """After its settled row is pruned, an update_id recorded again is new and claimable from attempt 1."""
    s = h.store
    s.record([_update(1)], 2)
    claim = _claim_id(h, False, what="update 1")
    s.settle(claim.step)
    _expect(s.record([_update(1)], 2) == 0, "a settled, unpruned update was recorded again as new")
    h.clock.advance(1)
    _expect(s.prune(h.clock()) == 1, "prune() did not delete the settled update")
    _expect(s.record([_update(1)], 2) == 1, "after pruning, update 1 recorded again was not new")
    again = _claim_id(h, False, what="the re-recorded update 1")
    _expect((again.update_id, again.attempt) == (1, 1), f"the re-recorded update was claimed as {again.step}")


# fenced -------------------------------------------------------------------------------------------


@_rule("fenced")
def claim_owned_gives_a_fresh_claim_id(h: _Harness) -> None:
    """Every claim_owned() persists a new claim_id: other updates and later attempts never share one."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    a = _claim_id(h, True, what="update 1").identity
    b = _claim_id(h, True, what="update 2").identity
    _expect(isinstance(a.claim_id, str) and a.claim_id, f"claim_id {a.claim_id!r} is not a non-empty str")
    _expect(a.claim_id != b.claim_id, "two claims of different updates got the same claim_id")
    _expect((a.update_id, a.attempt) == (1, 1), f"the first claim is {a}, not update 1 attempt 1")
    _expect(s.owns(a) and s.owns(b), "owns() denied a fresh live claim")
    h.clock.advance(LEASE + 1)
    c = _claim_id(h, True, what="update 1 (expired)").identity
    _expect((c.update_id, c.attempt) == (1, 2), f"the reclaim of update 1 is {c}, not attempt 2")
    _expect(c.claim_id not in (a.claim_id, b.claim_id), "a reclaim reused an earlier claim_id")


@_rule("fenced")
def owns_only_the_exact_live_identity(h: _Harness) -> None:
    """owns() is True only for the exact (update_id, attempt, claim_id) of a claim live at the asked time."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    claim = _claim_id(h, True, what="update 1")
    _claim_id(h, True, what="update 2")
    ident = claim.identity
    _expect(s.owns(ident), "owns() denied the exact live identity")
    _expect(s.owns(ident, claim.lease_until - 1), "owns(at=1 s before the lease ends) returned False")
    for what, other in _stale(ident):
        _expect(not s.owns(other), f"owns() accepted {what} ({other}) for the live claim {ident}")
    _expect(not s.owns(ident, claim.lease_until + 1), "owns(at=after the lease ends) returned True")
    h.clock.advance(LEASE + 1)
    _expect(not s.owns(ident), "owns() accepted an identity whose lease expired")


@_rule("fenced")
def renew_owned_needs_the_exact_live_claim(h: _Harness) -> None:
    """renew_owned() extends exactly the live claim, never shortens it, and fails for any other identity."""
    s = h.store
    s.record([_update(1)], 2)
    claim = _claim_id(h, True, what="update 1")
    ident = claim.identity
    for what, other in _stale(ident):
        _expect(not s.renew_owned(other, 10 * LEASE), f"renew_owned() accepted {what} ({other})")
    _expect(not s.owns(ident, claim.lease_until + 1), "renew_owned() of a wrong identity extended the claim")
    _expect(s.renew_owned(ident, 2 * LEASE), "renew_owned() of the exact live claim returned False")
    _expect(s.owns(ident, claim.lease_until + LEASE - 1), "renew_owned() did not extend the lease")
    _expect(s.renew_owned(ident, 1), "renew_owned() with a short lease of a live claim returned False")
    _expect(s.owns(ident, claim.lease_until + LEASE - 1), "renew_owned() with a shorter lease shortened the claim")


@_rule("fenced")
def renewal_after_loss_fails(h: _Harness) -> None:
    """Once a lease has lapsed, renew_owned() fails and does not revive the claim."""
    s = h.store
    s.record([_update(1)], 2)
    claim = _claim_id(h, True, what="update 1")
    h.clock.advance(LEASE - 1)
    _expect(s.renew_owned(claim.identity, LEASE), "renew_owned() 1 s before the lease ended returned False")
    h.clock.advance(LEASE + 1)
    _expect(not s.renew_owned(claim.identity, LEASE), "renew_owned() after the lease lapsed returned True")
    _expect(not s.owns(claim.identity), "a failed renewal revived the lapsed claim")
    other = _claim_id(h, True, what="update 1 (its lease lapsed)")
    _expect(other.attempt == 2, f"the reclaim after a failed renewal has attempt {other.attempt}, not 2")


@_rule("fenced")
def settle_owned_needs_the_exact_live_claim(h: _Harness) -> None:
    """settle_owned() finishes exactly the live claim once; any other identity changes nothing."""
    s = h.store
    s.record([_update(1)], 2)
    ident = _claim_id(h, True, what="update 1").identity
    for what, other in _stale(ident):
        _expect(not s.settle_owned(other), f"settle_owned() accepted {what} ({other})")
    _expect(s.owns(ident), "a refused settle_owned() ended the live claim")
    _expect(s.settle_owned(ident), "settle_owned() of the exact live claim returned False")
    _expect(not s.owns(ident), "owns() is still True after settle_owned()")
    _expect(not s.settle_owned(ident), "a second settle_owned() returned True")
    h.clock.advance(10 * LEASE)
    _expect(s.claim_owned(LEASE) is None, "a settled update was claimed again")


@_rule("fenced")
def retry_owned_reschedules_the_exact_claim(h: _Harness) -> None:
    """retry_owned() puts exactly the live claim back, due at the given time, as the next attempt."""
    s = h.store
    s.record([_update(1)], 2)
    ident = _claim_id(h, True, what="update 1").identity
    due = h.clock() + 60
    for what, other in _stale(ident):
        _expect(not s.retry_owned(other, due, "boom"), f"retry_owned() accepted {what} ({other})")
    _expect(s.owns(ident), "a refused retry_owned() ended the live claim")
    _expect(s.retry_owned(ident, due, "boom"), "retry_owned() of the exact live claim returned False")
    _expect(not s.owns(ident), "owns() is still True after retry_owned()")
    h.clock.advance(59)
    _expect(s.claim_owned(LEASE) is None, "a retried update was claimed before it was due")
    h.clock.advance(1)
    again = _claim_id(h, True, what="the retried update 1 (now due)").identity
    _expect(again.attempt == 2 and again.claim_id != ident.claim_id, f"the retry was claimed as {again}")
    _expect(not s.retry_owned(ident, due, "late"), "retry_owned() of the earlier attempt returned True")
    _expect(s.owns(again), "a stale retry_owned() ended the new claim")


@_rule("fenced")
def reclaim_fences_the_old_identity(h: _Harness) -> None:
    """After another worker reclaims an expired update, every fenced call with the old identity fails."""
    s = h.store
    s.record([_update(1)], 2)
    old = _claim_id(h, True, what="update 1").identity
    h.clock.advance(LEASE + 1)
    new = _claim_id(h, True, what="update 1 (expired)")
    _expect(not s.owns(old), "owns() accepted the reclaimed identity")
    _expect(not s.renew_owned(old, 10 * LEASE), "renew_owned() accepted the reclaimed identity")
    _expect(not s.settle_owned(old), "settle_owned() accepted the reclaimed identity")
    _expect(not s.retry_owned(old, h.clock(), "stale"), "retry_owned() accepted the reclaimed identity")
    with _raises_ownership_lost("the reclaimed identity"), s.transaction(old):
        pass
    _expect(s.owns(new.identity), "calls with the old identity ended the new claim")
    _expect(not s.owns(new.identity, new.lease_until + 1), "calls with the old identity extended the new claim")
    _expect(s.settle_owned(new.identity), "the new owner could not settle")


@_rule("fenced")
def update_id_reuse_fences_the_old_identity(h: _Harness) -> None:
    """An identity from before a prune never matches the same update_id recorded and claimed again."""
    s = h.store
    s.record([_update(1)], 2)
    old = _claim_id(h, True, what="update 1").identity
    _expect(s.settle_owned(old), "settle_owned() of the live claim returned False")
    h.clock.advance(1)
    _expect(s.prune(h.clock()) == 1, "prune() did not delete the settled update")
    _expect(s.record([_update(1)], 2) == 1, "the pruned update_id recorded again was not new")
    new = _claim_id(h, True, what="the re-recorded update 1").identity
    _expect((new.update_id, new.attempt) == (1, 1), f"the re-recorded update was claimed as {new}")
    _expect(new.claim_id != old.claim_id, "the re-recorded update got the claim_id of the pruned one")
    _expect(not s.owns(old), "owns() accepted an identity from before the prune")
    _expect(not s.renew_owned(old, LEASE), "renew_owned() accepted an identity from before the prune")
    _expect(not s.retry_owned(old, h.clock(), "stale"), "retry_owned() accepted an identity from before the prune")
    _expect(not s.settle_owned(old), "settle_owned() accepted an identity from before the prune")
    with _raises_ownership_lost("an identity from before the prune"), s.transaction(old):
        pass
    _expect(s.owns(new), "calls with the old identity ended the new claim")


@_rule("fenced")
def racing_owned_claims_have_one_winner(h: _Harness) -> None:
    """8 threads calling claim_owned() at once: exactly one gets the single due update."""
    _one_winner(h, owned=True)


@_rule("fenced")
def one_live_owned_claim_per_chat(h: _Harness) -> None:
    """claim_owned() never holds two updates of one chat at once; an update without a chat is its own line."""
    _chat_lines(h, owned=True)


@_rule("fenced")
def transaction_refuses_a_stale_identity(h: _Harness) -> None:
    """transaction() runs for the live owner (complete=True settles) and raises OwnershipLost for any other."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    claim = _claim_id(h, True, what="update 1")
    ident = claim.identity
    ran = []
    with s.transaction(ident):
        ran.append(1)
    _expect(ran == [1], "the block of a live owner's transaction() did not run")
    _expect(s.owns(ident), "transaction() without complete=True ended the claim")
    for what, other in _stale(ident):
        with _raises_ownership_lost(what), s.transaction(other, complete=True):
            pass
    _expect(s.owns(ident), "a refused transaction() ended the live claim")
    with s.transaction(ident, complete=True):
        pass
    _expect(not s.owns(ident), "transaction(complete=True) did not settle the update")
    _expect(not s.settle_owned(ident), "the update was still live after transaction(complete=True)")
    with _raises_ownership_lost("a settled identity"), s.transaction(ident):
        pass
    expiring = _claim_id(h, True, what="update 2").identity
    h.clock.advance(LEASE + 1)
    with _raises_ownership_lost("an expired identity"), s.transaction(expiring, complete=True):
        pass
    again = _claim_id(h, True, what="update 2 (expired)")
    _expect(again.update_id == 2, "an expired transaction(complete=True) settled its update")


@_rule("fenced", probe=True)
def transaction_commits_write_and_settle_together(h: _Harness) -> None:
    """A write through transaction(complete=True) commits with the settlement; an error in the block undoes both."""
    s, probe = h.store, h.probe
    s.record([_update(1)], 2)
    ident = _claim_id(h, True, what="update 1").identity
    with s.transaction(ident) as handle:
        probe.write(handle, "kept-open")
    _expect(probe.exists(s, "kept-open"), "a write through transaction() was not committed")
    _expect(s.owns(ident), "transaction() without complete=True ended the claim")
    try:
        with s.transaction(ident, complete=True) as handle:
            probe.write(handle, "undone")
            raise _BlockFailed
    except _BlockFailed:
        pass
    else:  # pragma: no cover - a store cannot swallow the block's exception silently
        raise AssertionError("transaction() swallowed the exception raised in its block")
    _expect(not probe.exists(s, "undone"), "a write of a block that raised was committed")
    _expect(s.owns(ident), "a block that raised still settled the update")
    with s.transaction(ident, complete=True) as handle:
        probe.write(handle, "done")
    _expect(probe.exists(s, "done"), "the write of transaction(complete=True) was not committed")
    _expect(not s.owns(ident), "transaction(complete=True) committed the write but did not settle")


class _BlockFailed(Exception):
    """Raised inside a transaction block by a rule, to see it roll back."""


@_rule("fenced", probe=True)
def stale_transaction_write_is_absent(h: _Harness) -> None:
    """A stale worker's transaction() raises OwnershipLost and its write is absent; the new owner's commits."""
    s, probe = h.store, h.probe
    s.record([_update(1)], 2)
    old = _claim_id(h, True, what="update 1").identity
    h.clock.advance(LEASE + 1)
    with _raises_ownership_lost("an expired identity"), s.transaction(old, complete=True) as handle:
        probe.write(handle, "expired")
    _expect(not probe.exists(s, "expired"), "the write of an expired attempt was committed")
    new = _claim_id(h, True, what="update 1 (expired)").identity
    with _raises_ownership_lost("a reclaimed identity"), s.transaction(old, complete=True) as handle:
        probe.write(handle, "stale")
    _expect(not probe.exists(s, "stale"), "the write of a stale attempt was committed after the reclaim")
    _expect(s.owns(new), "the stale transaction ended the new owner's claim")
    with s.transaction(new, complete=True) as handle:
        probe.write(handle, "fresh")
    _expect(probe.exists(s, "fresh"), "the new owner's write was not committed")


# durable ------------------------------------------------------------------------------------------


@_rule("durable")
def exhaust_needs_the_exact_live_claim(h: _Harness) -> None:
    """exhaust() turns exactly the live claim into an exhaustion holding the error; it is never claimed again."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    claim = _claim_id(h, True, what="update 1")
    ident = claim.identity
    for what, other in _stale(ident):
        _expect(not s.exhaust(other, "boom"), f"exhaust() accepted {what} ({other})")
    _expect(s.due_exhaustions() == [], "a refused exhaust() left an exhaustion")
    _expect(s.exhaust(ident, "boom"), "exhaust() of the exact live claim returned False")
    due = s.due_exhaustions()
    _expect(len(due) == 1 and due[0].identity == ident, f"due_exhaustions() is {due}, not the exhausted claim")
    _expect(due[0].error == "boom", f"the exhaustion's error is {due[0].error!r}, not 'boom'")
    _expect(due[0].update.get("update_id") == 1, "the exhaustion does not carry its update")
    _expect(not s.owns(ident), "owns() is still True after exhaust()")
    _expect(not s.exhaust(ident, "again"), "a second exhaust() returned True")
    _expect(not s.settle_owned(ident), "settle_owned() of an exhausted claim returned True")
    expiring = _claim_id(h, True, what="update 2").identity
    h.clock.advance(10 * LEASE)
    _expect(not s.exhaust(expiring, "late"), "exhaust() of an expired claim returned True")
    again = _claim_id(h, True, what="update 2 (expired)")
    _expect(again.update_id == 2, f"the claim took update {again.update_id}; exhausted update 1 must stay out")
    _expect(s.claim_owned(LEASE) is None, "an exhausted update was claimed again")


@_rule("durable")
def stale_exhaust_after_reclaim_fails(h: _Harness) -> None:
    """An attempt whose update was reclaimed cannot exhaust it; the new owner can."""
    s = h.store
    s.record([_update(1)], 2)
    old = _claim_id(h, True, what="update 1").identity
    h.clock.advance(LEASE + 1)
    new = _claim_id(h, True, what="update 1 (expired)").identity
    _expect(not s.exhaust(old, "stale"), "exhaust() accepted the reclaimed identity")
    _expect(s.due_exhaustions() == [], "a stale exhaust() left an exhaustion")
    _expect(s.exhaust(new, "fresh"), "the new owner could not exhaust")
    due = s.due_exhaustions()
    _expect([e.identity for e in due] == [new], f"due_exhaustions() is {due}, not the new owner's exhaustion")


@_rule("durable")
def exhaustions_page_in_update_id_order(h: _Harness) -> None:
    """due_exhaustions() pages in update_id order, each page strictly after the last item's identity."""
    s = h.store
    s.record([_update(50), _update(10), _update(40), _update(20), _update(30)], 51)
    identities = {}
    for _ in range(5):
        claim = _claim_id(h, True, what="an update")
        identities[claim.update_id] = claim.identity
        _expect(s.exhaust(claim.identity, f"failed {claim.update_id}"), "exhaust() of a live claim returned False")
    order = [e.identity.update_id for e in s.due_exhaustions()]
    _expect(order == [10, 20, 30, 40, 50], f"due_exhaustions() is in the order {order}")
    pages: list[list[int]] = []
    after = None
    for _ in range(10):
        page = s.due_exhaustions(after=after, limit=2)
        pages.append([e.identity.update_id for e in page])
        if not page:
            break
        _expect(len(page) <= 2, f"due_exhaustions(limit=2) returned {len(page)} items")
        if len(pages) == 1:  # acknowledging an item already seen must not shift later pages
            _expect(s.acknowledge_exhaustion(identities[10]), "acknowledge_exhaustion() of a due exhaustion failed")
        after = page[-1].identity
    _expect(pages == [[10, 20], [30, 40], [50], []], f"paging with limit=2 gave {pages}")
    _expect(
        [e.identity.update_id for e in s.due_exhaustions()] == [20, 30, 40, 50],
        "an acknowledged exhaustion is still due",
    )


@_rule("durable")
def acknowledgement_needs_the_full_identity(h: _Harness) -> None:
    """Only acknowledge_exhaustion() with the exact identity removes an exhaustion from the due list."""
    s = h.store
    s.record([_update(1)], 2)
    ident = _claim_id(h, True, what="update 1").identity
    _expect(not s.acknowledge_exhaustion(ident), "acknowledge_exhaustion() of a live claim returned True")
    _expect(s.exhaust(ident, "boom"), "exhaust() of the live claim returned False")
    for what, other in _stale(ident):
        _expect(not s.acknowledge_exhaustion(other), f"acknowledge_exhaustion() accepted {what} ({other})")
    _expect([e.identity for e in s.due_exhaustions()] == [ident], "a refused acknowledgement removed the exhaustion")
    _expect(s.acknowledge_exhaustion(ident), "acknowledge_exhaustion() of the exact identity returned False")
    _expect(s.due_exhaustions() == [], "an acknowledged exhaustion is still due")
    _expect(not s.acknowledge_exhaustion(ident), "a second acknowledgement returned True")


@_rule("durable")
def prune_keeps_unacknowledged_exhaustions(h: _Harness) -> None:
    """prune() never deletes an unacknowledged exhaustion; once acknowledged it is prunable like a settled row."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    failed = _claim_id(h, True, what="update 1").identity
    done = _claim_id(h, True, what="update 2").identity
    s.exhaust(failed, "boom")
    s.settle_owned(done)
    h.clock.advance(10 * LEASE)
    deleted = s.prune(h.clock() + 1)
    _expect(deleted == 1, f"prune() deleted {deleted} rows; only the settled one was prunable")
    _expect([e.identity for e in s.due_exhaustions()] == [failed], "prune() removed an unacknowledged exhaustion")
    _expect(s.acknowledge_exhaustion(failed), "acknowledge_exhaustion() after prune() failed")
    h.clock.advance(1)
    _expect(s.prune(h.clock() + 1) == 1, "prune() did not delete the acknowledged exhaustion")
    # update_id reuse: the re-recorded update is a new line; the old identity acknowledges nothing.
    _expect(s.record([_update(1)], 3) == 1, "the pruned exhaustion's update_id recorded again was not new")
    new = _claim_id(h, True, what="the re-recorded update 1").identity
    _expect(s.exhaust(new, "again"), "exhaust() of the new claim failed")
    _expect(not s.acknowledge_exhaustion(failed), "the pruned exhaustion's identity acknowledged the new one")
    _expect([e.identity for e in s.due_exhaustions()] == [new], "the new exhaustion is not due")


@_rule("durable")
def spent_attempts_become_an_exhaustion(h: _Harness) -> None:
    """With max_attempts, an update whose last lease lapsed is exhausted by the claim, never claimed again."""
    s = h.store
    s.record([_update(1), _update(2)], 3)
    first = s.claim_owned(LEASE, max_attempts=2)
    _expect(first is not None and first.update_id == 1, "claim_owned(max_attempts=2) did not claim update 1")
    h.clock.advance(LEASE + 1)
    second = s.claim_owned(LEASE, max_attempts=2)
    _expect(second is not None and second.identity.step == Step(1, 2), "update 1 was not reclaimed as attempt 2")
    _expect(s.settle_owned(_claim_id(h, True, what="update 2").identity), "settle_owned() of update 2 failed")
    h.clock.advance(LEASE + 1)
    _expect(s.claim_owned(LEASE, max_attempts=2) is None, "an update was claimed after its attempts were spent")
    due = s.due_exhaustions()
    _expect(
        [e.identity for e in due] == [second.identity],
        f"due_exhaustions() is {[str(e.identity) for e in due]}, not the last attempt {second.identity}",
    )
    _expect(due[0].error, "the exhaustion of a lapsed last attempt has no error text")
    _expect(not s.owns(second.identity), "the exhausted attempt still owns its update")
    _expect(not s.settle_owned(second.identity), "settle_owned() of a lapsed, exhausted attempt returned True")
    h.clock.advance(10 * LEASE)
    _expect(s.claim_owned(LEASE) is None, "an exhausted update was claimed again")
    _expect(s.acknowledge_exhaustion(second.identity), "the exhaustion could not be acknowledged")


#: Every rule, in the order they run: base, then fenced, then durable.
RULES: tuple[Rule, ...] = tuple(sorted(_RULES, key=lambda r: ("base", "fenced", "durable").index(r.level)))

_BY_NAME = {r.name: r for r in RULES}


def rule(name: str) -> Rule:
    """The rule called ``name``; ``KeyError`` naming the known rules when there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no conformance rule {name!r}; known rules: {', '.join(_BY_NAME)}") from None


# --- running ------------------------------------------------------------------------------------


def run_rules(factory: StoreFactory, *, probe: Probe | None = None, rules: Sequence[Rule] = RULES) -> list[Outcome]:
    """Run ``rules`` against fresh stores from ``factory``; one :class:`Outcome` per rule, in order.

    Never raises for a misbehaving store: an unexpected exception is a failed rule.
    """
    outcomes = []
    for r in rules:
        try:
            r.run(factory, probe)
        except NotApplicable as exc:
            outcomes.append(Outcome(r.name, "skipped", str(exc)))
        except AssertionError as exc:
            outcomes.append(Outcome(r.name, "failed", str(exc)))
        except Exception as exc:
            outcomes.append(Outcome(r.name, "failed", f"raised {type(exc).__name__}: {exc}"))
        else:
            outcomes.append(Outcome(r.name, "passed"))
    return outcomes


def check_store(factory: StoreFactory, *, probe: Probe | None = None, rules: Sequence[Rule] = RULES) -> list[str]:
    """The rules the stores from ``factory`` break, as ``"rule_name: what went wrong"``; ``[]`` when they conform.

    Rules above the store's capability level (or needing a probe there is none for) are skipped.
    """
    return [f"{o.rule}: {o.message}" for o in run_rules(factory, probe=probe, rules=rules) if o.status == "failed"]


def assert_conforms(factory: StoreFactory, *, probe: Probe | None = None, rules: Sequence[Rule] = RULES) -> None:
    """Raise ``AssertionError`` listing every broken rule; return quietly when the store conforms."""
    problems = check_store(factory, probe=probe, rules=rules)
    if problems:
        raise AssertionError(f"{len(problems)} conformance rule(s) broken:\n" + "\n".join(problems))


def pytest_suite(
    factory: StoreFactory | None = None, *, probe: Probe | None = None, rules: Sequence[Rule] = RULES
) -> Callable[..., None]:
    """A pytest test function parametrised over ``rules`` (one test id per rule name).

    Assign it to a module-level name starting with ``test``. With ``factory=None`` the test uses a
    fixture called ``store_factory`` (define it, e.g. on ``tmp_path``). Rules that do not apply are
    reported as skipped. Imports pytest when called.
    """
    import pytest

    ids = [r.name for r in rules]

    def _run(conformance_rule: Rule, chosen: StoreFactory) -> None:
        try:
            conformance_rule.run(chosen, probe)
        except NotApplicable as exc:
            pytest.skip(str(exc))

    if factory is not None:
        given = factory

        @pytest.mark.parametrize("conformance_rule", rules, ids=ids)
        def test_store_conformance(conformance_rule: Rule) -> None:
            """The store keeps the conformance rule named in the test id."""
            _run(conformance_rule, given)

        return test_store_conformance

    @pytest.mark.parametrize("conformance_rule", rules, ids=ids)
    def test_store_conformance_with_fixture(conformance_rule: Rule, store_factory: StoreFactory) -> None:
        """The store from the ``store_factory`` fixture keeps the conformance rule named in the test id."""
        _run(conformance_rule, store_factory)

    return test_store_conformance_with_fixture


def sqlite_factory(directory: str | os.PathLike[str], **options: Any) -> StoreFactory:
    """A factory of ``SqliteUpdateStore``\\ s, each in a new, uniquely named file inside ``directory``.

    ``options`` go to ``SqliteUpdateStore`` (``clock`` is the suite's). The files are left for the
    caller to remove with the directory.
    """
    from ..store.sqlite import SqliteUpdateStore

    def make(clock: ManualClock) -> Any:
        name = f"conformance-{uuid.uuid4().hex[:16]}.db"
        return SqliteUpdateStore(os.path.join(os.fspath(directory), name), clock=clock, **options)

    return make
