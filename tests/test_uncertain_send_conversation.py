"""telebot's conversation idiom, ``msg = bot.send_message(chat, question)`` then
``bot.register_next_step_handler(msg, step)``, keeps going when the send is uncertain (the connection dropped after
Telegram carried the request out) or queued: the handler gets a stand-in message carrying the chat, on each backend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, stop
from pg_support import BACKENDS, store_of

from telegram_fence.calls.verdicts import stand_in
from telegram_fence.testing import FakeBotAPI


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with store_of(request.param, tmp_path, "tf_uncertain_send") as opened:
        yield opened


#: The running bot and what its steps were told, read by the module-level steps (kept by name).
_RUN: dict[str, Any] = {}


def color(message: telebot.types.Message) -> None:
    bot: telebot.TeleBot = _RUN["bot"]
    _RUN["answers"].append(("color", message.text))
    msg = bot.send_message(message.chat.id, "Favourite food?")
    bot.register_next_step_handler(msg, food)


def food(message: telebot.types.Message) -> None:
    _RUN["answers"].append(("food", message.text))


def _bot(token: str) -> telebot.TeleBot:
    bot = telebot.TeleBot(token, threaded=False)

    @bot.message_handler(commands=["start"])
    def start(message: telebot.types.Message) -> None:
        msg = bot.send_message(message.chat.id, "Favourite color?")
        _RUN["returned"].append(msg)
        bot.register_next_step_handler(msg, color)

    _RUN.update(bot=bot, answers=[], returned=[])
    return bot


def test_the_next_step_registers_on_the_message_an_uncertain_send_returned(store: Any) -> None:
    """'/start' asks "Favourite color?"; Telegram sends it but the connection drops before the answer (uncertain):
    the step still registers on the returned stand-in, so 'red' and 'pie' answer color and food, each question
    reaches the user once, and nothing is retried."""
    with FakeBotAPI(max_long_poll=0.3) as api:
        fence = make_fence(_bot(api.token), store)
        api.drop("sendMessage", 1, executed=True)
        fence.start()
        try:
            api.push_message(42, "/start")
            assert eventually(lambda: fence.stats()["settled"] >= 1, timeout=20)
            api.push_message(42, "red")
            assert eventually(lambda: fence.stats()["settled"] >= 2, timeout=20)
            api.push_message(42, "pie")
            assert eventually(lambda: fence.stats()["settled"] >= 3, timeout=20)
            stats = fence.stats()
        finally:
            stop(fence)
            answers, returned = _RUN["answers"], _RUN["returned"]
            _RUN.clear()
    assert answers == [("color", "red"), ("food", "pie")]
    assert [s.text for s in api.sent_to(42)] == ["Favourite color?", "Favourite food?"]
    (msg,) = returned
    assert (msg.chat.id, msg.message_id, msg.text) == (42, 0, "Favourite color?")
    assert stats["workers"]["retried"] == 0 and stats["calls"]["uncertain"] == 1


def test_stand_ins_carry_the_chat_for_every_call_that_answers_a_message() -> None:
    """A message-answering call gets a stand-in of its chat (its type from the id), a media group one per item,
    copyMessage a message id; a call without a numeric chat, or answering something else, gets no result."""
    result = json.loads(stand_in("sendPhoto", {"chat_id": "-1001", "caption": "c"}))["result"]
    assert result == {"message_id": 0, "date": 0, "chat": {"id": -1001, "type": "supergroup"}, "caption": "c"}
    group = json.loads(stand_in("sendMediaGroup", {"chat_id": 7, "media": json.dumps([{}, {}, {}])}))["result"]
    assert [m["chat"] for m in group] == [{"id": 7, "type": "private"}] * 3
    assert json.loads(stand_in("copyMessage", {"chat_id": -5}))["result"] == {"message_id": 0}
    assert json.loads(stand_in("sendMessage", {"chat_id": "@channel"}))["result"] is None
    assert json.loads(stand_in("sendChatAction", {"chat_id": 7}))["result"] is None
    assert telebot.types.Message.de_json(json.loads(stand_in("sendMessage", {"chat_id": -5}))["result"]).chat.type \
        == "group"


def test_a_step_registers_on_the_stand_in_of_a_queued_reply(store: Any) -> None:
    """A question sent inside ``queue_calls()`` (sent after the commit) returns the stand-in of its chat: the step
    registered on it takes the chat's next message."""
    from telegram_fence import queue_calls

    with FakeBotAPI(max_long_poll=0.3) as api:
        bot = _bot(api.token)
        fence = make_fence(bot, store)

        @fence.attempt_handler
        def ask(update: Any, ctx: Any) -> None:
            if update.message.text != "/start":
                bot.process_new_updates([update])
                return
            with ctx.transaction(complete=True), queue_calls():
                msg = bot.send_message(update.message.chat.id, "Favourite color?")
                bot.register_next_step_handler(msg, color)

        fence.start()
        try:
            api.push_message(42, "/start")
            # the user answers once the question has arrived (it leaves after the commit that settles /start)
            assert eventually(lambda: [s.text for s in api.sent_to(42)] == ["Favourite color?"], timeout=20)
            api.push_message(42, "red")
            assert eventually(lambda: ("color", "red") in _RUN["answers"], timeout=20)
        finally:
            stop(fence)
            answers = _RUN["answers"]
            _RUN.clear()
    assert answers == [("color", "red")]
    assert [s.text for s in api.sent_to(42)] == ["Favourite color?", "Favourite food?"]


def test_a_handler_catching_call_uncertain_keeps_its_conversation_by_chat(store: Any) -> None:
    """With uncertain_calls="raise" the uncertain question raises CallUncertain; the handler that catches it and
    registers the step by chat id keeps the conversation: 'red' answers color."""
    from telegram_fence import CallUncertain

    with FakeBotAPI(max_long_poll=0.3) as api:
        bot = _bot(api.token)
        bot.message_handlers.clear()

        @bot.message_handler(commands=["start"])
        def start(message: telebot.types.Message) -> None:
            try:
                msg = bot.send_message(message.chat.id, "Favourite color?")
            except CallUncertain:
                bot.register_next_step_handler_by_chat_id(message.chat.id, color)
            else:
                bot.register_next_step_handler(msg, color)

        fence = make_fence(bot, store, uncertain_calls="raise")
        api.drop("sendMessage", 1, executed=True)
        fence.start()
        try:
            api.push_message(42, "/start")
            assert eventually(lambda: fence.stats()["settled"] >= 1, timeout=20)
            api.push_message(42, "red")
            assert eventually(lambda: ("color", "red") in _RUN["answers"], timeout=20)
        finally:
            stop(fence)
            _RUN.clear()
    assert [s.text for s in api.sent_to(42)] == ["Favourite color?", "Favourite food?"]
