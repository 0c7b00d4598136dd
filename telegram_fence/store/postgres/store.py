"""``PostgresUpdateStore``: the three contract levels of the update store on PostgreSQL.

May import psycopg (through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`,
:mod:`telegram_fence.updates` and the contract types of :mod:`telegram_fence.store`.

The semantics are those of :class:`~telegram_fence.store.sqlite.SqliteUpdateStore` (the conformance
suite checks both); what differs is how they are kept between hosts:

- claims lock their candidate rows ``FOR UPDATE SKIP LOCKED`` (racing claimers never wait for, nor
  take, each other's rows), then take a transaction-scoped advisory lock per chat and check again, on a
  snapshot taken after that lock, that the chat has no live claim: two hosts never hold one chat;
- ``transaction(identity)`` locks the row of the claim before checking it, so no reclaim can commit
  between the check and the commit; every wait for a lock ends after ``lock_timeout`` with
  :class:`~telegram_fence.errors.StoreUnavailable`;
- "now" is the database server's clock unless ``clock=`` is given.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from ...errors import ConfigurationError, InvalidUpdate, OwnershipLost
from ...updates import chat_id_of
from .. import Claim, Exhaustion, Identity, Step
from .connection import translated
from .support import CLAIMED, PENDING, SKIPPED, StoreSupport
from .values import encode_update, identity_arrays, identity_params, lapsed_reason, new_claim_ids, validate_batch

__all__ = ["PostgresUpdateStore"]

log = logging.getLogger("telegram_fence.store")

RecordHook = Callable[[psycopg.Connection[Any], Sequence[Mapping[str, Any]]], None]


class PostgresUpdateStore(StoreSupport):
    """The durable update store (all three capability levels) in PostgreSQL, shareable between hosts.

    ``conninfo_or_pool``: a libpq connection string (the store opens a pool of up to ``pool_size``
    connections and closes it in :meth:`close`) or a ``psycopg_pool.ConnectionPool`` (used as it is,
    left open by :meth:`close`). ``table``: the inbox table; ``{table}_meta``, ``{table}_generations`` and
    ``{table}_leader`` sit beside it (see :func:`~telegram_fence.store.postgres.schema_sql`).
    ``create_table=True`` applies the schema (idempotent, serialised between processes); with ``False``
    the application applies it, and the fenced and durable methods raise
    :class:`~telegram_fence.errors.SchemaError` on a table without the fenced columns.
    ``clock``: ``None`` (every time from the database server) or a ``() -> float`` used instead (tests).
    ``lock_timeout`` bounds every wait for a row lock, ``connect_timeout`` the wait for a connection;
    both end in :class:`~telegram_fence.errors.StoreUnavailable`.

    May be shared between threads (each thread's transaction has its own pooled connection). Never
    raises psycopg exceptions: connection problems are ``StoreUnavailable``, a missing table or column
    ``SchemaError``, anything else the database refuses ``StoreError``.
    """

    #: Store calls made inside :meth:`write` on the same thread join its transaction (as savepoints).
    nests_writes = True
    #: ``write()`` and ``transaction()`` yield a psycopg connection: SQL placeholders are ``%s``.
    paramstyle = "format"

    # --- base level -----------------------------------------------------------------------------

    def record(
        self,
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        *,
        skip: Collection[int] = (),
        generation: int | None = None,
        on_record: RecordHook | None = None,
    ) -> int:
        """Store a batch of raw updates and raise the cursor to ``next_offset``, in one transaction.

        Returns how many updates were new. An ``update_id`` already stored is left as it is (a
        different payload is logged, the first kept). Ids in ``skip`` are stored as skipped.
        ``on_record(conn, new_updates)`` runs inside the same transaction; if it raises, nothing is
        stored. ``generation`` marks that poller generation's progress. The cursor never moves back.
        When this store's poll leadership (:meth:`poll_leadership`) was ever acquired, the batch is
        stored only while that leadership's epoch is still the database's: otherwise
        :class:`~telegram_fence.errors.LeadershipLost` is raised and nothing is stored.

        Raises :class:`InvalidUpdate` (nothing stored, cursor unchanged) for a malformed item.
        """
        return self._record(updates, next_offset, skip, generation, on_record, None)[0]

    def record_and_claim(
        self,
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        *,
        lease: float,
        limit: int,
        run: int = 1,
        skip: Collection[int] = (),
        generation: int | None = None,
        on_record: RecordHook | None = None,
    ) -> tuple[int, list[Claim]]:
        """:meth:`record`, and claim some of the new updates as they are stored, in the same transaction.

        Returns ``(how many were new, the claims)``. A new update is stored claimed (attempt 1, a fresh
        ``claim_id``, leased for ``lease`` seconds) when its chat has no open row in the table: such a
        chat yields its first ``run`` new updates (for a caller that runs them in order, one after
        another); an update without a chat is its own line. At most ``limit``, in batch order; the rest
        is stored pending. No other host can hold a claim in such a chat (it has no open row to claim).
        Raises what :meth:`record` raises, and :class:`ConfigurationError` for a bad ``lease`` or ``limit``.
        """
        self._require_fenced("record_and_claim")
        if lease <= 0:
            raise ConfigurationError(f"lease={lease!r} must be a positive number of seconds")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"limit={limit!r} must be a non-negative integer")
        return self._record(updates, next_offset, skip, generation, on_record, (float(lease), limit, max(1, run)))

    def _record(
        self,
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        skip: Collection[int],
        generation: int | None,
        on_record: RecordHook | None,
        claim: tuple[float, int, int] | None,
    ) -> tuple[int, list[Claim]]:
        ids = validate_batch(updates)
        if not isinstance(next_offset, int) or isinstance(next_offset, bool) or next_offset < 0:
            raise InvalidUpdate(f"next_offset={next_offset!r} must be a non-negative integer; nothing was stored")
        skipped = set(skip)
        positions: dict[int, int] = {}
        for index, update_id in enumerate(ids):
            positions.setdefault(update_id, index)
        order = list(positions.values())
        payloads = [encode_update(updates[i], i) for i in order]
        batch: dict[str, list[Any]] = {
            "ids": [ids[i] for i in order],
            "payloads": payloads,
            "chats": [chat_id_of(updates[i]) for i in order],
            "states": [SKIPPED if ids[i] in skipped else PENDING for i in order],
        }
        now = self._now()
        claims: list[Claim] = []
        with self._tx("record") as conn, translated("record"):
            self._check_leadership(conn)
            new: set[int] = set()
            if order and claim is not None and claim[1] > 0:
                new, claims = self._insert_claiming(conn, batch, [updates[i] for i in order], now, *claim)
            elif order:
                new = {row[0] for row in conn.execute(self._sql.insert_batch, {**batch, "now": now})}
            if len(new) < len(order):
                self._warn_differing(conn, batch, new)
            if on_record is not None:
                on_record(conn, [updates[i] for i in order if ids[i] in new])
            conn.execute(self._sql.raise_cursor, {"offset": next_offset})
            if generation is not None:
                self._progress(conn, generation)
        return len(new), claims

    def _insert_claiming(
        self, conn: psycopg.Connection[Any], batch: dict[str, list[Any]], updates: list[Mapping[str, Any]],
        now: float | None, lease: float, limit: int, run: int,
    ) -> tuple[set[int], list[Claim]]:
        """Insert the batch with the rows of free chats already claimed; the new ids and the claims."""
        chats, states = batch["chats"], batch["states"]
        wanted = list({c for c, state in zip(chats, states, strict=True) if state == PENDING and c is not None})
        blocked = {row[0] for row in conn.execute(self._sql.open_chats, {"chats": wanted})} if wanted else set()
        taken: dict[int, int] = {}
        chosen: list[int] = []
        for index, (chat_id, state) in enumerate(zip(chats, states, strict=True)):
            if state != PENDING:
                continue
            if chat_id is not None:
                if chat_id in blocked:
                    continue
                if taken.get(chat_id, 0) >= run or len(chosen) >= limit:
                    blocked.add(chat_id)  # a later update of this chat must not overtake this one
                    continue
                taken[chat_id] = taken.get(chat_id, 0) + 1
            elif len(chosen) >= limit:
                continue
            chosen.append(index)
        claim_ids: list[str | None] = [None] * len(chats)
        for index, claim_id in zip(chosen, new_claim_ids(len(chosen)), strict=True):
            claim_ids[index] = claim_id
        rows = conn.execute(self._sql.insert_claimed, {
            **batch, "now": now, "lease": lease, "claim_ids": claim_ids,
            "states": [CLAIMED if claim_ids[i] is not None else s for i, s in enumerate(states)],
        }).fetchall()
        new = {row[0] for row in rows}
        until = {row[0]: row[1] for row in rows}
        claims = [
            Claim(Identity(batch["ids"][i], 1, str(claim_ids[i])), updates[i], chats[i], until[batch["ids"][i]])
            for i in chosen if batch["ids"][i] in new
        ]
        return new, claims

    def _warn_differing(self, conn: psycopg.Connection[Any], batch: dict[str, list[Any]], new: set[int]) -> None:
        old = [(u, p) for u, p in zip(batch["ids"], batch["payloads"], strict=True) if u not in new]
        rows = conn.execute(
            self._sql.differing_payloads, {"ids": [u for u, _ in old], "payloads": [p for _, p in old]}
        ).fetchall()
        for (update_id,) in rows:
            log.warning("update recorded again with a different payload; the first is kept",
                        extra={"update_id": update_id})

    def next_offset(self) -> int:
        """The stored cursor (0 when nothing was recorded)."""
        with self._tx("next_offset") as conn, translated("next_offset"):
            row = conn.execute(self._sql.read_cursor).fetchone()
        return int(row[0]) if row else 0

    def claim(self, lease: float) -> Claim | None:
        """Base-level claim: the oldest due update whose chat has no live claim; ``None`` when none is due."""
        with self._tx("claim") as conn, translated("claim"):
            claims = self._claim_in(conn, lease, 1, None, (), None)[0]
        return claims[0] if claims else None

    def renew(self, step: Step, lease: float) -> bool:
        """Extend the live claim of ``step`` (matched on update and attempt only); never shortens it."""
        with self._tx("renew") as conn, translated("renew"):
            cur = conn.execute(self._sql.renew_step, {"u": step.update_id, "a": step.attempt, "lease": lease,
                                                      "now": self._now()})
            return cur.rowcount == 1

    def settle(self, step: Step) -> bool:
        """Mark the live claim of ``step`` handled (matched on update and attempt only)."""
        with self._tx("settle") as conn, translated("settle"):
            cur = conn.execute(self._sql.settle_step, {"u": step.update_id, "a": step.attempt, "now": self._now()})
            return cur.rowcount == 1

    def prune(self, settled_before: float) -> int:
        """Delete settled and skipped rows, and acknowledged exhaustions, last changed before ``settled_before``."""
        with self._tx("prune") as conn, translated("prune"):
            return conn.execute(self._sql.prune, {"before": settled_before}).rowcount

    # --- fenced level ---------------------------------------------------------------------------

    def claim_owned(self, lease: float, *, max_attempts: int | None = None) -> Claim | None:
        """Claim the oldest due update whose chat has no live claim, with a fresh ``claim_id``.

        An update whose attempts are spent (``attempt >= max_attempts``) becomes an unacknowledged
        exhaustion in the same transaction instead of being claimed.
        """
        claims = self.claim_many(lease, 1, max_attempts=max_attempts)
        return claims[0] if claims else None

    def claim_many(
        self,
        lease: float,
        limit: int,
        *,
        max_attempts: int | None = None,
        exclude_chats: Collection[int] = (),
        known: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> list[Claim]:
        """Claim up to ``limit`` due updates in one transaction, at most one per chat (same rules as
        :meth:`claim_owned`); chats in ``exclude_chats`` are passed over; ``known`` maps update ids to
        update dicts the caller holds (their payloads are not read back)."""
        self._require_fenced("claim_many")
        if limit < 1:
            raise ConfigurationError(f"limit={limit!r} must be at least 1")
        with self._tx("claim_many") as conn, translated("claim_many"):
            return self._claim_in(conn, lease, limit, max_attempts, exclude_chats, known)[0]

    def exchange(
        self,
        settle: Iterable[Identity],
        lease: float,
        limit: int,
        *,
        max_attempts: int | None = None,
        known: Mapping[int, Mapping[str, Any]] | None = None,
        chats: Collection[int] | None = None,
        chatless: Collection[int] = (),
        run: int = 1,
    ) -> tuple[int, list[Claim], bool]:
        """Settle ``settle`` and claim up to ``limit`` due updates in ONE transaction.

        Returns ``(how many were still live and got settled, the claims, more)``; ``more`` is ``False``
        when nothing claimable was left out. With ``chats`` (and ``chatless`` update ids) only the next
        update of each of those chats (and those updates) are candidates: the same rules, one index probe
        per chat instead of a scan of the backlog. ``run`` is accepted and treated as 1 (one update per
        chat per claim).
        """
        del run
        self._require_fenced("exchange")
        keys = identity_arrays(settle)
        with self._tx("exchange") as conn, translated("exchange"):
            settled = 0
            if keys["ids"]:
                settled = conn.execute(self._sql.settle_many, {**keys, "now": self._now()}).rowcount
            claims: list[Claim] = []
            more = False
            if limit > 0:
                claims, more = self._claim_in(conn, lease, limit, max_attempts, (), known, chats, chatless)
        return settled, claims, more

    def _claim_in(
        self,
        conn: psycopg.Connection[Any],
        lease: float,
        limit: int,
        max_attempts: int | None,
        exclude_chats: Collection[int],
        known: Mapping[int, Mapping[str, Any]] | None,
        chats: Collection[int] | None = None,
        chatless: Collection[int] = (),
    ) -> tuple[list[Claim], bool]:
        """The claims, and whether more may be claimable (the limit or the scan window cut them off)."""
        if lease <= 0:
            raise ConfigurationError(f"lease={lease!r} must be a positive number of seconds")
        if max_attempts is not None and max_attempts < 1:
            raise ConfigurationError(f"max_attempts={max_attempts!r} must be at least 1")
        now = self._now()
        ns = self._chat_ns
        scan = limit * 2 + 8
        if chats is None:
            params = {"now": now, "scan": scan, "ns": ns, "window": scan * 4 + 64}
            candidates = conn.execute(self._sql.candidates, params).fetchall()
            if len(candidates) < scan:  # the first rows are mostly behind busy chats: look at every chat's head
                seen = {row[0] for row in candidates}
                candidates += [row for row in conn.execute(self._sql.all_heads, params) if row[0] not in seen]
                candidates.sort()
        else:
            candidates = []
            if chats:
                heads = {"now": now, "chats": list(chats), "ns": ns}
                candidates += conn.execute(self._sql.chat_heads, heads).fetchall()
            if chatless:
                candidates += conn.execute(self._sql.chatless, {"now": now, "ids": list(chatless)}).fetchall()
            candidates.sort()
            scan = len(candidates) + 1  # every candidate of the hinted chats was seen
        picked: list[tuple[int, int | None]] = []
        lapsed: list[tuple[int, str]] = []
        taken = set(exclude_chats)
        busy = False  # a candidate whose chat another claimer holds right now
        for update_id, chat_id, attempt, chat_locked in candidates:
            if not chat_locked:
                busy = True
                continue
            if chat_id is not None and chat_id in taken:
                continue
            if max_attempts is not None and attempt >= max_attempts:
                lapsed.append((update_id, lapsed_reason(attempt, max_attempts)))
                continue
            picked.append((update_id, chat_id))
            if chat_id is not None:
                taken.add(chat_id)
            if len(picked) >= limit:
                break
        if lapsed:
            conn.execute(self._sql.exhaust_lapsed, {
                "now": now, "ids": [u for u, _ in lapsed], "reasons": [r for _, r in lapsed],
            })
            for update_id, _reason in lapsed:
                log.error("update exhausted: attempts spent", extra={"update_id": update_id})
        more = len(picked) >= limit or len(candidates) >= scan or bool(lapsed) or busy
        if not picked:
            return [], more
        with_payload = known is None or any(u not in known for u, _ in picked)
        rows = conn.execute(self._sql.take, {
            "now": now, "lease": float(lease), "ids": [u for u, _ in picked],
            "claim_ids": new_claim_ids(len(picked)), "with_payload": with_payload,
        }).fetchall()
        claims = []
        for update_id, chat_id, attempt, claim_id, until, payload in sorted(rows):
            update = known.get(update_id) if known is not None else None
            if update is None:
                update = json.loads(payload)
            claims.append(Claim(Identity(update_id, attempt, claim_id), update, chat_id, until))
        if len(rows) < len(picked):
            more = True
        return claims, more

    def renew_owned(self, identity: Identity, lease: float) -> bool:
        """Extend exactly this live claim to at least now + ``lease``; never shortens it."""
        self._require_fenced("renew_owned")
        with self._tx("renew_owned") as conn, translated("renew_owned"):
            return conn.execute(self._sql.renew_owned, {**identity_params(identity), "lease": lease,
                                                        "now": self._now()}).rowcount == 1

    def owns(self, identity: Identity, at: float | None = None) -> bool:
        """``True`` only for exactly this claim, unexpired at ``at`` (default: now)."""
        self._require_fenced("owns")
        with self._tx("owns") as conn, translated("owns"):
            row = conn.execute(self._sql.owns, {**identity_params(identity), "at": at, "now": self._now()}).fetchone()
        return row is not None

    def settle_owned(self, identity: Identity) -> bool:
        """Mark exactly this live claim handled; ``False`` (nothing changed) when it is not live."""
        self._require_fenced("settle_owned")
        with self._tx("settle_owned") as conn, translated("settle_owned"):
            return conn.execute(self._sql.settle_owned, {**identity_params(identity), "now": self._now()}).rowcount == 1

    def settle_many(self, identities: Iterable[Identity]) -> int:
        """Settle several live claims in one statement; return how many were still live."""
        self._require_fenced("settle_many")
        keys = identity_arrays(identities)
        if not keys["ids"]:
            return 0
        with self._tx("settle_many") as conn, translated("settle_many"):
            return conn.execute(self._sql.settle_many, {**keys, "now": self._now()}).rowcount

    def retry_owned(self, identity: Identity, at: float, error: str) -> bool:
        """Put exactly this live claim back to pending, due at ``at``, keeping ``error``."""
        self._require_fenced("retry_owned")
        with self._tx("retry_owned") as conn, translated("retry_owned"):
            params = {**identity_params(identity), "at": float(at), "error": str(error), "now": self._now()}
            return conn.execute(self._sql.retry_owned, params).rowcount == 1

    @contextmanager
    def transaction(self, identity: Identity, complete: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A transaction that commits only while ``identity`` owns its update; yields the psycopg connection.

        The claim's row is locked (``FOR NO KEY UPDATE``, waiting at most ``lock_timeout``) and then
        checked, so no reclaim can commit before this transaction ends. When ownership is gone the
        transaction is rolled back and :class:`OwnershipLost` is raised before the block runs. With
        ``complete=True`` the update is settled in the same transaction. An exception from the block
        rolls everything back and propagates; a failed commit raises ``StoreUnavailable``.
        """
        self._require_fenced("transaction")
        key = identity_params(identity)
        with self._tx("transaction") as conn:
            with translated("transaction"):
                row = conn.execute(self._sql.lock_owned, {**key, "now": self._now()}).fetchone()
            if row is None:
                raise OwnershipLost(identity, "expired, reclaimed, settled or pruned")
            yield conn
            if complete:
                with translated("transaction"):
                    conn.execute(self._sql.settle_locked, {**key, "now": self._now()})

    # --- durable level --------------------------------------------------------------------------

    def exhaust(self, identity: Identity, error: str) -> bool:
        """Turn exactly this live claim into an unacknowledged exhaustion holding ``error``."""
        self._require_fenced("exhaust")
        with self._tx("exhaust") as conn, translated("exhaust"):
            return conn.execute(self._sql.exhaust_owned, {**identity_params(identity), "error": str(error),
                                                          "now": self._now()}).rowcount == 1

    def due_exhaustions(self, after: Identity | None = None, limit: int = 100) -> list[Exhaustion]:
        """Unacknowledged exhaustions in ``update_id`` order, strictly after ``after`` (a page cursor)."""
        self._require_fenced("due_exhaustions")
        if limit < 1:
            raise ConfigurationError(f"limit={limit!r} must be at least 1")
        start = -1 if after is None else after.update_id
        with self._tx("due_exhaustions") as conn, translated("due_exhaustions"):
            rows = conn.execute(self._sql.due_exhaustions, {"after": start, "limit": limit}).fetchall()
        return [
            Exhaustion(Identity(u, a, c or ""), json.loads(p), chat, err or "", when)
            for u, a, c, p, chat, err, when in rows
        ]

    def acknowledge_exhaustion(self, identity: Identity) -> bool:
        """Make the exhaustion with exactly this identity prunable; ``False`` when there is none."""
        self._require_fenced("acknowledge_exhaustion")
        with self._tx("acknowledge_exhaustion") as conn, translated("acknowledge_exhaustion"):
            return conn.execute(self._sql.acknowledge, {**identity_params(identity), "now": self._now()}).rowcount == 1

