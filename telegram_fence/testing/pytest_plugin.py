"""pytest fixtures for bots built on telegram_fence (the ``pytest11`` entry point): ``fake_bot_api``, ``fake_bot`` and
``fence_store``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .fake_api import FakeBotAPI

__all__ = ["fake_bot", "fake_bot_api", "fence_store"]


@pytest.fixture
def fake_bot_api() -> Iterator[FakeBotAPI]:
    """A running fake Bot API server, installed as telebot's server for the test's duration."""
    with FakeBotAPI() as api:
        yield api


@pytest.fixture
def fake_bot(fake_bot_api: FakeBotAPI) -> Any:
    """A non-threaded ``telebot.TeleBot`` for the fake (its handlers are done when ``process_new_updates`` returns)."""
    import telebot

    return telebot.TeleBot(fake_bot_api.token, threaded=False)


@pytest.fixture
def fence_store(tmp_path: Path) -> Iterator[Any]:
    """A ``SqliteUpdateStore`` on a fresh file in ``tmp_path``, closed after the test."""
    from telegram_fence.store import SqliteUpdateStore  # lazy: the plugin must import without the store

    with SqliteUpdateStore(tmp_path / "fence.db") as store:
        yield store
