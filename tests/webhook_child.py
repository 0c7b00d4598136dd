"""Child process for the webhook tests.

- ``serve DB``: a WebhookIntake on DB behind the stdlib server on a free port; prints the port, serves
  until killed.
- ``run_webhook DB API_URL URL``: a Fence with a trivial handler in ``run_webhook`` (the token and secret
  from TF_TEST_TOKEN / TF_TEST_SECRET), telebot pointed at API_URL; prints the port; exits with its code.
"""

from __future__ import annotations

import os
import sys
import threading


def serve(db: str) -> int:
    from telegram_fence import SqliteUpdateStore, WebhookIntake
    from telegram_fence.ingress.wsgi_server import WsgiServer

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


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "serve":
        sys.exit(serve(sys.argv[2]))
    sys.exit(run_webhook(sys.argv[2], sys.argv[3], sys.argv[4]))
