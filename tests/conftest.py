"""Project-wide test settings and the fixtures most fence tests share (a module may define its own of the same name).

More fixtures come from telegram_fence's own pytest plugin (fake_bot_api, ...).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import telebot

from telegram_fence.testing import FakeBotAPI

sys.path.insert(0, os.path.dirname(__file__))

#: Long forms of the soak tests run with TF_SOAK=1; CI runs their short forms.
SOAK = os.environ.get("TF_SOAK") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``postgres`` every test named for PostgreSQL (``test_postgres_*.py``, the ``[postgres]`` cases), so CI
    can run them as a run of their own (``-m postgres``); nothing else changes for them."""
    for item in items:
        if "postgres" in item.nodeid:
            item.add_marker(pytest.mark.postgres)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Escape lone surrogates in a report's captured output (tests feed the bot half an emoji on purpose), so a
    report travels between processes (``pytest -n``) as UTF-8; the text a reader sees is otherwise the same."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    report.sections = [
        (name, text.encode("utf-8", "backslashreplace").decode("utf-8")) for name, text in report.sections
    ]


@pytest.fixture
def api() -> Iterator[FakeBotAPI]:
    """A fake Bot API server whose long polls last at most 0.3 s (so fences stop fast)."""
    with FakeBotAPI(max_long_poll=0.3) as server:
        yield server


@pytest.fixture
def bot(api: FakeBotAPI) -> telebot.TeleBot:
    """A non-threaded telebot holding ``api``'s token (a fence takes it as it takes a default threaded one)."""
    return telebot.TeleBot(api.token, threaded=False)


@pytest.fixture
def db(tmp_path: Path) -> str:
    """The path of a fresh database file in the test's own directory."""
    return str(tmp_path / "bot.db")
