"""The smallest fenced bot: an existing telebot script with one line changed.

    TELEGRAM_BOT_TOKEN=123:abc python examples/echo_bot.py

Without a token of your own: run ``python -m telegram_fence.testing`` (the fake Bot API server) in another
terminal and export the two variables it prints; what you type there is a message to this bot.

Every update is recorded in echo_bot.db before Telegram is told to forget it; a crash or restart
loses nothing. SIGTERM or Ctrl-C stops it cleanly (exit 0); a refused token exits 1.
"""

from __future__ import annotations

import os
import sys

import telebot

from telegram_fence import Fence
from telegram_fence.jsonlog import configure_logging
from telegram_fence.telegram import use_api_url

token = os.environ["TELEGRAM_BOT_TOKEN"]
configure_logging(level="INFO")
use_api_url()  # $TELEGRAM_API_URL (http://host:port): a local Bot API server or the fake one; unset: Telegram
bot = telebot.TeleBot(token)


@bot.message_handler(commands=["start"])
def start(message: telebot.types.Message) -> None:
    bot.reply_to(message, "hello: I echo what you write")


@bot.message_handler(func=lambda message: True)
def echo(message: telebot.types.Message) -> None:
    bot.send_message(message.chat.id, message.text or "(no text)")


if __name__ == "__main__":
    sys.exit(Fence(bot, "echo_bot.db").run())  # was: bot.infinity_polling()
