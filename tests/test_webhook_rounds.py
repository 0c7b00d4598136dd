"""Behind the webhook, the writer takes each group when its round begins, records it and claims its updates in the
same transaction, and a round that fails still answers every delivery of its group.

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
    """A real SQLite store that notes the thread of each ``record`` call, and can be armed to
    fail its next ``exchange`` (a round's settle and claim) made while a webhook delivery waits to be taken
    (``waiting()`` > 0) with a :class:`StoreError`."""

    def __init__(self, path: str) -> None:
        super().__init__(path, ("record",))
        self.fail_next_exchange = threading.Event()
        self.failed = threading.Event()
        self.waiting: Callable[[], int] = lambda: 0

    def exchange(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail_next_exchange.is_set() and self.waiting() > 0:
            self.fail_next_exchange.clear()
            self.failed.set()
            raise StoreError("the test's armed failure of a round's settle and claim")
        return super().exchange(*args, **kwargs)


def test_behind_the_webhook_groups_are_recorded_by_the_writer_and_handled_on_workers(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """A running fence's webhook groups are recorded on ``fence-dispatcher`` (no other thread records) and their
    handlers run on the worker threads; every delivery is answered 200 after it is stored and handled once."""
    store = NotingStore(db)
    handled: list[tuple[int, str]] = []
    fence = make_fence(bot, store, workers=2)
    fence.handler(lambda update: handled.append((update.update_id, threading.current_thread().name)))
    app = fence.webhook_app(SECRET)
    fence.start()
    deliver = webhook_deliverer(app, SECRET, chats=7, stored=store.stored)  # a 200 only once on disk
    try:
        for wave in range(6):
            with ThreadPoolExecutor(8, thread_name_prefix="test-request") as pool:
                answers = list(pool.map(deliver, range(1 + wave * 20, 21 + wave * 20)))
            assert all(answer.startswith("200") for answer in answers), answers
            assert eventually(lambda n=wave: len(handled) == 20 * (n + 1), timeout=15), handled
    finally:
        stop(fence)
    assert sorted(update_id for update_id, _ in handled) == list(range(1, 121))
    assert store.threads_of("record") == {"fence-dispatcher"}, store.calls
    assert {thread for _, thread in handled} <= {"fence-worker-1", "fence-worker-2"}, handled


def test_a_round_that_fails_while_deliveries_wait_still_answers_them(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """When a round's settle and claim raises while webhook deliveries wait, the deliveries it took are recorded
    again each on its own and answered 200 (none waits for a round that never answers it), and each update is
    handled once."""
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


def test_a_bad_delivery_sharing_a_round_fails_only_its_own_request(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """Deliveries recorded in one round of the writer each run in a savepoint of their own: the one whose capture
    raises is answered 500 and not stored, the others of the same round 200, stored and handled once."""
    in_first = threading.Event()
    release = threading.Event()

    def capture(conn: Any, new_updates: list[Any]) -> None:
        ids = {u["update_id"] for u in new_updates}
        if 1 in ids:
            in_first.set()
            assert release.wait(20)
        if 13 in ids:
            raise ValueError("this update cannot be captured")

    store = NotingStore(db)
    handled: list[int] = []
    fence = make_fence(bot, store, capture=capture)
    fence.handler(lambda update: handled.append(update.update_id))
    app = fence.webhook_app(SECRET)
    fence.start()
    deliver = webhook_deliverer(app, SECRET, chats=7, stored=store.stored)
    pool = ThreadPoolExecutor(8, thread_name_prefix="test-request")
    try:
        first = pool.submit(deliver, 1)
        assert in_first.wait(10)
        later = {n: pool.submit(deliver, n) for n in range(10, 16)}
        assert eventually(lambda: app.stats()["waiting"] == 7)  # all six wait behind the round holding update 1
        release.set()
        answers = {n: future.result(timeout=20).split()[0] for n, future in later.items()}
        assert first.result(timeout=20).startswith("200")
        assert answers == {10: "200", 11: "200", 12: "200", 13: "500", 14: "200", 15: "200"}
        assert eventually(lambda: sorted(handled) == [1, 10, 11, 12, 14, 15], timeout=15), handled
        assert not store.stored(13)
    finally:
        release.set()
        pool.shutdown(wait=False)
        stop(fence)
