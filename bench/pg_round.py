"""One dispatcher round on PostgreSQL, synchronous vs split (``begin_round`` → handlers → ``result``), alternating.

    python bench/pg_round.py --dsn "host=127.0.0.1 port=5432 user=postgres dbname=test" --rounds 200 --burn-ms 2

Each round settles the claims of the round before last, records 100 fresh updates of 50 chats from their
``getUpdates`` answer (``body=``) and claims them as they are stored, as a fence's inline rounds do: the synchronous
way is the dispatcher's, ``write()`` + ``exchange(settle, lease, 0)`` + ``record_and_claim`` (the claims of the round
before count as open rows, so they are settled first); the split way is one ``begin_round`` holding the previous
round's claims. ``--burn-ms``
of pure Python stands for the handlers: after the commit in the synchronous way, between the send and the read in
the split one. Prints the median wall time per round of each way (the first 10 rounds of each left out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from typing import Any


def _update(update_id: int, chat: int) -> dict[str, Any]:
    user = {"id": chat, "is_bot": False, "first_name": f"User {chat}", "language_code": "en"}
    return {"update_id": update_id, "message": {"message_id": update_id, "from": user,
                                                "chat": {"id": chat, "type": "private", "first_name": f"User {chat}"},
                                                "date": 1796147960, "text": f"m{update_id}"}}


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("TELEGRAM_FENCE_PG_DSN"))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--burn-ms", type=float, default=2.0)
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or TELEGRAM_FENCE_PG_DSN) is needed")
    import psycopg

    from telegram_fence.store.postgres import PostgresUpdateStore, table_names

    table = f"tf_pg_round_{uuid.uuid4().hex[:8]}"
    store = PostgresUpdateStore(args.dsn, table=table)
    burn = args.burn_ms / 1000
    times: dict[str, list[float]] = {"sync": [], "split": []}
    next_id = 1
    before_last: list[Any] = []
    last: list[Any] = []
    try:
        for number in range(args.rounds):
            batch = [_update(next_id + i, 1 + i % 50) for i in range(100)]
            next_id += 100
            body = '{"ok":true,"result":[' + ",".join(json.dumps(u, separators=(",", ":")) for u in batch) + "]}"
            way = "sync" if number % 2 == 0 else "split"
            start = time.perf_counter()
            if way == "sync":
                with store.write(durable=True):
                    store.exchange([c.identity for c in before_last + last], 30.0, 0)  # (the dispatcher's settle)
                    _new, claims = store.record_and_claim(batch, next_id, lease=30.0, limit=100, run=16, body=body)
                _burn(burn)
                before_last, last = [], claims
            else:
                pending = store.begin_round([c.identity for c in before_last], batch, next_id, lease=30.0, limit=100,
                                            run=16, held=[c.identity for c in last], body=body)
                assert pending is not None
                _burn(burn)
                outcome = pending.result()
                before_last, last = last, outcome.claims
            times[way].append(time.perf_counter() - start)
        for way, spent in times.items():
            print(f"{way:5s}: median {statistics.median(spent[10:]) * 1e3:.2f} ms per round of 100 updates "
                  f"(with {args.burn_ms:g} ms of handlers)")
    finally:
        store.close()
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            for name in table_names(table):
                conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(f"DROP FUNCTION IF EXISTS {table}_calls_prune()")


if __name__ == "__main__":
    main()
