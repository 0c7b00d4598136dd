"""Recording a batch on PostgreSQL: validation, encoding, the inbox insert with the cursor, the
claim-at-insert fast path (``record``, ``record_and_claim``) and ``next_offset``.

May import psycopg (through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`,
:mod:`telegram_fence.updates`, the contract types of :mod:`telegram_fence.store` and its siblings.
Thread safety: as :class:`~.support.StoreSupport`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import psycopg

from ...errors import ConfigurationError
from ...updates import UnreadableUpdate
from ..contract import Claim, Identity
from ..values import (
    Unstorable,
    chat_of,
    check_lease,
    check_offset,
    choose_inline,
    encode,
    new_claim_ids,
    repeated_in_batch,
    validate,
)
from .connection import translated
from .record_trip import RecordTrip
from .support import CLAIMED, EXHAUSTED, PENDING, SKIPPED

__all__ = ["RecordHook", "Recording", "encoded", "first_places", "placed", "text_of"]

log = logging.getLogger("telegram_fence.store.postgres.recording")

RecordHook = Callable[[psycopg.Connection[Any], Sequence[Mapping[str, Any]]], None]


#: How Telegram writes a ``getUpdates`` answer around its ``result`` array (compact, ``ok`` first).
_HEAD, _TAIL = '{"ok":true,"result":[', "]}"


def text_of(body: bytes | str) -> str | None:
    """The ``result`` array of the answer, as text: what the server reads the payloads from (without finding
    ``result`` in the whole answer first: ≈ 0.1 to 0.2 ms of the server's time per 100 updates). ``None`` (the
    payloads are encoded instead) when the answer is not UTF-8, holds a NUL character PostgreSQL cannot take, or is
    not written as Telegram writes it (``{"ok":true,"result":[...]}``, nothing around it). The text cut out is the
    answer's array whenever the answer is JSON of that shape; anything else fails to parse on the server, which
    then takes the encoded payloads, and each item's ``update_id`` is checked against its row's anyway."""
    try:
        text = body.decode("utf-8") if isinstance(body, bytes) else body
    except UnicodeDecodeError:
        return None
    if "\x00" in text or not (text.startswith(_HEAD) and text.endswith(_TAIL)):
        return None
    return text[len(_HEAD) - 1:-1]


def first_places(ids: Sequence[int]) -> list[int]:
    """The index of each id's first item in a batch whose ids are ``ids``, in batch order (the store keeps the
    first)."""
    positions: dict[int, int] = {}
    for index, update_id in enumerate(ids):
        positions.setdefault(update_id, index)
    return list(positions.values())


def placed(updates: Sequence[Mapping[str, Any]], ids: Sequence[int], order: list[int],
            skipped: Collection[int]) -> dict[str, list[Any]]:
    """The rows of the items at ``order`` for a record whose payloads the server takes from the answer's body."""
    return {"ids": [ids[i] for i in order], "positions": [i + 1 for i in order],
            "chats": [chat_of(updates[i]) for i in order],
            "states": [SKIPPED if ids[i] in skipped else PENDING for i in order]}


def encoded(updates: Sequence[Mapping[str, Any]], ids: Sequence[int], order: list[int],
             skipped: Collection[int]) -> tuple[dict[str, list[Any]], dict[int, str]]:
    """The rows of the items at ``order`` with their payloads encoded, and the ids that cannot be stored as they
    are (kept as exhaustions holding only ``{"update_id": ...}``) with the reason."""
    batch: dict[str, list[Any]] = {"ids": [], "payloads": [], "chats": [], "states": []}
    poisoned: dict[int, str] = {}  # update_id -> why it is kept as an exhaustion without its payload
    for index in order:
        update, update_id = updates[index], ids[index]
        text = Unstorable(update.reason) if isinstance(update, UnreadableUpdate) else encode(update, index)
        if isinstance(text, Unstorable):
            poisoned[update_id] = text.reason
            text = f'{{"update_id":{update_id}}}'
        batch["ids"].append(update_id)
        batch["payloads"].append(text)
        batch["chats"].append(chat_of(update))
        batch["states"].append(EXHAUSTED if update_id in poisoned else SKIPPED if update_id in skipped else PENDING)
    return batch, poisoned


class Recording(RecordTrip):
    """Recording batches of updates with the cursor, claiming some of them as they are stored."""

    def record(
        self,
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        *,
        skip: Collection[int] = (),
        generation: int | None = None,
        on_record: RecordHook | None = None,
        body: bytes | str | None = None,
    ) -> int:
        """Store a batch of raw updates and raise the cursor to ``next_offset``, in one transaction.

        Returns how many updates were new. An ``update_id`` already stored is left as it is; when its
        payload differs, the first is kept, a warning naming the id is logged and ``stats()``'s
        ``payload_conflicts`` counts it; so is an id the batch itself holds again with another payload (the
        batch's first is stored). Ids in ``skip`` are stored as skipped.
        ``on_record(conn, new_updates)`` runs inside the same transaction with the new updates that
        will be handled (not the skipped ones, nor those kept as exhaustions); if it raises, nothing
        is stored. ``generation`` marks that poller generation's progress. The cursor never moves back.
        When this store's poll leadership (:meth:`poll_leadership`) was ever acquired, the batch is
        stored only while that leadership's epoch is still the database's: otherwise
        :class:`~telegram_fence.errors.LeadershipLost` is raised and nothing is stored.

        Values are checked and encoded by :mod:`telegram_fence.store.values`, as on every backend: an update
        that is JSON data but cannot be stored (nesting deeper than it allows) and an
        :class:`~telegram_fence.updates.UnreadableUpdate` do not block the batch: each is stored as an
        unacknowledged exhaustion holding only ``{"update_id": ...}`` and the reason.

        Raises :class:`~telegram_fence.errors.InvalidUpdate` (nothing stored, cursor unchanged) for a
        malformed item: no ``update_id`` (a non-negative integer below 2**63), or not JSON data at all.

        ``body`` is the ``getUpdates`` answer ``updates`` were decoded from, byte for byte
        (``{"ok":true,"result":[...]}``), when the caller has it: it must hold exactly ``updates``, in order. The
        payloads of a batch none of whose ids is stored yet are then the answer's own texts, taken from it by the
        server, instead of being encoded again; any other batch (and one whose answer the server cannot read, or
        that holds an :class:`~telegram_fence.updates.UnreadableUpdate`) is encoded as without ``body``.
        """
        return self._record(updates, next_offset, skip, generation, on_record, None, body)[0]

    #: :meth:`record` and :meth:`record_and_claim` take ``body=`` (the poller checks before passing it).
    accepts_body = True

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
        body: bytes | str | None = None,
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
        check_lease(lease)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"limit={limit!r} must be a non-negative integer")
        return self._record(updates, next_offset, skip, generation, on_record, (float(lease), limit, max(1, run)),
                            body)

    def _record(
        self,
        updates: Sequence[Mapping[str, Any]],
        next_offset: int,
        skip: Collection[int],
        generation: int | None,
        on_record: RecordHook | None,
        claim: tuple[float, int, int] | None,
        body: bytes | str | None = None,
    ) -> tuple[int, list[Claim]]:
        ids = validate(updates)
        check_offset(next_offset)
        repeated = repeated_in_batch(updates, ids)
        skipped = set(skip)
        order = first_places(ids)
        leadership = self._leadership
        one_trip = bool(self._fenced and on_record is None and order
                        and (leadership is None or not leadership.acquired_once or leadership.held))
        answer = text_of(body) if one_trip and body is not None else None
        if answer is not None and not any(isinstance(u, UnreadableUpdate) for u in updates):
            # The payloads as Telegram sent them, read by the server from its answer: nothing to encode.
            from_body = placed(updates, ids, order, skipped)
            with translated("record"):
                trip = self._record_trip(from_body, [updates[i] for i in order], next_offset, generation,
                                         len(repeated), claim, answer)
            if trip is not None:
                self._warn_conflicts(list(repeated))
                return len(trip.new), trip.claims
        batch, poisoned = encoded(updates, ids, order, skipped)
        if one_trip and not poisoned:
            # The common batch: every write of the record (and the claims) in one statement, one round trip.
            with translated("record"):
                trip = self._record_trip(batch, [updates[i] for i in order], next_offset, generation, len(repeated),
                                         claim)
            assert trip is not None  # (None only for a record from the answer's body)
            self._warn_conflicts(trip.differing + list(repeated))
            return len(trip.new), trip.claims
        now = self._now()
        claims: list[Claim] = []
        if (claim is None and on_record is None and not poisoned and order
                and (leadership is None or not leadership.acquired_once)):
            # The plain batch: insert, count payload conflicts, raise the cursor (and mark the generation's
            # progress) in ONE statement, its own transaction: one round trip.
            params = {**batch, "now": now, "offset": next_offset, "generation": generation,
                      "stamp": self._stamp() if generation is not None else None}
            with self._one("record") as conn, translated("record"):
                rows = conn.execute(self._sql.record_batch(self._support), params).fetchall()
                conflicts = [u for kind, u in rows if kind == 1] + list(repeated)
                if repeated:
                    conn.execute(self._sql.add_payload_conflicts, {"count": len(repeated)})
            for update_id in conflicts:
                log.warning("update %s recorded again with a different payload; the first is kept", update_id,
                            extra={"update_id": update_id})
            return sum(1 for kind, _u in rows if kind == 0), claims
        with self._tx("record") as conn, translated("record"):
            self._check_leadership(conn)
            new: set[int] = set()
            if order and claim is not None and claim[1] > 0:
                new, claims = self._insert_claiming(conn, batch, [updates[i] for i in order], now, *claim)
            elif order:
                new = {row[0] for row in conn.execute(self._sql.insert_batch, {**batch, "now": now})}
            if len(new) < len(order):
                self._count_differing(conn, batch, new)
            if repeated:
                self._count_conflicts(conn, repeated)
            if poisoned:
                self._keep_poisoned(conn, {u: r for u, r in poisoned.items() if u in new}, now)
            if on_record is not None:
                on_record(conn, [
                    updates[i] for i in order if ids[i] in new and ids[i] not in poisoned and ids[i] not in skipped
                ])
            conn.execute(self._sql.raise_cursor, {"offset": next_offset})
            if generation is not None:
                self._progress(conn, generation)
        return len(new), claims

    @staticmethod
    def _warn_conflicts(ids: list[int]) -> None:
        """Warn about (naming each id) updates that came again with another payload (already counted)."""
        for update_id in ids:
            log.warning("update %s recorded again with a different payload; the first is kept", update_id,
                        extra={"update_id": update_id})

    def _insert_claiming(
        self, conn: psycopg.Connection[Any], batch: dict[str, list[Any]], updates: list[Mapping[str, Any]],
        now: float | None, lease: float, limit: int, run: int,
    ) -> tuple[set[int], list[Claim]]:
        """Insert the batch with the rows of free chats already claimed; the new ids and the claims.

        Which rows: :func:`~telegram_fence.store.values.choose_inline` (as on every backend: in ``update_id``
        order whatever the batch order), with the chats that have an open row in the table as blocked."""
        chats, states = batch["chats"], batch["states"]
        wanted = list({c for c, state in zip(chats, states, strict=True) if state == PENDING and c is not None})
        blocked = {row[0] for row in conn.execute(self._sql.open_chats, {"chats": wanted})} if wanted else set()
        chosen = choose_inline(
            batch["ids"], chats, [state == PENDING for state in states], range(len(chats)), blocked, limit, run
        )
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

    def _count_differing(self, conn: psycopg.Connection[Any], batch: dict[str, list[Any]], new: set[int]) -> None:
        """Warn about (naming each id) and count the batch's updates stored before with another payload."""
        old = [(u, p) for u, p in zip(batch["ids"], batch["payloads"], strict=True) if u not in new]
        rows = conn.execute(
            self._sql.differing_payloads, {"ids": [u for u, _ in old], "payloads": [p for _, p in old]}
        ).fetchall()
        self._count_conflicts(conn, [update_id for (update_id,) in rows])

    def _count_conflicts(self, conn: psycopg.Connection[Any], ids: list[int]) -> None:
        """Warn about (naming each id) and count updates that came again with another payload (stored before, or
        earlier in the same batch)."""
        for update_id in ids:
            log.warning("update %s recorded again with a different payload; the first is kept", update_id,
                        extra={"update_id": update_id})
        if ids:
            conn.execute(self._sql.add_payload_conflicts, {"count": len(ids)})

    def _keep_poisoned(self, conn: psycopg.Connection[Any], reasons: dict[int, str], now: float | None) -> None:
        """Give the new rows stored as exhaustions (without their payloads) their reasons, and say so."""
        if not reasons:
            return
        if self._fenced:
            conn.execute(self._sql.poisoned, {"ids": list(reasons), "errors": list(reasons.values())})
        for update_id, reason in reasons.items():
            log.error("update cannot be stored; kept as an exhaustion without its payload",
                      extra={"update_id": update_id, "err": reason})
        self._found_exhaustion(conn)

    def next_offset(self) -> int:
        """The stored cursor (0 when nothing was recorded)."""
        with self._one("next_offset") as conn, translated("next_offset"):
            row = conn.execute(self._sql.read_cursor).fetchone()
        return int(row[0]) if row else 0
