"""Recording a batch on PostgreSQL: the inbox insert with the payload conflicts, the cursor and the generation's
progress in one transaction (``record``), and ``next_offset``.

May import psycopg (through :mod:`.connection`), the standard library, :mod:`telegram_fence.errors`,
:mod:`telegram_fence.updates`, the contract types of :mod:`telegram_fence.store` and its siblings.
Thread safety: as :class:`~.support.StoreSupport`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import psycopg

from ...errors import LeadershipLost
from ...updates import UnreadableUpdate, chat_id_of
from ..values import Unstorable, check_offset, encode, repeated_in_batch, validate
from .connection import translated
from .schema import NOW
from .support import EXHAUSTED, PENDING, SKIPPED, StoreSupport

__all__ = ["RecordHook", "Recording", "differing_sql", "insert_sql"]

log = logging.getLogger("telegram_fence.store.postgres.recording")

RecordHook = Callable[[psycopg.Connection[Any], Sequence[Mapping[str, Any]]], None]


def insert_sql(t: str, only: str = "") -> str:
    """Insert the batch's rows (pending, skipped, or exhaustions) ``only`` when that condition holds; the ids that
    were new."""
    return (f"INSERT INTO {t} (update_id, payload, chat_id, state, recorded_at, changed_at) "
            f"SELECT b.update_id, b.payload, b.chat_id, b.state, {NOW}, {NOW} "
            "FROM unnest(%(ids)s::bigint[], %(payloads)b::text[], %(chats)s::bigint[], %(states)s::smallint[]) "
            f"AS b(update_id, payload, chat_id, state){only} ON CONFLICT (update_id) DO NOTHING RETURNING update_id")


def differing_sql(t: str) -> str:
    """The given ids stored with another payload. Each stored payload is read by primary key in a subquery (a join
    got a generic plan made on an empty table, a sequential scan kept while the table grew)."""
    return ("SELECT b.update_id FROM unnest(%(ids)s::bigint[], %(payloads)b::text[]) AS b(update_id, payload) "
            f"WHERE b.payload <> (SELECT u.payload FROM {t} AS u WHERE u.update_id = b.update_id)")


def _encoded(updates: Sequence[Mapping[str, Any]], ids: Sequence[int],
             skipped: Collection[int]) -> tuple[dict[str, list[Any]], dict[int, str]]:
    """The rows of the batch's first item of each id, payloads encoded, and the ids that cannot be stored as they
    are (kept as exhaustions holding only ``{"update_id": ...}``) with the reason."""
    batch: dict[str, list[Any]] = {"ids": [], "payloads": [], "chats": [], "states": []}
    poisoned: dict[int, str] = {}
    seen: set[int] = set()
    for index, (update, update_id) in enumerate(zip(updates, ids, strict=True)):
        if update_id in seen:
            continue
        seen.add(update_id)
        text = Unstorable(update.reason) if isinstance(update, UnreadableUpdate) else encode(update, index)
        if isinstance(text, Unstorable):
            poisoned[update_id] = text.reason
            text = f'{{"update_id":{update_id}}}'
        batch["ids"].append(update_id)
        batch["payloads"].append(text)
        batch["chats"].append(chat_id_of(update))
        batch["states"].append(EXHAUSTED if update_id in poisoned else SKIPPED if update_id in skipped else PENDING)
    return batch, poisoned


class Recording(StoreSupport):
    """Recording batches of updates with the cursor."""

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
        """Store a batch of raw updates and raise the cursor to ``next_offset``, in one transaction; return how many
        updates were new.

        An ``update_id`` already stored (or repeated in the batch) keeps its first payload; a different one is
        logged as a warning and counted in ``stats()``'s ``payload_conflicts`` (just after the commit). Ids in
        ``skip`` are stored as skipped. ``on_record(conn, new_updates)`` runs in the transaction with the new
        updates to handle; if it raises, nothing is stored. ``generation`` marks that poller generation's progress.
        An update that cannot be stored as it is (too deep, or an :class:`~telegram_fence.updates.UnreadableUpdate`)
        is kept as an unacknowledged exhaustion holding only ``{"update_id": ...}``. ``body`` is accepted and not
        used (the payloads are encoded).

        Raises :class:`~telegram_fence.errors.InvalidUpdate` for a malformed item, and
        :class:`~telegram_fence.errors.LeadershipLost` once this store's poll leadership was acquired and its epoch
        is no longer the database's; nothing is stored then.
        """
        del body
        ids = validate(updates)
        check_offset(next_offset)
        repeated = repeated_in_batch(updates, ids)
        skip = set(skip)
        batch, poisoned = _encoded(updates, ids, skip)
        t, now = self.table, self._now()
        leadership = self._leadership
        guarded = leadership is not None and leadership.acquired_once
        first_of: dict[int, Mapping[str, Any]] = {}
        for update_id, update in zip(ids, updates, strict=True):
            first_of.setdefault(update_id, update)
        firsts = list(first_of.values())
        stamp = self.clock() if generation is not None else None
        params = {**batch, "now": now, "offset": next_offset, "generation": generation, "stamp": stamp,
                  "epoch": leadership.epoch if guarded else None}
        # A deposed leader writes nothing: each write holds only while the leader row (share-locked) has its epoch.
        led = f"EXISTS (SELECT 1 FROM {t}_leader WHERE id = 1 AND epoch = %(epoch)s)" if guarded else "true"
        only = f" WHERE {led}" if guarded else ""
        # What needs the new ids inside the transaction keeps it open; else the commit goes with the statements.
        hold = bool(poisoned) or on_record is not None or (guarded and not leadership.held)
        # Pipeline mode: the statements (their begin, and the commit unless held) go out together.
        with self._joined("record") as conn, translated("record"), conn.pipeline():
            with conn.transaction():
                lead = conn.execute(f"SELECT epoch FROM {t}_leader WHERE id = 1 FOR SHARE") if guarded else None
                inserted = conn.execute(insert_sql(t, only), params) if batch["ids"] else None
                conn.execute(f"INSERT INTO {t}_meta (key, value) SELECT 'cursor', %(offset)s{only} "
                             f"ON CONFLICT (key) DO UPDATE SET value = greatest({t}_meta.value, excluded.value)",
                             params)
                if generation is not None:
                    conn.execute(f"UPDATE {t}_generations SET progress_at = %(stamp)s WHERE generation = "
                                 f"%(generation)s AND {led}", params)
                if hold:
                    new = self._check(lead, inserted)
                    if poisoned:
                        self._keep_poisoned(conn, {u: r for u, r in poisoned.items() if u in new})
                    if on_record is not None:
                        on_record(conn, [u for u in firsts if u["update_id"] in new
                                         and u["update_id"] not in poisoned and u["update_id"] not in skip])
            if not hold:
                new = self._check(lead, inserted)
            old = [(u, p) for u, p in zip(batch["ids"], batch["payloads"], strict=True) if u not in new]
            conflicts = [row[0] for row in conn.execute(differing_sql(t), {
                "ids": [u for u, _ in old], "payloads": [p for _, p in old]})] if old else []
            conflicts += repeated
            for update_id in conflicts:
                log.warning("update %s recorded again with a different payload; the first is kept", update_id,
                            extra={"update_id": update_id})
            if conflicts:
                conn.execute(f"INSERT INTO {t}_meta (key, value) VALUES ('payload_conflicts', %s) "
                             f"ON CONFLICT (key) DO UPDATE SET value = {t}_meta.value + excluded.value",
                             (len(conflicts),))
        return len(new)

    def _check(self, lead: psycopg.Cursor[Any] | None, inserted: psycopg.Cursor[Any] | None) -> set[int]:
        """The ids the insert stored; :class:`LeadershipLost` when the leader row ``lead`` read showed this store's
        leadership lost (its writes were not made)."""
        leadership = self._leadership
        if lead is not None and leadership is not None:
            row = lead.fetchone()
            epoch = None if row is None else int(row[0])
            if not leadership.held or epoch != leadership.epoch:
                raise LeadershipLost(leadership.epoch, epoch)
        return set() if inserted is None else {row[0] for row in inserted}

    def _keep_poisoned(self, conn: psycopg.Connection[Any], reasons: dict[int, str]) -> None:
        """Give the new rows stored as exhaustions (without their payloads) their reasons, and say so."""
        if not reasons:
            return
        conn.execute(f"UPDATE {self.table} AS u SET error = b.error, acknowledged = false "
                     "FROM unnest(%(ids)s::bigint[], %(errors)b::text[]) AS b(update_id, error) "
                     "WHERE u.update_id = b.update_id AND u.state = 3",
                     {"ids": list(reasons), "errors": list(reasons.values())})
        for update_id, reason in reasons.items():
            log.error("update cannot be stored; kept as an exhaustion without its payload",
                      extra={"update_id": update_id, "err": reason})
        self._found_exhaustion()

    def next_offset(self) -> int:
        """The stored cursor (0 when nothing was recorded)."""
        with self._one("next_offset") as conn, translated("next_offset"):
            row = conn.execute(f"SELECT value FROM {self.table}_meta WHERE key = 'cursor'").fetchone()
        return int(row[0]) if row else 0
