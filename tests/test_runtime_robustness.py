"""The runtime's threads under store failures, and what they log: real fences, SQLite files, HTTP and threads."""

from __future__ import annotations

import logging
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


def test_a_failing_handler_logs_update_attempt_and_error_in_the_message(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failure logs one line naming the update, the attempt and ``ValueError: ...`` in the message text
    itself (the extra fields kept); the exhaustion's line carries the traceback."""
    caplog.set_level(logging.WARNING, logger="telegram_fence.workers")
    fence = make_fence(bot, db, max_attempts=2, retry=lambda error, attempt: 0.0)

    @bot.message_handler(func=lambda m: True)
    def fail(message: telebot.types.Message) -> None:
        raise ValueError(f"no notes table for chat {message.chat.id}")

    fence.start()
    update_id = api.push_message(5, "hi")
    try:
        assert eventually(lambda: fence.stats()["workers"]["exhausted"] == 1, timeout=15)
    finally:
        stop(fence)
    records = [r for r in caplog.records if r.name == "telegram_fence.workers"]
    [retry] = [r for r in records if "will retry" in r.getMessage()]
    assert f"update {update_id}" in retry.getMessage()
    assert "attempt 1" in retry.getMessage()
    assert "ValueError: no notes table for chat 5" in retry.getMessage()
    assert (retry.update_id, retry.attempt) == (update_id, 1)  # type: ignore[attr-defined]
    [exhausted] = [r for r in records if "exhausted" in r.getMessage()]
    assert exhausted.levelno == logging.ERROR
    assert f"update {update_id} exhausted after attempt 2" in exhausted.getMessage()
    assert "ValueError: no notes table for chat 5" in exhausted.getMessage()
    assert exhausted.exc_info is not None and exhausted.exc_info[0] is ValueError
    assert "Traceback" in logging.Formatter().format(exhausted)
