"""One writer: while a fence runs, every write of its pool reaches the store from the dispatcher thread.

Real fences on real SQLite files against the fake Bot API over HTTP; the store is a real ``SqliteUpdateStore``
that notes the thread of each write call the runtime makes (records, claims, settles, retries, exhaustions,
renewals, releases). A handler's own ``ctx.transaction()`` keeps its own connection and is not counted.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import telebot
from helpers import ThreadNotingStore, eventually, make_fence, stop, webhook_deliverer

from telegram_fence.testing import FakeBotAPI

#: The runtime's store writes (the fenced, batched and durable levels).
WRITES = ("record", "exchange", "settle_many", "retry_owned", "exhaust", "renew_many", "release",
          "acknowledge_exhaustion", "prune")

#: The generation's writes (the poller's and the webhook door's): the writer's too while the pool runs.
GENERATION_WRITES = ("begin_generation", "mark_progress", "end_generation")


class ThreadsOfWrites(ThreadNotingStore):
    """A real SQLite store that notes which thread made each of the runtime's write calls."""

    def __init__(self, path: str) -> None:
        super().__init__(path, WRITES + GENERATION_WRITES)


def test_records_settles_retries_exhaustions_renewals_and_releases_are_written_by_the_dispatcher(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """A handler that fails once (a retry), one that always fails (an exhaustion, then acknowledged after
    ``on_exhausted``), one that outlives its lease's renewal period (renewals) and its ``handler_timeout`` (a
    release), and the housekeeping's pruning: each write comes from ``fence-dispatcher``, none from
    ``fence-worker-N``, ``fence-heartbeat`` or ``fence-exhaustions``."""
    store = ThreadsOfWrites(db)
    unblock = threading.Event()
    tries: dict[str, int] = {}
    told: list[Any] = []
    fence = make_fence(bot, store, workers=2, lease=0.6, handler_timeout=1.0, max_attempts=2,
                       retry=lambda error, attempt: 0.05, on_exhausted=told.append)

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        text = update.message.text
        tries[text] = tries.get(text, 0) + 1
        if text == "once" and tries[text] == 1:
            raise ValueError("fails the first time")
        if text == "always":
            raise ValueError("fails every time")
        if text == "slow" and tries[text] == 1:
            unblock.wait(5)

    fence.start()
    try:
        for chat, text in ((1, "once"), (2, "always"), (3, "slow"), (4, "plain")):
            api.push_message(chat, text)
        assert eventually(lambda: fence.stats()["workers"]["timeouts"] == 1, timeout=15), fence.stats()
        assert eventually(lambda: tries.get("once") == 2 and tries.get("always") == 2, timeout=15), tries
        assert eventually(lambda: fence.stats()["workers"]["exhausted"] == 1, timeout=15), fence.stats()
        assert eventually(lambda: store.threads_of("acknowledge_exhaustion"), timeout=15)
        unblock.set()
        assert eventually(lambda: tries.get("slow") == 2, timeout=15), tries
    finally:
        unblock.set()
        stop(fence)
    written = {name: store.threads_of(name) for name in WRITES if store.threads_of(name)}
    for needed in ("retry_owned", "exhaust", "renew_many", "release", "acknowledge_exhaustion", "prune"):
        assert needed in written, (needed, written)
    assert all(threads == {"fence-dispatcher"} for threads in written.values()), written


def test_the_webhook_intake_s_deliveries_are_written_by_the_dispatcher(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """Deliveries to a running fence's ``webhook_app`` from several request threads at once: each is answered
    200 only after it is stored, every update is handled once, and every record comes from ``fence-dispatcher``."""
    store = ThreadsOfWrites(db)
    handled: list[int] = []
    fence = make_fence(bot, store, workers=2)
    fence.handler(lambda update: handled.append(update.update_id))
    secret = "writer-test-secret"
    app = fence.webhook_app(secret)
    fence.start()

    deliver = webhook_deliverer(app, secret, chats=3, stored=store.stored)

    try:
        with ThreadPoolExecutor(8, thread_name_prefix="test-request") as pool:
            answers = list(pool.map(deliver, range(1, 41)))
        assert all(answer.startswith("200") for answer in answers), answers
        assert eventually(lambda: sorted(handled) == list(range(1, 41)), timeout=15), handled
    finally:
        stop(fence)
    assert store.threads_of("record") == {"fence-dispatcher"}, store.calls


def test_the_poller_s_generation_writes_are_written_by_the_dispatcher_while_the_pool_runs(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """A polling fence begins its generation at ``start`` and marks progress after each empty long poll: both
    come from ``fence-dispatcher`` (before: ``start``'s caller and ``fence-poller`` wrote them directly); the
    generation's end, written by ``join`` once the writer ended, runs on the joining thread."""
    store = ThreadsOfWrites(db)
    fence = make_fence(bot, store, workers=1)
    fence.handler(lambda update: None)
    fence.start()
    try:
        assert store.threads_of("begin_generation") == {"fence-dispatcher"}, store.calls
        # the start's own mark, then at least two empty long polls (0.3 s each)
        assert eventually(lambda: sum(1 for name, _ in store.calls if name == "mark_progress") >= 3), store.calls
    finally:
        stop(fence)
    assert store.threads_of("mark_progress") == {"fence-dispatcher"}, store.calls
    assert store.threads_of("end_generation") == {threading.current_thread().name}, store.calls
    assert store.stats()["generation"]["end_reason"] == "clean stop"


def test_the_webhook_door_s_generation_begins_on_the_dispatcher(api: FakeBotAPI, bot: telebot.TeleBot,
                                                                 db: str) -> None:
    """A fence serving ``webhook_app`` begins the webhook door's generation (and its first progress) through the
    writer: ``fence-dispatcher`` writes them (before: the thread that called ``start``)."""
    store = ThreadsOfWrites(db)
    fence = make_fence(bot, store, workers=1)
    fence.handler(lambda update: None)
    fence.webhook_app("writer-test-secret")
    fence.start()
    try:
        assert store.threads_of("begin_generation") == {"fence-dispatcher"}, store.calls
        assert store.threads_of("mark_progress") == {"fence-dispatcher"}, store.calls
        assert store.stats()["generation"]["door"] == "webhook"
    finally:
        stop(fence)
