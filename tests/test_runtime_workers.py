"""Handler threads follow the work: they start as handlers are in flight, up to ``workers``, and end when idle; a
slow chat never holds another chat back, and every thread is named and joined at the stop."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, stop

from telegram_fence.runtime import workers as workers_module
from telegram_fence.testing import FakeBotAPI


def worker_threads() -> list[threading.Thread]:
    """The fence worker threads alive in this process."""
    return [t for t in threading.enumerate() if t.name.startswith("fence-worker-") and t.is_alive()]


def test_eight_chats_whose_handlers_block_all_run_at_once_with_default_settings(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """With the default settings, eight chats' handlers blocking on one event are all in flight together."""
    release = threading.Event()
    inside: set[int] = set()
    lock = threading.Lock()
    fence = make_fence(bot, db)

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        with lock:
            inside.add(update.message.chat.id)
        release.wait(20)

    api.push_messages(8, chats=list(range(1, 9)))
    fence.start()
    try:
        assert eventually(lambda: len(inside) == 8, timeout=10), inside
        assert fence.stats()["workers"]["running"] == 8
        release.set()
        assert eventually(lambda: fence.stats()["settled"] == 8)
    finally:
        release.set()
        stop(fence)


def test_a_fast_chat_is_handled_while_forty_other_chats_block(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """Forty chats whose handlers block do not delay a forty-first chat's update (default settings)."""
    release = threading.Event()
    fast_done = threading.Event()
    blocked: set[int] = set()
    lock = threading.Lock()
    fence = make_fence(bot, db)

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        chat = update.message.chat.id
        if chat == 99:
            fast_done.set()
            return
        with lock:
            blocked.add(chat)
        release.wait(30)

    api.push_messages(80, chats=list(range(1, 41)))  # two updates per blocked chat: the second waits behind the first
    fence.start()
    try:
        assert eventually(lambda: len(blocked) == 40, timeout=15), len(blocked)
        api.push_message(99, "fast")
        assert fast_done.wait(5), "the fast chat waited behind the blocked ones"
    finally:
        release.set()
        stop(fence)


def test_idle_worker_threads_end_and_new_ones_start_for_new_work(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker thread that waits IDLE_SECONDS without work ends; the next update starts a thread again."""
    monkeypatch.setattr(workers_module, "IDLE_SECONDS", 0.3)
    release = threading.Event()
    handled: list[int] = []
    fence = make_fence(bot, db)

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        release.wait(10)
        handled.append(update.update_id)

    api.push_messages(6, chats=list(range(1, 7)))
    fence.start()
    try:
        assert eventually(lambda: fence.stats()["workers"]["running"] == 6)
        assert len(worker_threads()) >= 6
        release.set()
        assert eventually(lambda: len(handled) == 6)
        assert eventually(lambda: not worker_threads(), timeout=5), [t.name for t in worker_threads()]
        assert fence.stats()["workers"]["alive"] == 0
        api.push_message(1, "again")
        assert eventually(lambda: len(handled) == 7)
    finally:
        release.set()
        stop(fence)


def test_workers_caps_the_threads_and_the_claims_in_flight(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """With workers=3, at most three handlers run and at most three updates are claimed at once, however many chats
    have work; the others wait in the store and all are handled once released."""
    release = threading.Event()
    fence = make_fence(bot, db, workers=3)
    peak = {"running": 0, "claimed": 0}

    @fence.handler
    def handle(update: telebot.types.Update) -> Any:
        stats = fence.stats()
        peak["running"] = max(peak["running"], stats["workers"]["running"])
        peak["claimed"] = max(peak["claimed"], stats["claimed"])
        return release.wait(10)

    api.push_messages(20, chats=list(range(1, 21)))
    fence.start()
    try:
        assert eventually(lambda: fence.stats()["workers"]["running"] == 3)
        assert not eventually(lambda: fence.stats()["workers"]["running"] > 3, timeout=0.5)
        assert fence.stats()["claimed"] <= 3
        assert len(worker_threads()) <= 3
        release.set()
        assert eventually(lambda: fence.stats()["settled"] == 20, timeout=15)
    finally:
        release.set()
        stop(fence)
    assert peak["running"] <= 3 and peak["claimed"] <= 3, peak


def test_every_fence_thread_is_named_and_joined_at_the_stop(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """After the join no thread the fence started is alive, and every one it started had a ``fence-`` name."""
    before = set(threading.enumerate())
    started: set[threading.Thread] = set()
    fence = make_fence(bot, db)
    fence.handler(lambda update: started.update(set(threading.enumerate()) - before))
    api.push_messages(30, chats=list(range(1, 11)))
    fence.start()
    assert eventually(lambda: fence.stats()["settled"] == 30)
    started |= set(threading.enumerate()) - before
    stop(fence)
    started = {t for t in started if not t.name.startswith("fake-bot-api")}  # the test server's, not the fence's
    assert all(t.name.startswith("fence-") for t in started), sorted(t.name for t in started)
    assert {t.name for t in started} >= {"fence-dispatcher", "fence-heartbeat", "fence-poller", "fence-worker-1"}
    assert not [t.name for t in started if t.is_alive()]
