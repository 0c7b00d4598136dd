"""A fenced echo bot in ``Fence.run_webhook`` with no logging configured, for the webhook stop tests.

Usage: ``python webhook_stop_child.py DB API_URL PORT`` with ``TF_TEST_TOKEN`` and ``TF_TEST_SECRET``; serves
``http://127.0.0.1:PORT/hook`` on that port. A message ``hang`` sends "hanging" and then blocks its handler forever
unless ``STOP_CHILD_NO_HANG=1`` (then it is echoed); every other message is echoed. Exits with ``run_webhook``'s code.
"""

from __future__ import annotations

import os
import sys
import threading

import telebot

from telegram_fence import Fence
from telegram_fence.telegram import set_api_server


def main() -> int:
    db, api_url, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    set_api_server(api_url)
    bot = telebot.TeleBot(os.environ["TF_TEST_TOKEN"], threaded=False)
    no_hang = os.environ.get("STOP_CHILD_NO_HANG") == "1"

    @bot.message_handler(func=lambda m: True)
    def echo(message: telebot.types.Message) -> None:
        text = message.text or ""
        if text == "hang":
            bot.send_message(message.chat.id, "hanging")  # the same first call on every attempt (journaled once)
            if not no_hang:
                threading.Event().wait()
        bot.send_message(message.chat.id, f"echo {text}")

    fence = Fence(bot, db, lease=1.0, shutdown_timeout=30.0)
    return fence.run_webhook(f"http://127.0.0.1:{port}/hook", secret_token=os.environ["TF_TEST_SECRET"],
                             listen=("127.0.0.1", port))


if __name__ == "__main__":
    sys.exit(main())
