"""A real HTTP fake of the Telegram Bot API, for tests, benchmarks and the demo.

:class:`FakeBotAPI` listens on ``127.0.0.1`` and answers the way Telegram does: ``getUpdates`` with offset
confirmation and long polling, ``409 Conflict`` for a second poller or a set webhook, the send methods with
Telegram's own refusals (too long, bad entities, chat not found, blocked, deactivated, bad token), and
scriptable faults (errors, dropped connections, delays, non-JSON answers, a rate limiter). The real telebot
client talks to it over HTTP once :meth:`FakeBotAPI.install` pointed telebot at it::

    with FakeBotAPI() as api:
        bot = telebot.TeleBot(api.token)
        api.push_message(42, "/start")
        ...
        assert api.wait_sent(1)

Where the fake picks one of Telegram's behaviours: a second *concurrent* ``getUpdates`` gets the 409, unless
the client of the running one has hung up (a killed or timed-out bot), in which case the new one takes over,
so a restarted bot is not locked out by its dead predecessor.

Webhook mode: once ``setWebhook`` named a loopback URL, queued updates are POSTed to it (with the
``X-Telegram-Bot-Api-Secret-Token`` header when a secret was set), at most ``max_connections`` at once,
retried after a non-2xx answer or a failed connection, and removed from the queue only after a 2xx; while a
webhook is set ``getUpdates`` answers 409. Every public method is safe to call from any
thread while the server runs.

The package, one job per module: ``fake`` (the :class:`FakeBotAPI` face: life cycle, records, waits),
``server`` (HTTP plumbing, request bodies), ``dispatch`` (routing, faults, token), ``updates`` (queue,
offsets, long poll, pushing), ``methods`` (the Bot API methods), ``members`` (chat members, bans, tags,
``leaveChat``), ``chats`` (recipients and messages),
``entities`` (markup parsing, pure functions), ``files``, ``faults``, ``records``, ``answers``
(Telegram-shaped answers and parameter coercion), ``webhook`` (``setWebhook`` and friends, delivery state)
and ``delivery`` (the threads that POST updates to a webhook).

May import: its own modules, ``telegram_fence.telegram``, ``telegram_fence.errors`` and the standard
library (level 4 ``testing``; never the runtime).
"""

from __future__ import annotations

from .answers import ApiError
from .fake import FakeBotAPI
from .records import Call, Sent, UploadedFile

__all__ = ["ApiError", "Call", "FakeBotAPI", "Sent", "UploadedFile"]
