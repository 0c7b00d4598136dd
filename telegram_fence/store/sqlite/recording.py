"""Recording a batch: validation, encoding, the inbox insert with the cursor (``record``), and ``next_offset``."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import apsw

from ...errors import InvalidUpdate
from ...updates import UnreadableUpdate, chat_id_of, escape_lone_surrogates
from ..contract import RecordHook
from ..schema import EXHAUSTED, PENDING, SKIPPED
from ..values import Unstorable, check_offset, encode, repeated_in_batch, validate
from . import sql
from .connection import StoreBase, first, one

__all__ = ["Recording", "encode_batch"]

log = logging.getLogger("telegram_fence.store.sqlite.recording")


# A cycle is caught by the per-update retry of encode_batch. NaN and the infinities are written as Python writes
# them; SQLite's reader (JSON5) stores them as null and +-9e999, as store.values.encode does.
_BATCH_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=True, check_circular=False)


def encode_batch(rows: list[list[Any]], updates: Sequence[Mapping[str, Any]]) -> str:
    """The batch as one JSON text that UTF-8 can hold (lone surrogates kept as escapes); :class:`InvalidUpdate`
    naming the first update that is not JSON data or cannot be stored."""
    try:
        return escape_lone_surrogates(_BATCH_ENCODER.encode(rows))
    except (TypeError, ValueError, RecursionError):
        for index, update in enumerate(updates):
            result = encode(update, index)  # raises InvalidUpdate for what is not JSON data
            if isinstance(result, Unstorable):
                raise InvalidUpdate(
                    f"update #{index} of the batch (update_id={update.get('update_id')}) cannot be stored: "
                    f"{result.reason}"
                ) from None
        raise


def _unstorable(update: Mapping[str, Any]) -> str | None:
    """Why ``update`` cannot be stored (:func:`~telegram_fence.store.values.encode`'s reason: its depth bound is
    SQLite's reader's), or ``None`` when it can (or is not JSON data at all)."""
    try:
        text = encode(update)
    except InvalidUpdate:
        return None  # not JSON data: the caller's error, reported as InvalidUpdate
    return text.reason if isinstance(text, Unstorable) else None


class Recording(StoreBase):
    """The inbox write: store a batch and raise the cursor in one transaction."""

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
        """:meth:`~telegram_fence.store.contract.UpdateStore.record`. An ``update_id`` already stored keeps its first
        payload (another one is counted in ``payload_conflicts``); ``body`` must hold exactly ``updates``, in order.
        An update that cannot be stored as it is becomes an exhaustion holding only ``{"update_id": ...}`` and the
        reason. :class:`InvalidUpdate` for a malformed item (nothing stored)."""
        ids = validate(updates)
        check_offset(next_offset)
        repeated = repeated_in_batch(updates, ids)
        now = self.clock()
        skipped = set(skip)
        chats = [chat_id_of(u) for u in updates]
        states = [SKIPPED if i in skipped else PENDING for i in ids]
        # Items the reader could not parse (they carry only their update_id): exhaustions, never handled.
        unreadable = {i: u.reason for i, u in enumerate(updates) if isinstance(u, UnreadableUpdate)}
        if unreadable:
            states = [EXHAUSTED if i in unreadable else state for i, state in enumerate(states)]
            body = None  # the answer's bytes hold what could not be read: its payload must not be stored
        with self._write(self._record_sync) as conn:
            new: list[Mapping[str, Any]] = []
            stored = 0
            if updates:
                rows: list[list[Any]] = [
                    [chat, state, update] for chat, state, update in zip(chats, states, updates, strict=True)
                ]
                existing, conflicts = self._existing(conn, ids, rows, updates)
                fresh: list[int] = []  # positions of the updates this call stores
                seen: set[int] = set()
                for index, update_id in enumerate(ids):
                    if update_id not in existing and update_id not in seen:
                        seen.add(update_id)
                        fresh.append(index)
                inserted = None
                if body is not None and not existing:
                    inserted = self._insert_body(conn, body, rows, ids, now)
                poisoned: set[int] = set()
                if inserted is None or inserted < len(fresh):
                    if inserted is not None:
                        log.warning("the getUpdates answer reads differently in SQLite (a duplicate key?); "
                                    "the parsed updates are stored", extra={"stored_from_body": inserted})
                    # Fills in what the body did not store (rows already there are left alone).
                    poisoned = self._insert_encoded(conn, rows, updates, ids, now)
                for update_id in repeated:  # the batch holds the id again, with another payload: its first is kept
                    log.warning("update %s recorded again with a different payload; the first is kept", update_id,
                                extra={"update_id": update_id})
                conflicts += len(repeated)
                if conflicts:
                    conn.execute(sql.ADD_PAYLOAD_CONFLICTS, (conflicts,))
                for index, reason in unreadable.items():
                    if index in fresh:
                        conn.execute(sql.POISONED, (reason, ids[index]))
                        log.error("update cannot be read; kept as an exhaustion without its payload",
                                  extra={"update_id": ids[index], "err": reason})
                        poisoned.add(ids[index])
                if poisoned:
                    self._found_exhaustion()
                stored = len(fresh)
                # Skipped updates (refused by authorize) never reach the hook: nothing of them is captured;
                # nor do updates that could not be stored.
                new = [updates[i] for i in fresh if states[i] != SKIPPED and ids[i] not in poisoned]
            if on_record is not None:
                on_record(conn, new)
            if next_offset:  # 0 cannot raise the cursor (the webhook intake's case): no write to the meta page
                conn.execute(sql.RAISE_CURSOR, (next_offset,))
            if generation is not None:
                conn.execute(sql.PROGRESS, (now, generation))
            return stored

    @staticmethod
    def _insert_encoded(
        conn: apsw.Connection, rows: list[list[Any]], updates: Sequence[Mapping[str, Any]], ids: list[int],
        now: float,
    ) -> set[int]:
        """Insert ``rows`` encoded from the update dicts; return the ids of those that could not be stored, kept as
        exhaustions. :class:`InvalidUpdate` for an update that is not JSON data (nothing stored)."""
        try:
            conn.execute(sql.INSERT_BATCH, {"batch": encode_batch(rows, updates), "now": now})
            return set()
        except (InvalidUpdate, apsw.SQLError):
            pass
        reasons = {index: reason for index, row in enumerate(rows) if (reason := _unstorable(row[2]))}
        if not reasons:
            conn.execute(sql.INSERT_BATCH, {"batch": encode_batch(rows, updates), "now": now})  # raises its error
        stubs = list(updates)
        for index in reasons:
            stub = {"update_id": ids[index]}
            rows[index] = [rows[index][0], EXHAUSTED, stub]
            stubs[index] = stub
        conn.execute(sql.INSERT_BATCH, {"batch": encode_batch(rows, stubs), "now": now})
        for index, reason in reasons.items():
            conn.execute(sql.POISONED, (reason, ids[index]))
            log.error("update cannot be stored; kept as an exhaustion without its payload",
                      extra={"update_id": ids[index], "err": reason})
        return {ids[index] for index in reasons}

    @staticmethod
    def _insert_body(
        conn: apsw.Connection, body: bytes | str, rows: list[list[Any]], ids: list[int], now: float
    ) -> int | None:
        """Insert the batch taking the payloads from Telegram's answer, each only where SQLite reads the
        ``update_id`` of ``ids`` at its place; return how many rows it stored, ``None`` when SQLite cannot read it."""
        columns = {
            "ids": json.dumps(ids),
            "chats": json.dumps([row[0] for row in rows]),
            "states": json.dumps([row[1] for row in rows]),
            "now": now,
        }
        try:
            columns["body"] = body.decode("utf-8") if isinstance(body, bytes) else body
            conn.execute(sql.INSERT_BODY, columns)
        except (apsw.SQLError, UnicodeDecodeError):  # not UTF-8, or malformed for SQLite: nothing was inserted
            log.debug("getUpdates answer not readable by SQLite; encoding the updates", exc_info=True)
            return None
        return conn.changes()

    @staticmethod
    def _existing(
        conn: apsw.Connection, ids: list[int], rows: list[list[Any]], updates: Sequence[Mapping[str, Any]]
    ) -> tuple[set[int], int]:
        """The batch's ids already stored, and how many of them with another payload (each logged)."""
        (maybe,) = one(conn.execute(sql.ANY_IN_RANGE, (min(ids), max(ids))))
        if not maybe:  # the common case: a fresh batch, no payload comparison
            return set(), 0
        if len(ids) > 1:  # ids stored around the batch's own (out-of-order webhook deliveries): which ones exactly
            (found,) = one(conn.execute(sql.EXISTING_IDS, (json.dumps(ids),)))
            stored = set(json.loads(found))
            if not stored:
                return set(), 0
            picked = [index for index, update_id in enumerate(ids) if update_id in stored]
            rows = [rows[index] for index in picked]  # only the stored ones are compared (and encoded)
            updates = [updates[index] for index in picked]
        try:
            batch = encode_batch(rows, updates)
        except InvalidUpdate:  # an update JSON cannot hold: which ids exist is enough (the insert decides)
            (found,) = one(conn.execute(sql.EXISTING_IDS, (json.dumps(ids),)))
            return set(json.loads(found)), 0
        (found,) = one(conn.execute(sql.EXISTING_IN_BATCH, {"batch": batch}))
        existing = set()
        conflicts = 0
        for update_id, same in json.loads(found):
            if not same and update_id not in existing:
                conflicts += 1
                log.warning(
                    "update %s recorded again with a different payload; the first is kept", update_id,
                    extra={"update_id": update_id},
                )
            existing.add(update_id)
        return existing, conflicts

    def next_offset(self) -> int:
        """The stored cursor (0 when nothing was recorded); the same after reopening the file."""
        with self._read() as conn:
            row = first(conn.execute(sql.READ_CURSOR))
        return int(row[0]) if row else 0

