"""An attempt-aware bot: each note is written exactly once, even when a worker stalls or the bot crashes.

    TELEGRAM_BOT_TOKEN=123:abc OPERATOR_CHAT_ID=42 python examples/notes_bot.py

Without a token of your own: run ``python -m telegram_fence.testing`` (the fake Bot API server) in another
terminal and export the two variables it prints; what you type there is a message to this bot.

The note and "this update is done" commit in one transaction that also checks, inside it, that this
attempt still owns the update. Terminal failures go to the operator chat and stay in the database
until acknowledged.
"""

from __future__ import annotations

import os
import sys

import telebot

from telegram_fence import AttemptContext, Exhaustion, Fence, OperatorChannel
from telegram_fence.jsonlog import configure_logging
from telegram_fence.telegram import use_api_url

token = os.environ["TELEGRAM_BOT_TOKEN"]
configure_logging(level="INFO")
use_api_url()  # $TELEGRAM_API_URL (http://host:port): a local Bot API server or the fake one; unset: Telegram
bot = telebot.TeleBot(token)
operator = OperatorChannel(bot, int(os.environ["OPERATOR_CHAT_ID"]))


def report(exhaustion: Exhaustion) -> None:
    # Called at least once per terminal failure; returning acknowledges it.
    operator.post(f"gave up on update {exhaustion.identity}: {exhaustion.error.splitlines()[-1]}")


fence = Fence(bot, "notes.db", on_exhausted=report, operator=operator)
with fence.store.write() as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS notes(update_id INTEGER PRIMARY KEY, chat_id INTEGER, text TEXT)")


@fence.attempt_handler
def take_note(update: telebot.types.Update, ctx: AttemptContext) -> None:
    message = update.message
    if message is None or not message.text:
        return
    with ctx.transaction(complete=True) as conn:
        conn.execute("INSERT INTO notes VALUES (?, ?, ?)", (update.update_id, message.chat.id, message.text))
    bot.send_message(message.chat.id, "noted")


if __name__ == "__main__":
    code = fence.run()
    operator.close(5)
    sys.exit(code)
