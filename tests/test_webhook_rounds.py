"""Behind the webhook, the dispatcher takes each group late in its round: after the settle and claim, claimed as its
updates are inserted, fast handlers run on the dispatcher (as behind the poller), and a round that fails before it
took the group still answers every delivery of it.

Real fences on real SQLite files (a ``SqliteUpdateStore`` that notes the runtime's calls), WSGI calls from several
request threads at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import telebot
from helpers import ThreadNotingStore, eventually, make_fence, stop, webhook_deliverer

from telegram_fence import StoreError
from telegram_fence.testing import FakeBotAPI

SECRET = "rounds-test-secret"


class NotingStore(ThreadNotingStore):
    """A real SQLite store that notes the thread of each ``record``/``record_and_claim`` call, and can be armed to
    fail its next ``exchange`` (a round's settle and claim) made while a webhook delivery waits to be taken
    (``waiting()`` > 0) with a :class:`StoreError`."""

    def __init__(self, path: str) -> None:
        super().__init__(path, ("record", "record_and_claim"))
        self.fail_next_exchange = threading.Event()
        self.failed = threading.Event()
        self.waiting: Callable[[], int] = lambda: 0

    def exchange(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail_next_exchange.is_set() and self.waiting() > 0:
            self.fail_next_exchange.clear()
            self.failed.set()
            raise StoreError("the test's armed failure of a round's settle and claim")
        return super().exchange(*args, **kwargs)


def test_behind_the_webhook_fast_handlers_run_on_the_dispatcher_and_groups_are_claimed_as_stored(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """Once its handlers are measured fast, a running fence's webhook groups are recorded and claimed in one call
    (``record_and_claim``, on ``fence-dispatcher``) and their handlers run on the dispatcher, not on the workers;
    every delivery is answered 200 after it is stored and handled once."""
    store = NotingStore(db)
    handled: list[tuple[int, str]] = []
    fence = make_fence(bot, store, workers=2)
    fence.handler(lambda update: handled.append((update.update_id, threading.current_thread().name)))
    app = fence.webhook_app(SECRET)
    fence.start()
    deliver = webhook_deliverer(app, SECRET, chats=7, stored=store.stored)  # a 200 only once on disk
    try:
        for wave in range(6):  # the first handlers run on the workers (nothing measured yet); then inline
            with ThreadPoolExecutor(8, thread_name_prefix="test-request") as pool:
                answers = list(pool.map(deliver, range(1 + wave * 20, 21 + wave * 20)))
            assert all(answer.startswith("200") for answer in answers), answers
            assert eventually(lambda n=wave: len(handled) == 20 * (n + 1), timeout=15), handled
    finally:
        stop(fence)
    assert sorted(update_id for update_id, _ in handled) == list(range(1, 121))
    assert store.threads_of("record", "record_and_claim") == {"fence-dispatcher"}, store.calls
    assert store.threads_of("record_and_claim"), store.calls  # the groups' updates claimed as they were stored
    on_dispatcher = [update_id for update_id, thread in handled if thread == "fence-dispatcher"]
    assert len(on_dispatcher) >= 40, handled  # the later waves ran inline


def test_a_round_that_fails_before_taking_the_webhook_group_still_answers_it(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """When a round's settle and claim raises before the round took the webhook group waiting for it, the group is
    taken and failed with the round, so its deliveries are recorded one by one and answered 200 (none waits for a
    round that never takes it), and each update is handled once."""
    store = NotingStore(db)
    handled: list[int] = []
    fence = make_fence(bot, store, workers=2)
    fence.handler(lambda update: handled.append(update.update_id))
    app = fence.webhook_app(SECRET)
    store.waiting = lambda: int(app.stats()["waiting"])  # deliveries queued, not taken by a round yet
    fence.start()
    deliver = webhook_deliverer(app, SECRET, chats=7, stored=store.stored)  # a 200 only once on disk
    try:
        assert deliver(1).startswith("200")
        assert eventually(lambda: handled == [1], timeout=15), handled
        store.fail_next_exchange.set()
        pool = ThreadPoolExecutor(8, thread_name_prefix="test-request")
        try:  # bounded: a delivery left in a group no round takes would wait for ever
            answers = [future.result(timeout=20) for future in [pool.submit(deliver, n) for n in range(2, 22)]]
        finally:
            pool.shutdown(wait=False)
        assert store.failed.is_set()
        assert all(answer.startswith("200") for answer in answers), answers
        assert eventually(lambda: sorted(handled) == list(range(1, 22)), timeout=15), handled
    finally:
        stop(fence)
