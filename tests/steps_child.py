"""A plain telebot bot for the durable steps' crash drill: each update calls a local HTTP service through a step,
fails at random after it, then replies.

Usage: ``python steps_child.py DB API_URL TOKEN WORKERS SERVICE_URL`` (``DB``: a SQLite path, or
``postgres:DSN|TABLE``). The handler posts ``{"update_id", "key", "pid"}`` to ``SERVICE_URL`` inside
``step("work", ...)`` (``key``: ``step_key("work")``), fails after the step on about a third of its attempts, and
replies ``"<update_id>:<key>:<pid of the service call>:<pid of the reply>"``. SIGKILL it at any moment and start it
again.
"""

from __future__ import annotations

import json
import os
import random
import sys
import urllib.request
from typing import Any

import telebot
from telebot import apihelper

from telegram_fence import Fence, default_retry, step, step_key
from telegram_fence.runtime.attempt import current_attempt


def call_service(url: str, update_id: int, key: str) -> dict[str, Any]:
    body = json.dumps({"update_id": update_id, "key": key, "pid": os.getpid()}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        result: dict[str, Any] = json.loads(answer.read())
    return result


def main() -> int:
    db, api_url, token, workers, service = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    apihelper.API_URL = api_url
    bot = telebot.TeleBot(token, threaded=False)

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        ctx = current_attempt()
        assert ctx is not None
        key = step_key("work")
        done = step("work", call_service, service, ctx.update_id, key)
        if random.Random(f"{ctx.update_id}:{ctx.attempt}").random() < 0.3:
            raise RuntimeError("fails after the step")
        bot.send_message(message.chat.id, f"{ctx.update_id}:{key}:{done['pid']}:{os.getpid()}")

    def retry(error: BaseException, attempt: int) -> float | None:
        return None if default_retry(error, attempt) is None else 0.05  # final errors stay final, the rest soon

    store: object = db
    if db.startswith("postgres:"):
        from telegram_fence.store.postgres import PostgresUpdateStore

        dsn, _, table = db[len("postgres:"):].rpartition("|")
        store = PostgresUpdateStore(dsn, table=table)
    fence = Fence(bot, store, workers=workers, lease=1.0, long_poll_timeout=0.5, shutdown_timeout=2.0, retry=retry,
                  max_attempts=30)
    try:
        return fence.run()
    finally:
        if store is not db:
            store.close()  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
