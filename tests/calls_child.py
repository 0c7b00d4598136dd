"""A plain telebot bot for the call journal's crash drill: two replies per update, failing between them once.

Usage: ``python calls_child.py DB API_URL TOKEN WORKERS [PORT]`` (``DB``: a SQLite path, or
``postgres:DSN|TABLE``; with ``PORT`` the bot runs ``run_webhook`` on that port, secret ``$TF_TEST_SECRET``).
Each update gets ``"<update_id>:1"`` and then
``"<update_id>:2"``; the first attempt of every fifth update raises between the two replies. SIGKILL it at any
moment and start it again: the journal replays what was sent and never sends a reply twice. With
``TF_QUEUED_REPLY=1`` the second reply is queued in the transaction that settles the update
(``ctx.transaction(complete=True)`` + ``queue_calls()``) and sent after its commit; ``TF_QUEUED_REPLY=only``
sends only that queued reply.
"""

from __future__ import annotations

import os
import sys

import telebot
from telebot import apihelper

from telegram_fence import Fence, queue_calls
from telegram_fence.runtime.attempt import current_attempt


def main() -> int:
    db, api_url, token, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    apihelper.API_URL = api_url
    bot = telebot.TeleBot(token, threaded=False)
    queued = os.environ.get("TF_QUEUED_REPLY") in ("1", "only")
    queued_only = os.environ.get("TF_QUEUED_REPLY") == "only"

    @bot.message_handler(func=lambda m: True)
    def two_replies(message: telebot.types.Message) -> None:
        ctx = current_attempt()
        assert ctx is not None
        update_id = ctx.update_id
        if not queued_only:
            bot.send_message(message.chat.id, f"{update_id}:1")
        if update_id % 5 == 0 and ctx.attempt == 1:
            raise RuntimeError("fails between its two replies")
        if queued:
            with ctx.transaction(complete=True), queue_calls():
                bot.send_message(message.chat.id, f"{update_id}:2")
        else:
            bot.send_message(message.chat.id, f"{update_id}:2")

    store: object = db
    if db.startswith("postgres:"):
        from telegram_fence.store.postgres import PostgresUpdateStore

        dsn, _, table = db[len("postgres:"):].rpartition("|")
        store = PostgresUpdateStore(dsn, table=table)
    fence = Fence(bot, store, workers=workers, lease=1.0, long_poll_timeout=0.5, shutdown_timeout=2.0,
                  retry=lambda error, attempt: 0.05, max_attempts=20)
    try:
        if len(sys.argv) > 5:
            port = int(sys.argv[5])
            return fence.run_webhook(f"http://127.0.0.1:{port}/telegram/hook", listen=("127.0.0.1", port),
                                     secret_token=os.environ["TF_TEST_SECRET"])
        return fence.run()
    finally:
        if store is not db:
            store.close()  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
