"""Child process for the webhook tests.

- ``serve DB``: a WebhookIntake on DB behind the stdlib server on a free port; prints the port, serves
  until killed.
- ``run_webhook DB API_URL URL``: a Fence with a trivial handler in ``run_webhook`` (the token and secret
  from TF_TEST_TOKEN / TF_TEST_SECRET), telebot pointed at API_URL; prints the port; exits with its code.
- ``drill DB API_URL PORT``: the crash drill's bot: ``run_webhook`` on ``http://127.0.0.1:PORT/telegram/hook``
  (listening on that port), an attempt handler writing one ``notes`` row per update inside the fence
  (``ctx.transaction(complete=True)``); prints nothing; exits with run_webhook's code.
"""

from __future__ import annotations

import os
import sys
import threading


def serve(db: str) -> int:
    from telegram_fence import SqliteUpdateStore
    from telegram_fence.ingress.webhook import WebhookIntake, WsgiServer

    store = SqliteUpdateStore(db)
    server = WsgiServer(WebhookIntake(store, os.environ["TF_TEST_SECRET"]), "127.0.0.1", 0)
    server.start()
    print(server.port, flush=True)
    threading.Event().wait()
    return 0


def run_webhook(db: str, api_url: str, url: str) -> int:
    import telebot

    from telegram_fence import Fence
    from telegram_fence.telegram import set_api_server

    set_api_server(api_url)
    fence = Fence(telebot.TeleBot(os.environ["TF_TEST_TOKEN"], threaded=False), db, lease=5.0)
    fence.handler(lambda update: None)

    def tell_port() -> None:
        stop = threading.Event()
        while not stop.wait(0.02):
            webhook = fence.stats()["webhook"]
            if webhook and webhook.get("listen"):
                print(webhook["listen"].rstrip("/").rsplit(":", 1)[1], flush=True)
                return

    threading.Thread(target=tell_port, name="tell-port", daemon=True).start()
    return fence.run_webhook(url, secret_token=os.environ["TF_TEST_SECRET"], listen=("127.0.0.1", 0))


def drill(db: str, api_url: str, port: int) -> int:
    import telebot

    from telegram_fence import Fence
    from telegram_fence.cli.demo import DRILL_DSN, DrillDb
    from telegram_fence.telegram import set_api_server

    set_api_server(api_url)
    drill_db = DrillDb(db, os.environ.get(DRILL_DSN) or None)  # a SQLite file, or a PostgreSQL table
    store = drill_db.open_store()
    fence = Fence(telebot.TeleBot(os.environ["TF_TEST_TOKEN"], threaded=False), store, workers=4, lease=1.0,
                  shutdown_timeout=5.0, max_attempts=50)

    @fence.attempt_handler
    def take_note(update: telebot.types.Update, ctx: object) -> None:
        message = update.message
        if message is None:
            return
        with ctx.transaction(complete=True) as db_conn:  # type: ignore[attr-defined]
            drill_db.insert_note(db_conn, update.update_id, message.chat.id, message.text,
                                 ctx.identity.claim_id)  # type: ignore[attr-defined]

    code = fence.run_webhook(f"http://127.0.0.1:{port}/telegram/hook", secret_token=os.environ["TF_TEST_SECRET"],
                             listen=("127.0.0.1", port))
    store.close()
    return code


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "serve":
        sys.exit(serve(sys.argv[2]))
    if mode == "drill":
        sys.exit(drill(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    sys.exit(run_webhook(sys.argv[2], sys.argv[3], sys.argv[4]))
