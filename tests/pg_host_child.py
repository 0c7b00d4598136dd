"""A child process for tests/test_postgres_hosts.py: one "host" of a bot on a shared PostgreSQL store.

``python pg_host_child.py API_URL TOKEN DSN TABLE`` runs ``Fence(bot, PostgresUpdateStore(DSN, table=TABLE))``
with an attempt handler that writes one row ``(update_id, pid, claim_id)`` into ``TABLE_domain``
through ``ctx.transaction(complete=True)``, until SIGTERM (exit 0) or SIGKILL.

With ``TF_PARTITION_DIR`` set, the first process to fetch a message "partition" holds that batch before
recording it: it creates ``held`` in that directory and waits (up to 60 s) for ``release`` there.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import telebot

from telegram_fence import Fence
from telegram_fence.store.postgres import PostgresUpdateStore
from telegram_fence.telegram import set_api_server

#: How often a process checks its leadership and a non-leader tries to take it (seconds).
LEADER_CHECK = 0.5


def main(api_url: str, token: str, dsn: str, table: str) -> int:
    set_api_server(api_url)
    bot = telebot.TeleBot(token, threaded=False)
    store = PostgresUpdateStore(dsn, table=table, create_table=False, leader_check=LEADER_CHECK)
    fence = Fence(bot, store, workers=4, lease=1.0, long_poll_timeout=0.5, shutdown_timeout=5, max_attempts=50,
                  authorize=_hold_partition_batch)
    pid = os.getpid()

    @fence.attempt_handler
    def write_row(update: Any, ctx: Any) -> None:
        with ctx.transaction(complete=True) as conn:
            conn.execute(f"INSERT INTO {table}_domain (update_id, pid, claim_id) VALUES (%s, %s, %s)",
                         (ctx.update_id, pid, ctx.identity.claim_id))

    code = fence.run()
    store.close()
    return code


def _hold_partition_batch(update: Any) -> bool:
    """Authorise every update; the first process to see "partition" waits there (see the module doc)."""
    folder = os.environ.get("TF_PARTITION_DIR")
    text = (update.get("message") or {}).get("text")
    if folder and text == "partition":
        try:
            fd = os.open(Path(folder, "held"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return True
        os.close(fd)
        released = threading.Event()
        for _ in range(600):
            if Path(folder, "release").exists() or released.wait(0.1):
                break
    return True


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
