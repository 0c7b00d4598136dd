"""A conversation under a running fence on each backend and through each door: its steps see the states the
earlier steps set, a failed attempt's change is not seen by its retry, and the states are in the store after."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, stop
from pg_support import DSN, fresh_tables, new_table, requires_pg
from telebot import custom_filters
from webhook_support import SECRET, TOKEN, post, update

from telegram_fence import SqliteUpdateStore
from telegram_fence.conversation.sql import list_states, list_steps
from telegram_fence.ingress.webhook import WsgiServer
from telegram_fence.testing import FakeBotAPI

STEPS = ["/start", "Ann", "30"]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_pg)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        yield SqliteUpdateStore(tmp_path / "bot.db")
        return
    from telegram_fence.store.postgres import PostgresUpdateStore

    with fresh_tables() as made:
        made.append(new_table("tf_states_door"))
        s = PostgresUpdateStore(DSN, table=made[0], pool_size=4)
        yield s
        s.close()


def _bot(token: str, seen: list[tuple[str, Any, Any]], failed: list[int]) -> telebot.TeleBot:
    bot = telebot.TeleBot(token, threaded=False)

    @bot.message_handler(commands=["start"])
    def start(message: telebot.types.Message) -> None:
        bot.set_state(message.from_user.id, "name", message.chat.id)
        seen.append(("start", None, None))

    @bot.message_handler(state="name")
    def name(message: telebot.types.Message) -> None:
        before = bot.get_state(message.from_user.id, message.chat.id)
        bot.set_state(message.from_user.id, "age", message.chat.id)
        bot.add_data(message.from_user.id, message.chat.id, name=message.text)
        seen.append(("name", before, message.text))
        if not failed:
            failed.append(message.message_id)
            raise RuntimeError("the first attempt of the name step fails after changing the state")

    @bot.message_handler(state="age")
    def age(message: telebot.types.Message) -> None:
        with bot.retrieve_data(message.from_user.id, message.chat.id) as data:
            seen.append(("age", data.get("name"), message.text))
            data["age"] = int(message.text or "0")

    bot.add_custom_filter(custom_filters.StateFilter(bot))
    return bot


def _check(store: Any, seen: list[tuple[str, Any, Any]]) -> None:
    assert seen == [("start", None, None), ("name", "name", "Ann"), ("name", "name", "Ann"), ("age", "Ann", "30")]
    with store.write() as conn:
        states = list_states(conn)
        assert list_steps(conn) == []
    assert [(s["chat_id"], s["state"], s["data"]) for s in states] == [(42, "age", {"name": "Ann", "age": 30})]


def test_a_conversation_through_the_poller(store: Any) -> None:
    """Polling: three steps, the second failing once; the retry sees the old state, the third the second's data."""
    seen: list[tuple[str, Any, Any]] = []
    failed: list[int] = []
    with FakeBotAPI(max_long_poll=0.3) as api:
        fence = make_fence(_bot(api.token, seen, failed), store, retry=lambda error, attempt: 0.0)
        fence.start()
        try:
            for index, text in enumerate(STEPS, 1):
                api.push_message(42, text)
                assert eventually(lambda n=index: fence.stats()["settled"] >= n, timeout=20)
        finally:
            stop(fence)
    _check(store, seen)


def test_a_conversation_through_the_webhook(store: Any) -> None:
    """Webhook: the same conversation delivered to the fence's WSGI app gives the same steps and stored state."""
    seen: list[tuple[str, Any, Any]] = []
    failed: list[int] = []
    fence = make_fence(_bot(TOKEN, seen, failed), store, retry=lambda error, attempt: 0.0)
    app = fence.webhook_app(SECRET)
    fence.start()
    server = WsgiServer(app, "127.0.0.1", 0)
    server.start()
    try:
        for index, text in enumerate(STEPS, 1):
            assert post(server.port, json.dumps(update(1000 + index, chat=42, text=text)))[0] == 200
            assert eventually(lambda n=index: fence.stats()["settled"] >= n, timeout=20)
    finally:
        server.stop()
        stop(fence)
    _check(store, seen)


#: What the next-step callbacks below saw: (step, chat, text); module level, so the steps are kept by name.
STEPPED: list[tuple[str, int, str]] = []


def took_name(message: telebot.types.Message, bot: str) -> None:
    STEPPED.append(("name", message.chat.id, message.text or ""))
    _BOTS[bot].register_next_step_handler(message, took_age, bot)


def took_age(message: telebot.types.Message, bot: str) -> None:
    STEPPED.append(("age", message.chat.id, message.text or ""))


_BOTS: dict[str, telebot.TeleBot] = {}


def test_steps_registered_in_one_batch_take_the_next_messages_of_it(store: Any) -> None:
    """Once the fence runs (a first message handled), three messages of chat 42 and two of chat 43 arrive in one
    getUpdates batch (on SQLite claimed in one round): '/start' registers a next-step handler, which takes 42's next
    message and registers the one after; chat 43, with no conversation, goes to the plain handler every time."""
    STEPPED.clear()
    plain: list[tuple[int, str]] = []
    with FakeBotAPI(max_long_poll=0.3) as api:
        bot = _BOTS["doors"] = telebot.TeleBot(api.token, threaded=False)

        @bot.message_handler(commands=["start"])
        def start(message: telebot.types.Message) -> None:
            bot.register_next_step_handler(message, took_name, "doors")

        @bot.message_handler(func=lambda message: True)
        def other(message: telebot.types.Message) -> None:
            plain.append((message.chat.id, message.text or ""))

        fence = make_fence(bot, store)
        fence.start()
        try:
            api.push_message(41, "warm")
            assert eventually(lambda: fence.stats()["settled"] >= 1, timeout=20)
            for chat, text in [(42, "/start"), (43, "a"), (42, "Ann"), (43, "b"), (42, "30")]:
                api.push_message(chat, text)
            assert eventually(lambda: fence.stats()["settled"] >= 6, timeout=20)
        finally:
            stop(fence)
            _BOTS.clear()
    assert STEPPED == [("name", 42, "Ann"), ("age", 42, "30")]
    assert plain == [(41, "warm"), (43, "a"), (43, "b")]
