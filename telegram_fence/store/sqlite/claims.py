"""Claiming: ``exchange`` (settle and claim in one transaction), and the exhaustion of updates whose attempts
are spent or whose payloads cannot be decoded, found while claiming.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import apsw

from ..contract import Claim, Identity
from ..values import TOO_DEEP_TO_DECODE, check_claim, check_limit, decode, identities_json, lapsed_reason, new_claim_ids
from . import sql
from .connection import StoreBase, one

__all__ = ["Claims"]

log = logging.getLogger("telegram_fence.store.sqlite.claims")


def _pick(candidates: list[list[Any]], limit: int, max_attempts: int | None) -> tuple[list[Any], list[list[Any]]]:
    """Of due rows ``[update_id, chat_id, attempt, payload or None]`` in ``update_id`` order: those to claim (at most
    ``limit``, one per chat) as ``(update_id, chat_id, next attempt, payload)``, and ``[update_id, reason]`` for each
    row seen whose attempts are spent."""
    picked: list[Any] = []
    lapsed: list[list[Any]] = []
    taken: set[int] = set()
    for update_id, chat_id, attempt, payload in candidates:
        if chat_id is not None and chat_id in taken:
            continue
        if max_attempts is not None and attempt >= max_attempts:
            lapsed.append([update_id, lapsed_reason(attempt, max_attempts)])
            continue
        picked.append((update_id, chat_id, attempt + 1, payload))
        if chat_id is not None:
            taken.add(chat_id)
        if len(picked) >= limit:
            break
    return picked, lapsed


def _first_heads(rows: list[list[Any]], limit: int, max_attempts: int | None) -> list[list[Any]]:
    """Of the rows of ``sql.HEADS`` (any order, maybe repeated): the first ``limit`` in ``update_id`` order, without
    those whose attempts are spent."""
    rows = sorted({row[0]: row for row in rows}.values())[:limit]
    if max_attempts is None:
        return rows
    return [row for row in rows if row[2] < max_attempts]


class Claims(StoreBase):
    """Claims of due updates, one per chat at a time, in ``update_id`` order."""

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
    ) -> tuple[int, list[Claim], bool]:
        """Settle ``settle`` and claim up to ``limit`` due updates in one transaction (see
        :meth:`~telegram_fence.store.contract.UpdateStore.exchange`); with ``chats`` the hinted chats' next updates
        are read by index, without a scan of the backlog."""
        check_limit(limit, 0)
        if limit > 0:
            check_claim(lease, max_attempts)
        settle = list(settle)
        keys = identities_json(settle) if settle else None  # (validated before the transaction opens)
        with self._write(self._work_sync) as conn:
            now = self.clock()
            if limit > 0 and chats is not None and (chats or chatless):  # one statement settles and claims
                claims, more, settled = self._claim_heads(
                    conn, now, now + lease, limit, max_attempts, known, chats, chatless, keys
                )
                return settled, claims, more
            settled = 0
            if keys:
                conn.execute(sql.SETTLE_MANY, {"now": now, "ids": keys})
                settled = conn.changes()
            if limit > 0 and chats is None:
                return (settled, *self._claim_in(conn, now, now + lease, limit, max_attempts, known))
        return settled, [], False

    def _claim_in(
        self,
        conn: apsw.Connection,
        now: float,
        until: float,
        limit: int,
        max_attempts: int | None,
        known: Mapping[int, Mapping[str, Any]] | None,
    ) -> tuple[list[Claim], bool]:
        """The claims of a scan in ``update_id`` order, and whether more may be claimable (``limit`` or the scan
        window cut them off)."""
        with_payload = not known
        scan = limit * 2 + 8
        while True:  # again while every row taken was undecodable (it is exhausted now): the claim goes on
            (found,) = one(conn.execute(sql.CANDIDATES, {"now": now, "scan": scan, "with_payload": with_payload}))
            candidates = decode(found)
            if candidates is None:  # a payload nests too deep for Python: choose without them (decoded one by one)
                (found,) = one(conn.execute(sql.CANDIDATES, {"now": now, "scan": scan, "with_payload": False}))
                candidates = json.loads(found)
            picked, lapsed = _pick(candidates, limit, max_attempts)
            self._exhaust_lapsed(conn, now, lapsed)
            # Cut off: by the limit, by the scan window, or past spent rows (a chat's next row may be due).
            more = len(picked) >= limit or len(candidates) >= scan or bool(lapsed)
            if not picked:
                return [], more
            fresh_ids = new_claim_ids(len(picked))
            conn.execute(sql.TAKE, {
                "chosen": json.dumps([[p[0], claim_id] for p, claim_id in zip(picked, fresh_ids, strict=True)]),
                "until": until, "now": now,
            })
            payloads = self._payloads(conn, now, [(p[0], p[3]) for p in picked], known)
            if payloads:
                return [
                    Claim(Identity(update_id, attempt, claim_id), payloads[update_id], chat_id, until)
                    for (update_id, chat_id, attempt, _payload), claim_id in zip(picked, fresh_ids, strict=True)
                    if update_id in payloads
                ], more

    def _claim_heads(
        self,
        conn: apsw.Connection,
        now: float,
        until: float,
        limit: int,
        max_attempts: int | None,
        known: Mapping[int, Mapping[str, Any]] | None,
        chats: Collection[int],
        chatless: Collection[int],
        settle: str | None = None,
    ) -> tuple[list[Claim], bool, int]:
        """:meth:`_claim_in` limited to ``chats`` (the next row of each) and ``chatless`` updates; the live claims
        among ``settle`` (:func:`~telegram_fence.store.values.identities_json`) are settled in the same statement.
        Also returns how many of them were settled."""
        settling = settle or "[]"
        (found,) = one(conn.execute(sql.HEADS, {
            "now": now, "chats": json.dumps(list(chats)), "chatless": json.dumps(list(chatless)),
            "settle": settling,
        }))
        heads = _first_heads(json.loads(found), limit, max_attempts)
        claim_ids = new_claim_ids(len(heads)) if heads else []
        chosen = json.dumps([[head[0], claim_id] for head, claim_id in zip(heads, claim_ids, strict=True)])
        settled = 0
        if settle:
            conn.execute(sql.SETTLE_AND_TAKE, {"settle": settling, "chosen": chosen, "until": until, "now": now})
            settled = conn.changes() - len(heads)
        elif heads:
            conn.execute(sql.TAKE, {"chosen": chosen, "until": until, "now": now})
        if not heads:
            return [], False, settled
        rows = [(update_id, chat_id, attempt + 1, claim_id)
                for (update_id, chat_id, attempt), claim_id in zip(heads, claim_ids, strict=True)]
        payloads = self._payloads(conn, now, [(row[0], None) for row in rows], known)
        claims = [
            Claim(Identity(update_id, attempt, claim_id), payloads[update_id], chat_id, until)
            for update_id, chat_id, attempt, claim_id in rows
            if update_id in payloads
        ]
        return claims, len(claims) >= limit, settled

    def _payloads(
        self,
        conn: apsw.Connection,
        now: float,
        wanted: list[tuple[int, Any]],
        known: Mapping[int, Mapping[str, Any]] | None,
    ) -> dict[int, Any]:
        """Each wanted update's dict: the one carried along, the caller's copy, or decoded from the file; one that
        nests too deep for Python is left out and becomes an exhaustion."""
        payloads: dict[int, Any] = {}
        missing = []
        for update_id, payload in wanted:
            if payload is None and known is not None:
                payload = known.get(update_id)
            if payload is None:
                missing.append(update_id)
            else:
                payloads[update_id] = payload
        if missing:
            (rows,) = one(conn.execute(sql.PAYLOADS, {"ids": json.dumps(missing)}))
            decoded = decode(rows)
            if decoded is None:  # at least one nests too deep: decode them one by one
                decoded = []
                for update_id in missing:
                    (text,) = one(conn.execute("SELECT payload FROM fence_updates WHERE update_id = ?", (update_id,)))
                    decoded.append([update_id, decode(text)])
            payloads.update((update_id, payload) for update_id, payload in decoded if payload is not None)
            self._exhaust_undecodable(conn, now, [update_id for update_id in missing if update_id not in payloads])
        return payloads

    def _exhaust_undecodable(self, conn: apsw.Connection, now: float, ids: list[int]) -> None:
        """Turn the open rows ``ids``, too deep for Python to decode, into exhaustions without payload."""
        if not ids:
            return
        conn.execute(sql.UNDECODABLE, {"now": now, "ids": json.dumps(ids), "reason": TOO_DEEP_TO_DECODE})
        self._found_exhaustion()
        for update_id in ids:
            log.error("update cannot be decoded; kept as an exhaustion without its payload",
                      extra={"update_id": update_id, "err": TOO_DEEP_TO_DECODE})

    def _exhaust_lapsed(self, conn: apsw.Connection, now: float, lapsed: list[list[Any]]) -> None:
        """Turn updates whose attempts are spent (``[[update_id, reason], ...]``) into exhaustions."""
        if not lapsed:
            return
        conn.execute(sql.EXHAUST_LAPSED, {"now": now, "lapsed": json.dumps(lapsed)})
        self._found_exhaustion()
        for update_id, _reason in lapsed:
            log.error("update exhausted: attempts spent", extra={"update_id": update_id})
