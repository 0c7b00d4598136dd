"""A fenced echo bot run with ``Fence(...).run()`` and no logging configured, for the stop and log tests.

Usage: ``python stop_child.py DB`` with ``TELEGRAM_API_URL`` (telebot's format string), ``TELEGRAM_BOT_TOKEN``
and optional ``STOP_CHILD_LEASE`` and ``STOP_CHILD_SHUTDOWN`` (the fence's ``shutdown_timeout``) in seconds.
A message ``hang`` replies ``hanging`` and then blocks its handler forever unless ``STOP_CHILD_NO_HANG=1``; a
message starting with ``fail`` raises ``ValueError``.
Says ``READY=1`` on ``$NOTIFY_SOCKET`` once its SIGINT/SIGTERM handlers are in place (the fence does).
"""

from __future__ import annotations

import os
import sys
import threading

import telebot
from telebot import apihelper

from telegram_fence import Fence


def main() -> int:
    apihelper.API_URL = os.environ["TELEGRAM_API_URL"]
    bot = telebot.TeleBot(os.environ["TELEGRAM_BOT_TOKEN"], threaded=False)
    no_hang = os.environ.get("STOP_CHILD_NO_HANG") == "1"

    @bot.message_handler(func=lambda m: True)
    def echo(message: telebot.types.Message) -> None:
        text = message.text or ""
        if text == "hang":
            bot.send_message(message.chat.id, "hanging")  # on a retry the call journal replays it, not resends
            if not no_hang:
                threading.Event().wait()
        if text.startswith("fail"):
            raise ValueError(f"cannot handle {text!r}")
        bot.send_message(message.chat.id, f"echo {text}")

    lease = float(os.environ.get("STOP_CHILD_LEASE", "30"))
    shutdown = float(os.environ.get("STOP_CHILD_SHUTDOWN", "10"))
    fence = Fence(bot, sys.argv[1], lease=lease, shutdown_timeout=shutdown)
    return fence.run()


if __name__ == "__main__":
    sys.exit(main())
