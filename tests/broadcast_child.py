"""Child process for the broadcast crash tests: runs one broadcast against a fake Bot API server.

Usage: ``python broadcast_child.py API_URL DIRECTORY NAME RATE`` with the token in ``TELEGRAM_BOT_TOKEN``.
Prints the final report as one JSON line; exits 0 when every recipient is decided, 1 when halted,
3 when the broadcast is locked by another process. The parent kills it at random moments.
"""

from __future__ import annotations

import json
import os
import sys

import telebot

from telegram_fence.delivery.broadcast import Broadcast
from telegram_fence.errors import BroadcastLocked
from telegram_fence.telegram import set_api_server


def main(argv: list[str]) -> int:
    api_url, directory, name, rate = argv[1], argv[2], argv[3], float(argv[4])
    set_api_server(api_url)
    bot = telebot.TeleBot(os.environ["TELEGRAM_BOT_TOKEN"], threaded=False)
    broadcast = Broadcast(bot, directory, name)
    print(json.dumps({"pid": os.getpid(), "started": True}), flush=True)
    try:
        report = broadcast.run(rate=rate)
    except BroadcastLocked as exc:
        print(json.dumps({"locked": str(exc)}), flush=True)
        return 3
    print(
        json.dumps(
            {
                "sent": report.sent,
                "failed": dict(report.failed),
                "uncertain": report.uncertain,
                "pending": report.pending,
                "halted": report.halted,
            }
        ),
        flush=True,
    )
    return 1 if report.halted else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
