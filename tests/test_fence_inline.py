"""Handlers that take microseconds run on the dispatcher itself: order, exclusivity, and the hand-over.

Real HTTP against the fake Bot API server, real SQLite files, real threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually

from telegram_fence import Fence, SqliteUpdateStore
from telegram_fence.testing import FakeBotAPI


@pytest.fixture
def api() -> Iterator[FakeBotAPI]:
    with FakeBotAPI(max_long_poll=0.3) as server:
        yield server


@pytest.fixture
def bot(api: FakeBotAPI) -> telebot.TeleBot:
    return telebot.TeleBot(api.token, threaded=False)


def make_fence(bot: telebot.TeleBot, db: Path, **options: Any) -> Fence:
    options.setdefault("long_poll_timeout", 0.3)
    options.setdefault("lease", 2.0)
    options.setdefault("shutdown_timeout", 3.0)
    return Fence(bot, str(db), **options)


def stop(fence: Fence) -> None:
    fence.stop()
    assert fence.join(10), "the fence did not shut down within its bound"


def test_fast_handlers_run_inline_in_order_and_never_side_by_side(
    api: FakeBotAPI, bot: telebot.TeleBot, tmp_path: Path
) -> None:
    """Microsecond handlers switch the pool to inline mode; every chat still runs in update_id order,
    one update at a time, and every update is handled exactly once."""
    running: dict[int, int] = {}
    order: dict[int, list[int]] = {}
    overlap: list[int] = []
    threads: set[str] = set()
    lock = threading.Lock()
    fence = make_fence(bot, tmp_path / "bot.db", workers=4)

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        chat = update.message.chat.id
        with lock:
            running[chat] = running.get(chat, 0) + 1
            if running[chat] > 1:
                overlap.append(chat)
            order.setdefault(chat, []).append(update.update_id)
            threads.add(threading.current_thread().name)
            running[chat] -= 1

    fence.start()
    api.push_messages(3000, chats=list(range(1, 8)))
    try:
        assert eventually(lambda: sum(len(v) for v in order.values()) == 3000, timeout=30)
        assert fence.stats()["workers"]["inline"]
    finally:
        stop(fence)
    assert overlap == []
    for ids in order.values():
        assert ids == sorted(ids) and len(ids) == len(set(ids))
    assert "fence-dispatcher" in threads  # most ran inline; the first ones (before measuring) on workers
    with SqliteUpdateStore(tmp_path / "bot.db") as store:
        stats = store.stats()
    assert (stats["settled"], stats["pending"], stats["claimed"]) == (3000, 0, 0)


def test_a_handler_stalling_on_the_dispatcher_hands_its_job_to_a_new_thread(
    api: FakeBotAPI, bot: telebot.TeleBot, tmp_path: Path
) -> None:
    """Once the pool runs handlers inline, one that blocks stops only its own chat: the heartbeat starts
    a new dispatcher, other chats keep being handled, the blocked update is settled when it returns,
    and later updates of its chat wait for it."""
    release = threading.Event()
    stuck_at: list[int] = []
    handled: list[tuple[int, int]] = []
    lock = threading.Lock()
    fence = make_fence(bot, tmp_path / "bot.db", workers=2)

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        message = update.message
        if message.text == "block":
            stuck_at.append(update.update_id)
            release.wait(20)
        with lock:
            handled.append((message.chat.id, update.update_id))

    fence.start()
    api.push_messages(400, chats=[1, 2, 3])
    try:
        assert eventually(lambda: len(handled) == 400, timeout=30)
        assert fence.stats()["workers"]["inline"], "fast handlers should have switched the pool to inline mode"
        blocked = api.push_message(1, "block")
        after = api.push_messages(5, chats=[1])
        others = api.push_messages(60, chats=[2, 3])
        assert eventually(lambda: stuck_at == [blocked], timeout=10)
        # The other chats are served while chat 1's handler blocks on the dispatcher's old thread.
        assert eventually(lambda: sum(1 for _, u in handled if u in others) == 60, timeout=15)
        assert fence.stats()["workers"]["handovers"] == 1
        assert not any(u in after for _, u in handled)  # chat 1 waits for its blocked update
        release.set()
        assert eventually(lambda: len(handled) == 400 + 1 + 5 + 60, timeout=15)
        assert eventually(lambda: fence.stats()["settled"] == 466, timeout=10)
    finally:
        release.set()
        stop(fence)
    chat1 = [u for chat, u in handled if chat == 1]
    assert chat1 == sorted(chat1) and len(chat1) == len(set(chat1))
    assert len(handled) == len(set(handled))
