"""The runtime's threads under store failures, and what they log: real fences, SQLite files, HTTP and threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually

from telegram_fence import Fence, Identity, SqliteUpdateStore, StoreUnavailable
from telegram_fence.testing import FakeBotAPI


@pytest.fixture
def api() -> Iterator[FakeBotAPI]:
    with FakeBotAPI(max_long_poll=0.3) as server:
        yield server


@pytest.fixture
def bot(api: FakeBotAPI) -> telebot.TeleBot:
    return telebot.TeleBot(api.token, threaded=False)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "bot.db")


def make_fence(bot: telebot.TeleBot, store: Any, **options: Any) -> Fence:
    options.setdefault("long_poll_timeout", 0.3)
    options.setdefault("lease", 2.0)
    options.setdefault("shutdown_timeout", 3.0)
    return Fence(bot, store, **options)


def stop(fence: Fence) -> None:
    fence.stop()
    assert fence.join(10), "the fence did not shut down within its bound"


class ReleaseFailsOnce(SqliteUpdateStore):
    """A real SQLite store whose first ``release`` of a timed-out attempt raises ``StoreUnavailable``."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.failed: list[Identity] = []

    def release(self, identity: Identity, *, attempt_counts: bool = True) -> bool:
        if attempt_counts and not self.failed:
            self.failed.append(identity)
            raise StoreUnavailable("injected: the database stayed locked past the busy timeout")
        return super().release(identity, attempt_counts=attempt_counts)


def test_failed_release_of_a_timed_out_handler_still_replaces_the_worker(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """When ending a timed-out handler's lease fails, a replacement worker still starts: with one worker, the
    other chats' updates are handled, and the stuck update itself again once its lease lapsed."""
    store = ReleaseFailsOnce(db)
    unblock = threading.Event()
    handled: list[tuple[int, int]] = []
    fence = make_fence(bot, store, workers=1, lease=1.0, handler_timeout=0.3)

    @fence.attempt_handler
    def handle(update: telebot.types.Update, ctx: Any) -> None:
        if update.message.text == "stuck" and ctx.attempt == 1:
            unblock.wait(20)
            return
        handled.append((update.update_id, ctx.attempt))

    fence.start()
    stuck = api.push_message(1, "stuck")
    try:
        assert eventually(lambda: fence.stats()["workers"]["timeouts"] == 1, timeout=10)
        others = [api.push_message(chat, "hello") for chat in (2, 3)]
        assert eventually(lambda: {u for u, _ in handled} >= set(others), timeout=10), handled
        assert eventually(lambda: (stuck, 2) in handled, timeout=10), handled
        assert fence.stats()["workers"]["alive"] == 1
        assert store.failed and store.failed[0].update_id == stuck
    finally:
        unblock.set()
        stop(fence)
