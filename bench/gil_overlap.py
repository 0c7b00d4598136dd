"""Can a writer thread's SQLite round overlap the handlers' Python on the other core? One thread vs two, alternating.

    python bench/gil_overlap.py                      # 6 alternating runs, rounds of 100 updates, one script per round
    python bench/gil_overlap.py --batch 400 --mode many --runs 6

Each round writes a batch the way the fence's dispatcher does (``BEGIN IMMEDIATE``, insert the batch, settle the
batch before it, ``COMMIT`` at ``synchronous=FULL`` in WAL mode: ``--mode script`` sends the round as one
multi-statement ``execute``, ``--mode many`` as separate calls) and parses the batch with telebot's
``Update.de_json`` (the handlers' Python). ``serial``: both on one thread, one after the other; ``overlapped``: a
writer thread writes round k+1 while the main thread parses round k. Prints µs per update of each, per run, and the
medians. APSW releases the interpreter lock during each statement; whether the writer gets it back in time to
overlap is what this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from typing import Any

import apsw
from telebot import types


def updates(n: int) -> list[dict[str, Any]]:
    """``n`` message updates over 50 chats, as Telegram sends them."""
    out = []
    for i in range(n):
        user = {"id": i % 50 + 1, "is_bot": False, "first_name": "A"}
        out.append({"update_id": i, "message": {"message_id": i, "date": 1700000000, "from": user,
                                                "chat": {**user, "type": "private"}, "text": f"m{i}"}})
    return out


def one_run(raws: list[dict[str, Any]], batch: int, mode: str, directory: str) -> tuple[float, float]:
    """(serial, overlapped) µs per update, each on a fresh database file."""
    payloads = [json.dumps(r) for r in raws]
    n = len(raws)

    def open_db(name: str) -> apsw.Connection:
        conn = apsw.Connection(os.path.join(directory, name))
        conn.execute("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE u(update_id INTEGER PRIMARY KEY, payload TEXT, chat_id INT, state INT);"
                     "CREATE INDEX u_open ON u(state, chat_id)")
        return conn

    def write(conn: apsw.Connection, start: int) -> None:
        rows = [(raws[j]["update_id"], payloads[j], raws[j]["message"]["chat"]["id"])
                for j in range(start, start + batch)]
        if mode == "many":
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO u VALUES (?, ?, ?, 1)", rows)
            conn.execute("UPDATE u SET state = 2 WHERE update_id IN (SELECT value FROM json_each(?))",
                         (json.dumps([r[0] - batch for r in rows]),))
            conn.execute("COMMIT")
        else:
            conn.execute("BEGIN IMMEDIATE; INSERT INTO u SELECT j.value->>0, j.value->>1, j.value->>2, 1 "
                         "FROM json_each(:rows) AS j; UPDATE u SET state = 2 WHERE update_id IN "
                         "(SELECT j.value->>0 - :batch FROM json_each(:rows) AS j); COMMIT",
                         {"rows": json.dumps(rows), "batch": batch})

    def parse(start: int) -> None:
        for raw in raws[start:start + batch]:
            types.Update.de_json(dict(raw))

    conn = open_db("serial.db")
    began = time.perf_counter()
    for start in range(0, n, batch):
        write(conn, start)
        parse(start)
    serial = (time.perf_counter() - began) / n * 1e6
    conn.close()

    conn = open_db("overlapped.db")
    written = threading.Semaphore(0)

    def writer() -> None:
        for start in range(0, n, batch):
            write(conn, start)
            written.release()

    began = time.perf_counter()
    thread = threading.Thread(target=writer, name="bench-writer")
    thread.start()
    for start in range(0, n, batch):
        written.acquire()
        parse(start)
    thread.join()
    overlapped = (time.perf_counter() - began) / n * 1e6
    conn.close()
    return serial, overlapped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10000, help="updates per run (a multiple of --batch)")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--mode", choices=("script", "many"), default="script")
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    raws = updates(args.n + args.batch)[: args.n // args.batch * args.batch]
    serial, overlapped = [], []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            s, o = one_run(raws, args.batch, args.mode, tmp)
        serial.append(s)
        overlapped.append(o)
        print(f"run {run + 1}: serial {s:.1f} µs/update, overlapped {o:.1f} µs/update")
    print(f"batch={args.batch} mode={args.mode}: median serial {statistics.median(serial):.1f} µs/update, "
          f"overlapped {statistics.median(overlapped):.1f} µs/update")


if __name__ == "__main__":
    main()
