"""The round of ``PostgresUpdateStore``: settle, lock, claim and commit in one transaction, the statements of
:func:`~.round_sql.round_parts`; the fast path of ``exchange``.

What it cannot finish it hands back to the caller as ``waiting`` (every due row was held by another claimer: the
caller's claim waits for one of them and looks again). May import psycopg
(through :mod:`.connection`), the standard library, :mod:`telegram_fence.store` (contract and values) and its
siblings. Thread safety: as :class:`~.support.StoreSupport`.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

import psycopg

from ..contract import Claim, Identity
from ..values import TOO_DEEP_TO_DECODE, decode, lapsed_reason, new_claim_ids
from .round_sql import round_parts
from .support import StoreSupport

__all__ = ["RoundResult", "Rounds"]

log = logging.getLogger("telegram_fence.store.postgres.rounds")

#: Rows a claim locks beyond its limit (see :mod:`.claims`).
SPARE = 4
#: The same for a lean round (:func:`~.round_sql.round_parts`). A spare helps only when a locked row's chat lock
#: is held by another claimer, which then holds ANOTHER row of that chat (the row lock excludes the same row): the
#: two saw the chat on snapshots that differ (a settle or claim of the chat committed between them), which is
#: rare; and a lean round that claims nothing is followed by a full one. Each spare costs the server a row lock.
LEAN_SPARE = 1
#: A round of its own that settles nothing (a claim) commits without waiting for the WAL flush. A server crash can
#: undo such a commit (the last few, within about three ``wal_writer_delay``); the update is then pending again, its
#: attempt not counted, and its handler may run again: at least once holds, as after a lost lease. Nothing durable
#: can depend on an undone claim: the WAL is flushed in order, so any later durable commit (the fenced transaction,
#: a settle, a journal intent, an acknowledgement) flushes the claim first. An exhaustion such a round made is
#: made again by the next claim after the crash (delivered at least once, as ever). The round's one fsync wait was
#: half of a claim -> ``transaction(complete=True)`` cycle's, and 8 claimers queued on the WAL lock for it.
NO_FLUSH_WAIT = "SET LOCAL synchronous_commit = off"
#: The most claims one round takes: its claim ids are made (and sent) before the server knows how many rows are due,
#: so a larger ``limit`` (a fence with a huge ``batch_size``, a direct ``exchange``) cost that many ids per round
#: (``exchange((), lease, 10**6)`` on one due row: 1.2 s and 150 MB here). A caller asking for more gets at most this
#: many and ``more`` (it asks again), as "up to ``limit``" allows.
MAX_ROUND_CLAIMS = 1000
#: ``max_attempts`` when none is given: no attempt count reaches it.
_NO_LIMIT = 2**62


class RoundResult(NamedTuple):
    """What one round did: settled, claimed, whether more may be claimable, and ``waiting`` when nothing was
    claimed only because other claimers held what is due (the caller may wait for them and look again)."""

    settled: int
    claims: list[Claim]
    more: bool
    waiting: bool


def _ints(values: Collection[int]) -> str:
    """Integers as the text of a PostgreSQL array literal (no escaping needed)."""
    if not values:
        return "{}"
    return "{" + ",".join(str(int(v)) for v in values) + "}"


@functools.lru_cache(maxsize=16)
def _reason(spent: int) -> str:
    """The claim's ``%(reason)s`` for ``max_attempts`` = ``spent``: the lapse reason with ``{attempt}`` for the
    server to fill in."""
    return lapsed_reason(-1, spent).replace("-1", "{attempt}", 1)


def _claim_ids(count: int) -> str:
    """``count`` fresh claim ids as one JSON array text (hex digits: nothing to escape)."""
    return '["' + '","'.join(new_claim_ids(count)) + '"]'


class Rounds(StoreSupport):
    """The round (a base class of :class:`~.claims.Claims`)."""

    def _round_on(
        self,
        conn: psycopg.Connection[Any],
        settle: list[tuple[int, int, str]],
        lease: float,
        limit: int,
        *,
        max_attempts: int | None,
        exclude_chats: Collection[int] = (),
        known: Mapping[int, Mapping[str, Any]] | None = None,
        chats: Collection[int] | None = None,
        chatless: Collection[int] = (),
        run: int = 1,
        lean: bool = False,
    ) -> RoundResult:
        """Settle ``settle`` and claim up to ``limit`` in one transaction on ``conn`` (its own transaction, or a
        savepoint of the thread's open one); ``lean``: an unhinted round that scans only the backlog's first
        rows (see :func:`~.round_sql.round_parts`). Raises psycopg's exceptions (the caller translates them);
        nothing of the round is stored then. Takes at most :data:`MAX_ROUND_CLAIMS` claims."""
        limit = min(limit, MAX_ROUND_CLAIMS)
        hinted = chats is not None
        run = max(1, run) if hinted else 1
        lean = lean and not hinted
        scan = (len(chats) * run + len(chatless) + 1) if chats is not None else \
            limit + (LEAN_SPARE if lean else SPARE)
        spent = _NO_LIMIT if max_attempts is None else max_attempts
        params = {
            "now": self._now(), "settle": json.dumps(settle) if settle else "[]", "lease": float(lease),
            "limit": limit, "run": run, "scan": scan, "window": scan * 8 + 64, "ns": self._chat_ns,
            "chats": _ints(chats or ()), "chatless": _ints(chatless), "exclude": _ints(exclude_chats),
            "max_attempts": spent, "reason": _reason(spent), "known": _ints(known or ()),
            "claim_ids": _claim_ids(limit), "channel": self._channel,
        }
        nested = conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE
        *steps, last = round_parts(self._sql, settle=bool(settle), hinted=hinted, lean=lean)
        # Pipeline mode: the statements go out together and are answered together (their begin with them, the
        # commit on its own), two round trips instead of one per statement; each still runs on its own snapshot.
        with conn.pipeline(), conn.transaction():  # (a savepoint inside the thread's transaction: it keeps its
            if not nested and not settle:          # durability)
                conn.execute(NO_FLUSH_WAIT)
            done = [conn.execute(sql, params) for sql in steps]
            rows = conn.execute(last, params).fetchall()
        settled = max(0, done[0].rowcount) if settle else 0
        claims, lapsed, undecodable = [], 0, []
        candidates = busy = picked = 0
        for kind, update_id, chat_id, attempt, claim_id, until, payload in sorted(rows, key=lambda r: (r[0], r[1])):
            if kind == 2:
                candidates, busy, picked = int(update_id), int(chat_id), int(attempt)
            elif kind == 1:
                lapsed += 1
                log.error("update exhausted: attempts spent", extra={"update_id": update_id})
            else:
                update = known.get(update_id) if known is not None and payload is None else None
                if update is None:
                    update = decode(payload)
                    if update is None:
                        undecodable.append(update_id)
                        continue
                claims.append(Claim(Identity(update_id, attempt, claim_id), update, chat_id, until))
        if undecodable:
            self._exhaust_undecodable(conn, undecodable, self._now())
        more = picked >= limit or candidates >= scan or bool(lapsed) or busy > 0 or len(claims) < picked
        waiting = not hinted and picked == 0 and not lapsed
        return RoundResult(settled, claims, more, waiting)

    def _exhaust_undecodable(self, conn: psycopg.Connection[Any], ids: list[int], now: float | None) -> None:
        """Turn the rows ``ids``, just claimed, whose payloads Python cannot decode, into exhaustions holding
        only ``{"update_id": ...}`` and :data:`~telegram_fence.store.values.TOO_DEEP_TO_DECODE`."""
        conn.execute(self._sql.undecodable, {"ids": ids, "reason": TOO_DEEP_TO_DECODE, "now": now})
        for update_id in ids:
            log.error("update cannot be decoded; kept as an exhaustion without its payload",
                      extra={"update_id": update_id})
        self._found_exhaustion(conn)
