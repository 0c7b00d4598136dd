"""The store against hostile answers and odd settings (issue 12): every accepted setting runs, a poison
update never stalls the inbox, the cursor never passes an unstored update, claims keep per-chat order,
renewals match the full identity, refused updates are never captured."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
import telebot
from helpers import eventually

from telegram_fence import Fence
from telegram_fence.store.sqlite import SqliteUpdateStore
from telegram_fence.testing import FakeBotAPI
from telegram_fence.testing.conformance import ManualClock

LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")


@pytest.fixture
def api() -> Iterator[FakeBotAPI]:
    with FakeBotAPI(max_long_poll=0.3) as server:
        yield server


@pytest.fixture
def bot(api: FakeBotAPI) -> telebot.TeleBot:
    return telebot.TeleBot(api.token, threaded=False)


def run_fence(bot: telebot.TeleBot, store: Any, **options: Any) -> Fence:
    options.setdefault("long_poll_timeout", 0.3)
    options.setdefault("lease", 5.0)
    options.setdefault("shutdown_timeout", 3.0)
    return Fence(bot, store, **options)


def stop(fence: Fence) -> None:
    fence.stop()
    assert fence.join(10), "the fence did not shut down within its bound"


def message(update_id: int, chat: int, text: str = "hi") -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {"message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"}, "text": text},
    }


# --- item 1: every synchronous combination the constructor accepts runs ----------------------------


@pytest.mark.parametrize(("synchronous", "work_synchronous"), list(itertools.product(LEVELS, LEVELS)))
def test_every_accepted_synchronous_combination_handles_updates(
    api: FakeBotAPI, bot: telebot.TeleBot, tmp_path: Path, synchronous: str, work_synchronous: str
) -> None:
    """A fence on a store with any pair of synchronous levels records its batches and handles every update."""
    store = SqliteUpdateStore(tmp_path / "bot.db", synchronous=synchronous, work_synchronous=work_synchronous)
    handled: list[int] = []

    @bot.message_handler(func=lambda m: True)
    def echo(message: telebot.types.Message) -> None:
        handled.append(message.message_id)

    ids = api.push_messages(12, chats=[1, 2, 3])
    fence = run_fence(bot, store)
    fence.start()
    try:
        assert eventually(lambda: len(handled) == len(ids), timeout=15), fence.stats()
    finally:
        stop(fence)
    assert store.stats()["settled"] == len(ids)
    store.close()


def test_durable_write_takes_the_stronger_level(tmp_path: Path) -> None:
    """write(durable=True) lets both record() and the work-level calls join it whichever level is stronger."""
    for synchronous, work_synchronous in (("NORMAL", "FULL"), ("FULL", "NORMAL"), ("OFF", "NORMAL")):
        store = SqliteUpdateStore(tmp_path / f"{synchronous}-{work_synchronous}.db", clock=ManualClock(),
                                  synchronous=synchronous, work_synchronous=work_synchronous)
        with store.write(durable=True):
            store.record([message(1, 1)], 2)
            settled, claims, _more = store.exchange([], 30.0, 5)
        assert settled == 0 and [c.update_id for c in claims] == [1]
        assert store.next_offset() == 2
        store.close()
