"""The store conformance suite: SqliteUpdateStore keeps every rule, and the rules catch broken stores."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from telegram_fence.store import Claim, Identity
from telegram_fence.store.sqlite import SqliteUpdateStore
from telegram_fence.testing import conformance
from telegram_fence.testing.conformance import ManualClock

# --- the suite against SqliteUpdateStore -------------------------------------------------------------

# One test id per rule, with the factory from the ``store_factory`` fixture below.
test_sqlite_store = conformance.pytest_suite()


@pytest.fixture
def store_factory(tmp_path: Path) -> conformance.StoreFactory:
    return conformance.sqlite_factory(tmp_path)


# The direct form (a factory, no fixture), with every commit at synchronous=FULL.
_FULL_DIR = tempfile.TemporaryDirectory(prefix="tf-conformance-")
test_sqlite_store_full_sync = conformance.pytest_suite(
    conformance.sqlite_factory(_FULL_DIR.name, work_synchronous="FULL")
)


def test_every_rule_runs_and_passes_on_sqlite(tmp_path: Path) -> None:
    """Every rule runs against SqliteUpdateStore (none is skipped: Rule.run raises NotApplicable) and passes."""
    for r in conformance.RULES:
        r.run(conformance.sqlite_factory(tmp_path))


def test_check_store_runs_without_pytest(tmp_path: Path) -> None:
    """check_store() works in a process where pytest cannot be imported."""
    code = (
        "import sys; sys.modules['pytest'] = None\n"
        "from telegram_fence.testing import conformance\n"
        f"problems = conformance.check_store(conformance.sqlite_factory({str(tmp_path)!r}))\n"
        "print(len(problems), 'pytest' in sys.modules and sys.modules['pytest'] is not None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["0", "False"]


def test_rules_are_named_and_documented() -> None:
    """Every rule has a unique name and a one-line doc; the probe rules say they need a probe."""
    names = [r.name for r in conformance.RULES]
    assert len(names) == len(set(names))
    assert all((r.check.__doc__ or "").strip().splitlines()[0].endswith(".") for r in conformance.RULES)
    assert conformance.rule("stale_transaction_write_is_absent").needs_probe


def test_unknown_rule_name_lists_the_known_ones() -> None:
    """rule() with an unknown name raises KeyError naming the known rules."""
    with pytest.raises(KeyError, match="owns_only_the_exact_live_identity"):
        conformance.rule("no_such_rule")


def test_manual_clock_only_moves_forward() -> None:
    """ManualClock.advance() moves the time forward and refuses a negative step."""
    clock = ManualClock(100.0)
    assert clock() == 100.0
    assert clock.advance(2.5) == 102.5
    assert clock() == 102.5
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1)


# --- another backend: the protocol's methods, a probe ---------------------------------------------------


class Delegating:
    """Another backend's store as the suite sees it: every call goes to a SQLite store inside, except the methods
    named in ``lacks``; its ``paramstyle`` is one the suite knows no probe for."""

    paramstyle = "numeric"

    def __init__(self, inner: SqliteUpdateStore, lacks: Collection[str] = ()) -> None:
        self._inner = inner
        self._lacks = set(lacks)

    def __getattr__(self, name: str) -> Any:
        if name in self._lacks:
            raise AttributeError(name)
        return getattr(self._inner, name)


def _wrapped(directory: Path, lacks: Collection[str] = ()) -> conformance.StoreFactory:
    make = conformance.sqlite_factory(directory)
    return lambda clock: Delegating(make(clock), lacks)


def test_a_store_lacking_a_method_of_the_protocol_fails_every_rule_naming_it(tmp_path: Path) -> None:
    """A store without ``exchange`` breaks every rule, each report naming the method it lacks; with every method
    it passes."""
    problems = conformance.check_store(_wrapped(tmp_path, lacks=("exchange",)), probe=MarkerProbe())
    assert len(problems) == len(conformance.RULES)
    assert all("lacks exchange" in problem for problem in problems), problems
    assert conformance.check_store(_wrapped(tmp_path), probe=MarkerProbe()) == []


def test_rules_that_write_skip_without_a_probe(tmp_path: Path) -> None:
    """Without a probe for the store's connections, the rules that write through transaction() do not apply, the
    others pass."""
    for r in conformance.RULES:
        if r.needs_probe:
            with pytest.raises(conformance.NotApplicable, match="probe"):
                r.run(_wrapped(tmp_path))
        else:
            r.run(_wrapped(tmp_path))


class MarkerProbe:
    """A probe for the delegating store: writes through the yielded APSW connection, reads through the inner
    store."""

    def __init__(self) -> None:
        self.writes = 0

    def prepare(self, store: Delegating) -> None:
        with store._inner.write() as conn:
            conn.execute("CREATE TABLE marks(key TEXT PRIMARY KEY)")

    def write(self, handle: Any, key: str) -> None:
        self.writes += 1
        handle.execute("INSERT INTO marks VALUES (?)", (key,))

    def exists(self, store: Delegating, key: str) -> bool:
        with store._inner.read() as conn:
            return conn.execute("SELECT 1 FROM marks WHERE key = ?", (key,)).fetchone() is not None


def test_an_explicit_probe_runs_the_write_rules(tmp_path: Path) -> None:
    """With a probe given, the rules that write through transaction() run (and pass) on a store the suite knows no
    probe for."""
    probe = MarkerProbe()
    names = [r for r in conformance.RULES if r.needs_probe]
    for r in names:
        r.run(_wrapped(tmp_path), probe)
    assert probe.writes >= 4  # kept-open, undone, done, fresh; a stale block may not run at all


# --- broken stores: the rules must fail -----------------------------------------------------------

_LIVE_EXACT = "update_id = ? AND attempt = ? AND claim_id = ? AND state = 1 AND due_at > ?"


class OwnsIgnoresClaimId(SqliteUpdateStore):
    """Broken: owns() compares update_id and attempt only."""

    def owns(self, identity: Identity, at: float | None = None) -> bool:
        when = self.clock() if at is None else at
        sql = "SELECT 1 FROM fence_updates WHERE update_id = ? AND attempt = ? AND state = 1 AND due_at > ?"
        with self.read() as conn:
            return conn.execute(sql, (identity.update_id, identity.attempt, when)).fetchone() is not None


class PruneDeletesOpenRows(SqliteUpdateStore):
    """Broken: prune() deletes every row older than the cutoff, whatever its state."""

    def prune(self, settled_before: float) -> int:
        with self.write() as conn:
            conn.execute("DELETE FROM fence_updates WHERE changed_at < ?", (settled_before,))
            return conn.changes()


class TransactionIgnoresClaimId(SqliteUpdateStore):
    """Broken: transaction() accepts any identity whose update has some live claim."""

    @contextmanager
    def transaction(self, identity: Identity, complete: bool = False) -> Iterator[Any]:
        with self.write() as conn:
            now = self.clock()
            row = conn.execute(
                "SELECT attempt, claim_id FROM fence_updates WHERE update_id = ? AND state = 1 AND due_at > ?",
                (identity.update_id, now),
            ).fetchone()
            if row is None:
                from telegram_fence.errors import OwnershipLost

                raise OwnershipLost(identity)
            yield conn
            if complete:
                conn.execute(
                    "UPDATE fence_updates SET state = 2, changed_at = ? WHERE update_id = ?", (now, identity.update_id)
                )


class CursorFollowsTheLastBatch(SqliteUpdateStore):
    """Broken: record() sets the cursor to the batch's offset even when that is lower."""

    def record(self, updates: Any, next_offset: int, **kw: Any) -> int:
        new = super().record(updates, next_offset, **kw)
        with self.write() as conn:
            conn.execute("UPDATE fence_meta SET value = ? WHERE key = 'cursor'", (next_offset,))
        return new


class RecordKeepsTheValidPart(SqliteUpdateStore):
    """Broken: record() drops malformed items and stores the rest of the batch."""

    def record(self, updates: Any, next_offset: int, **kw: Any) -> int:
        valid = [u for u in updates if isinstance(u, dict) and type(u.get("update_id")) is int]
        return super().record(valid, next_offset, **kw)


class AcknowledgeByUpdateId(SqliteUpdateStore):
    """Broken: acknowledge_exhaustion() matches the update_id only."""

    def acknowledge_exhaustion(self, identity: Identity) -> bool:
        with self.write() as conn:
            conn.execute(
                "UPDATE fence_updates SET acknowledged = 1 WHERE update_id = ? AND state = 3 AND acknowledged = 0",
                (identity.update_id,),
            )
            return conn.changes() == 1


class RenewSetsTheLease(SqliteUpdateStore):
    """Broken: renewals set the lease to now + lease, so a short renewal shortens the claim."""

    def renew_many(self, identities: Any, lease: float) -> set[Identity]:
        now = self.clock()
        renewed = set()
        with self.write() as conn:
            for identity in identities:
                sql = f"UPDATE fence_updates SET due_at = ? WHERE {_LIVE_EXACT}"
                conn.execute(sql, (now + lease, identity.update_id, identity.attempt, identity.claim_id, now))
                if conn.changes() == 1:
                    renewed.add(identity)
        return renewed


class IgnoresMaxAttempts(SqliteUpdateStore):
    """Broken: claims ignore max_attempts, so spent updates are claimed forever."""

    def exchange(self, settle: Any, lease: float, limit: int, *, max_attempts: int | None = None, **kw: Any) -> Any:
        return super().exchange(settle, lease, limit, **kw)


class RetryFreesItsChat(SqliteUpdateStore):
    """Broken: an update put back for a retry no longer holds its chat, so the chat's later updates run first."""

    def retry_owned(self, identity: Identity, at: float, error: str) -> bool:
        if not super().retry_owned(identity, at, error):
            return False
        with self.write() as conn:
            conn.execute("UPDATE fence_updates SET chat_id = NULL WHERE update_id = ?", (identity.update_id,))
        return True


BROKEN: list[tuple[type[SqliteUpdateStore], set[str]]] = [
    (OwnsIgnoresClaimId, {"owns_only_the_exact_live_identity", "update_id_reuse_fences_the_old_identity"}),
    (PruneDeletesOpenRows, {"prune_removes_only_finished_rows", "prune_keeps_unacknowledged_exhaustions"}),
    (
        TransactionIgnoresClaimId,
        {
            "transaction_refuses_a_stale_identity",
            "stale_transaction_write_is_absent",
            "reclaim_fences_the_old_identity",
            "update_id_reuse_fences_the_old_identity",
        },
    ),
    (CursorFollowsTheLastBatch, {"cursor_never_moves_backwards"}),
    (RecordKeepsTheValidPart, {"invalid_batch_stores_nothing"}),
    (AcknowledgeByUpdateId, {"acknowledgement_needs_the_full_identity", "prune_keeps_unacknowledged_exhaustions"}),
    (RenewSetsTheLease, {"renewal_needs_the_exact_live_claim"}),
    (IgnoresMaxAttempts, {"spent_attempts_become_an_exhaustion", "exhaustion_listener_hears_spent_attempts",
                          "a_retry_holds_its_chat_until_it_ran_or_was_exhausted"}),
    (RetryFreesItsChat, {"a_retry_holds_its_chat_on_every_claim_path"}),
]


@pytest.mark.parametrize(("broken", "expected"), BROKEN, ids=[cls.__name__ for cls, _ in BROKEN])
def test_broken_store_is_reported(tmp_path: Path, broken: type[SqliteUpdateStore], expected: set[str]) -> None:
    """check_store() reports exactly the rules a deliberately broken store violates."""
    problems = conformance.check_store(conformance_factory(broken, tmp_path))
    reported = {p.split(":", 1)[0] for p in problems}
    assert reported == expected, problems


def conformance_factory(cls: type[SqliteUpdateStore], directory: Path) -> conformance.StoreFactory:
    return lambda clock: cls(directory / f"{cls.__name__}-{uuid.uuid4().hex}.db", clock=clock)


class RacyClaims(SqliteUpdateStore):
    """Broken: a claim reads the oldest due update, then takes it in a second transaction without rechecking.

    Every racer waits at a gate between the read and the write, which makes the race certain.
    """

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.gate = threading.Barrier(conformance.RACERS, timeout=10)

    def exchange(self, settle: Any, lease: float, limit: int, **kw: Any) -> tuple[int, list[Claim], bool]:
        now = self.clock()
        with self.read() as conn:
            row = conn.execute(
                "SELECT update_id FROM fence_updates WHERE state < 2 AND due_at <= ? ORDER BY update_id LIMIT 1", (now,)
            ).fetchone()
        self.gate.wait()
        if row is None:
            return 0, [], False
        with self.write() as conn:
            attempt, claim_id, payload = conn.execute(
                "UPDATE fence_updates SET state = 1, attempt = attempt + 1, claim_id = lower(hex(randomblob(12))), "
                "due_at = ? WHERE update_id = ? RETURNING attempt, claim_id, payload",
                (now + lease, row[0]),
            ).fetchone()
        return 0, [Claim(Identity(row[0], attempt, claim_id), json.loads(payload), None, now + lease)], False


def test_racy_claims_are_reported(tmp_path: Path) -> None:
    """The racing-claims rule reports a store whose claim is a read followed by an unconditional write."""
    rules = [conformance.rule("racing_owned_claims_leave_no_claimer_empty")]
    problems = conformance.check_store(conformance_factory(RacyClaims, tmp_path), rules=rules)
    assert [p.split(":", 1)[0] for p in problems] == [r.name for r in rules]
    assert all("claimed by two racing claimers" in p for p in problems), problems


def test_a_store_that_raises_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    """An unexpected exception from the store fails the rule (with its type) instead of stopping the suite."""

    class Exploding(SqliteUpdateStore):
        def next_offset(self) -> int:
            raise RuntimeError("disk on fire")

    problems = conformance.check_store(
        conformance_factory(Exploding, tmp_path), rules=[conformance.rule("cursor_never_moves_backwards")]
    )
    assert problems == ["cursor_never_moves_backwards: raised RuntimeError: disk on fire"]
