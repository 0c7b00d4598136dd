"""A bot written as pyTelegramBotAPI's ``step_example.py`` writes conversations (``msg = bot.send_message(...)``, then
``bot.register_next_step_handler(msg, ...)``), moved under the fence with its two lines, for the restart drills.

Usage: ``python idiom_child.py DB`` with ``TELEGRAM_API_URL`` (telebot's format string) and ``TELEGRAM_BOT_TOKEN``.
A ``DB`` of ``postgres:TABLE`` runs on ``PostgresUpdateStore(TELEGRAM_FENCE_PG_DSN, table=TABLE)``. The fence keeps
its defaults (a 30 s lease, ``states=None``); with ``CHILD_WEBHOOK_PORT=PORT`` it runs the webhook door
(``run_webhook`` on ``http://127.0.0.1:PORT/telegram/hook``, listening on that port) instead of polling.

- ``/start`` asks "Favourite color?", the next message answers it and is asked "Favourite food?", the one after
  answers that and gets ``color=… food=…``.
- ``/hang`` says "hanging", then, with ``CHILD_HANG=1``, blocks (the drill kills the process while it runs);
  without, it says "unhung".
- Any other message is echoed (``echo …``).
- ``CHILD_SAVE=PATH``: telebot's own file-saved next-step handlers, as its example enables them
  (``enable_save_next_step_handlers(delay=2, filename=PATH)`` and ``load_next_step_handlers(PATH)``).

The fence says ``READY=1`` on ``$NOTIFY_SOCKET`` once started (``telegram_fence.testing``'s ``ReadinessSocket``).
"""

from __future__ import annotations

import os
import sys
import threading

import telebot
from telebot import apihelper, types

from telegram_fence import Fence

apihelper.API_URL = os.environ["TELEGRAM_API_URL"]
DB = sys.argv[1]
bot = telebot.TeleBot(os.environ["TELEGRAM_BOT_TOKEN"])

if os.environ.get("CHILD_SAVE"):
    bot.enable_save_next_step_handlers(delay=2, filename=os.environ["CHILD_SAVE"])
    bot.load_next_step_handlers(filename=os.environ["CHILD_SAVE"])


@bot.message_handler(commands=["start"])
def start(message: types.Message) -> None:
    msg = bot.send_message(message.chat.id, "Favourite color?")
    bot.register_next_step_handler(msg, color)


def color(message: types.Message) -> None:
    msg = bot.send_message(message.chat.id, "Favourite food?")
    bot.register_next_step_handler(msg, food, message.text)


def food(message: types.Message, favourite: str) -> None:
    bot.send_message(message.chat.id, f"color={favourite} food={message.text}")


@bot.message_handler(commands=["hang"])
def hang(message: types.Message) -> None:
    bot.send_message(message.chat.id, "hanging")
    if os.environ.get("CHILD_HANG") == "1":
        threading.Event().wait()
    bot.send_message(message.chat.id, "unhung")


@bot.message_handler(func=lambda message: True)
def echo(message: types.Message) -> None:
    bot.send_message(message.chat.id, f"echo {message.text}")


if __name__ == "__main__":
    store: object = DB
    if DB.startswith("postgres:"):
        from telegram_fence.store.postgres import PostgresUpdateStore

        store = PostgresUpdateStore(os.environ["TELEGRAM_FENCE_PG_DSN"], table=DB.removeprefix("postgres:"))
    port = os.environ.get("CHILD_WEBHOOK_PORT")
    if port:
        sys.exit(Fence(bot, store).run_webhook(f"http://127.0.0.1:{port}/telegram/hook", secret_token="s3cret-token",
                                               listen=("127.0.0.1", int(port))))
    sys.exit(Fence(bot, store).run())
