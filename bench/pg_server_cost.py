"""What the PostgreSQL server spends on a fence's steady round: CPU, WAL, tuples and index pages per 100 updates.

    python bench/pg_server_cost.py --dsn "host=127.0.0.1 port=5432 user=postgres dbname=test" --rounds 300
    python bench/pg_server_cost.py --dsn "..." --rounds 40 --explain    # + each statement's plan (auto_explain)

Each round is the inline dispatcher's split round as ``bench/pg_round.py`` makes it (``begin_round`` → ``result``,
no handlers): it settles the claims of the round before last, records 100 fresh updates of 50 chats from their
``getUpdates`` answer and claims them as they are stored, holding the last round's claims. The first 20 rounds
warm the table and the sessions. Around the others it reads the CPU (``/proc``) of the run's own server sessions
(named after its table), of the WAL writer (shared with any other session writing meanwhile) and of this process.
From the table's statistics (``pg_stat_user_tables``, ``pg_statio_user_tables``, ``pg_statio_user_indexes``, read
after the store closed, so every session's counts have landed) it prints, per round: tuples inserted, updated,
updated HOT, and the buffers each index was read or written through (hit + read).

Nothing on the server is configured: with ``--explain`` the run's own sessions load ``auto_explain`` through
their connection options (a superuser's session setting) and log each statement's plan with ``ANALYZE, BUFFERS,
WAL`` to the server's log; the script reads the log file (``--log``) from where it was when the run began and
prints, per statement kind, the median execution time, buffers and WAL of its top node. The server's other
sessions are unaffected. Needs a server on this machine (its ``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")
_EXPLAIN = ("-c session_preload_libraries=auto_explain -c auto_explain.log_min_duration=0 "
            "-c auto_explain.log_analyze=on -c auto_explain.log_buffers=on -c auto_explain.log_wal=on "
            "-c auto_explain.log_format=json -c auto_explain.log_nested_statements=on")


def _update(update_id: int, chat: int) -> dict[str, Any]:
    user = {"id": chat, "is_bot": False, "first_name": f"User {chat}", "language_code": "en"}
    return {"update_id": update_id, "message": {"message_id": update_id, "from": user,
                                                "chat": {"id": chat, "type": "private", "first_name": f"User {chat}"},
                                                "date": 1796147960, "text": f"m{update_id}"}}


def process_cpu(pids: list[int]) -> float:
    """Seconds of CPU (user + system) the processes ``pids`` spent so far (0 for one that ended)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def _backends(conn: Any, name: str) -> list[int]:
    """The server processes of the sessions named ``name`` (``application_name``: this run's store)."""
    return [pid for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,))]


def _stats(conn: Any, table: str) -> dict[str, float]:
    """The counters this script reports, as one flat dict."""
    out: dict[str, float] = {}
    name = table.rpartition(".")[2]
    row = conn.execute("SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables "
                       "WHERE relname = %s", (name,)).fetchone()
    out.update({"tuples inserted": row[0], "tuples updated": row[1], "of them HOT": row[2], "deleted": row[3]})
    row = conn.execute("SELECT heap_blks_hit + heap_blks_read FROM pg_statio_user_tables WHERE relname = %s",
                       (name,)).fetchone()
    out["heap buffers"] = row[0]
    for index, blocks, scans in conn.execute(
            "SELECT s.indexrelname, s.idx_blks_hit + s.idx_blks_read, u.idx_scan FROM pg_statio_user_indexes s "
            "JOIN pg_stat_user_indexes u USING (indexrelid) WHERE s.relname = %s ORDER BY 1", (name,)):
        short = index[len(name) + 1:] if index.startswith(name + "_") else index
        out[f"index {short} buffers"] = blocks
        out[f"index {short} scans"] = scans
    return out


def _plans(log: Path, start: int) -> dict[str, list[dict[str, Any]]]:
    """The auto_explain plans logged after byte ``start`` of ``log``, by statement kind."""
    text = log.read_bytes()[start:].decode(errors="replace")
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for match in re.finditer(r"duration: [0-9.]+ ms  plan:\n\t(\{.*?\n\t\})", text, re.S):
        try:
            plan = json.loads(match.group(1).replace("\n\t", "\n"))
        except ValueError:
            continue
        query = plan.get("Query Text", "")
        if "state = 2, changed_at" in query:
            kind = "settle"
        elif "INSERT INTO" in query and "chosen" in query:
            kind = "record"
        else:
            kind = query.split()[0].lower() if query.split() else "?"
            kind = f"other ({kind})"
        found[kind].append(plan["Plan"])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("TELEGRAM_FENCE_PG_DSN"))
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--explain", action="store_true", help="log and summarise each statement's plan")
    parser.add_argument("--log", type=Path, default=Path("/var/log/postgresql/postgresql-15-main.log"))
    parser.add_argument("--drop", action="append", default=[], metavar="INDEX",
                        help="drop this index of the table (its name without the table's) before the run")
    parser.add_argument("--keep", action="store_true", help="leave the table for a look afterwards")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or TELEGRAM_FENCE_PG_DSN) is needed")
    import psycopg

    from telegram_fence.store.postgres import PostgresUpdateStore, table_names

    table = f"tf_pg_cost_{uuid.uuid4().hex[:8]}"
    dsn = args.dsn + f" application_name={table}" + (f" options='{_EXPLAIN}'" if args.explain else "")
    PostgresUpdateStore(args.dsn, table=table).close()
    watcher = psycopg.connect(args.dsn, autocommit=True)
    for index in args.drop:
        watcher.execute(f"DROP INDEX {table}_{index}")
    store = PostgresUpdateStore(dsn, table=table, create_table=False)
    next_id = 1
    before_last: list[Any] = []
    last: list[Any] = []
    warm = 20
    pids: list[int] = []
    t0 = c0 = s0 = w0 = 0.0
    log_start = 0
    try:
        for number in range(warm + args.rounds):
            if number == warm:
                pids = _backends(watcher, table)  # (its sessions are named after the table)
                writer = [pid for (pid,) in watcher.execute(
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")]
                log_start = args.log.stat().st_size if args.explain else 0
                t0, c0, s0, w0 = time.perf_counter(), time.process_time(), process_cpu(pids), process_cpu(writer)
            batch = [_update(next_id + i, 1 + i % args.chats) for i in range(100)]
            next_id += 100
            body = '{"ok":true,"result":[' + ",".join(json.dumps(u, separators=(",", ":")) for u in batch) + "]}"
            pending = store.begin_round([c.identity for c in before_last], batch, next_id, lease=30.0, limit=100,
                                        run=16, held=[c.identity for c in last], body=body)
            assert pending is not None
            outcome = pending.result()
            before_last, last = last, outcome.claims
        wall, client, server = time.perf_counter() - t0, time.process_time() - c0, process_cpu(pids) - s0
        walwriter = process_cpu(writer) - w0
        store.close()  # (a session's statistics reach the shared counters at the latest when it ends)
        time.sleep(0.5)
        watcher.execute("SELECT pg_stat_clear_snapshot()")
        end = _stats(watcher, table)
        n = args.rounds
        print(f"per round of 100 updates ({n} rounds): wall {wall / n * 1e3:.2f} ms, "
              f"server CPU {server / n * 1e3:.2f} ms ({len(pids)} sessions; the WAL writer "
              f"{walwriter / n * 1e3:.2f} ms), client CPU {client / n * 1e3:.2f} ms")
        for name, value in end.items():  # (the table's counters count every round, the warm-up's too)
            print(f"  {name:28s} {value / (warm + n):10.1f} per round")
        if args.explain:
            for kind, plans in sorted(_plans(args.log, log_start).items()):
                med = {key: statistics.median(float(p.get(key, 0)) for p in plans) for key in (
                    "Actual Total Time", "Shared Hit Blocks", "Shared Dirtied Blocks", "WAL Records", "WAL FPI",
                    "WAL Bytes")}
                print(f"  plan {kind:16s} x{len(plans):4d}: {med['Actual Total Time']:.3f} ms, buffers hit "
                      f"{med['Shared Hit Blocks']:.0f} dirtied {med['Shared Dirtied Blocks']:.0f}, WAL records "
                      f"{med['WAL Records']:.0f} fpi {med['WAL FPI']:.0f} bytes {med['WAL Bytes']:.0f}")
    finally:
        store.close()
        if not args.keep:
            for name in table_names(table):
                watcher.execute(f"DROP TABLE IF EXISTS {name}")
            watcher.execute(f"DROP FUNCTION IF EXISTS {table}_calls_prune()")
        watcher.close()


if __name__ == "__main__":
    main()
