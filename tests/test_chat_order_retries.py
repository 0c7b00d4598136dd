"""A chat's updates are handled in order, retries included: an update waiting for its retry keeps its chat's later
updates behind it, on each backend and through each door; other chats go on meanwhile, and exhaustion releases
the chat."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, stop
from pg_support import DSN, fresh_tables, new_table, requires_pg
from webhook_support import SECRET, TOKEN, post, update

from telegram_fence import SqliteUpdateStore
from telegram_fence.ingress.webhook import WsgiServer
from telegram_fence.testing import FakeBotAPI

#: The seconds a failed step waits for its retry: long enough for the chat's next message to arrive meanwhile.
RETRY_DELAY = 1.5


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_pg)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        yield SqliteUpdateStore(tmp_path / "bot.db")
        return
    from telegram_fence.store.postgres import PostgresUpdateStore

    with fresh_tables() as made:
        made.append(new_table("tf_chat_order"))
        s = PostgresUpdateStore(DSN, table=made[0], pool_size=4)
        yield s
        s.close()


class Story:
    """What the conversation's steps saw, and the event of the name step's first (failing) attempt."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, int, str]] = []
        self.failed = threading.Event()
        self.other: list[str] = []


#: The running story, read by the module-level steps (kept by name, as a restart would find them).
_STORY: dict[str, Any] = {}


def ask_name(message: telebot.types.Message) -> None:
    story: Story = _STORY["story"]
    if not story.failed.is_set():
        story.failed.set()
        raise RuntimeError("the name step fails once, a passing failure")
    story.answers.append(("name", message.chat.id, message.text or ""))
    _STORY["bot"].register_next_step_handler(message, ask_age)


def ask_age(message: telebot.types.Message) -> None:
    _STORY["story"].answers.append(("age", message.chat.id, message.text or ""))


def _bot(token: str, story: Story) -> telebot.TeleBot:
    bot = telebot.TeleBot(token, threaded=False)

    @bot.message_handler(commands=["start"])
    def start(message: telebot.types.Message) -> None:
        bot.register_next_step_handler(message, ask_name)

    @bot.message_handler(func=lambda message: True)
    def other(message: telebot.types.Message) -> None:
        story.other.append(message.text or "")

    _STORY["bot"], _STORY["story"] = bot, story
    return bot


def _retry(error: BaseException, attempt: int) -> float:
    return RETRY_DELAY


def test_an_answer_arriving_while_a_step_waits_for_its_retry_polling(store: Any) -> None:
    """Polling: '/start', then 'Ann' whose step fails once; '30' arrives while 'Ann' waits for its retry and runs
    after it: name 'Ann', age '30'. Another chat is answered meanwhile."""
    story = Story()
    with FakeBotAPI(max_long_poll=0.3) as api:
        fence = make_fence(_bot(api.token, story), store, retry=_retry)
        fence.start()
        try:
            api.push_message(42, "/start")
            assert eventually(lambda: fence.stats()["settled"] >= 1, timeout=20)
            api.push_message(42, "Ann")
            assert story.failed.wait(20)
            api.push_message(42, "30")
            api.push_message(43, "hello")
            assert eventually(lambda: story.other == ["hello"], timeout=20)
            assert story.answers == [], "the chat's later answer ran while its earlier one waited for its retry"
            assert eventually(lambda: len(story.answers) == 2, timeout=20)
        finally:
            stop(fence)
            _STORY.clear()
    assert story.answers == [("name", 42, "Ann"), ("age", 42, "30")]


def test_an_answer_arriving_while_a_step_waits_for_its_retry_webhook(store: Any) -> None:
    """Webhook: the same story delivered to the fence's WSGI app: name 'Ann', age '30'."""
    story = Story()
    fence = make_fence(_bot(TOKEN, story), store, retry=_retry)
    app = fence.webhook_app(SECRET)
    fence.start()
    server = WsgiServer(app, "127.0.0.1", 0)
    server.start()
    try:
        assert post(server.port, json.dumps(update(1001, chat=42, text="/start")))[0] == 200
        assert eventually(lambda: fence.stats()["settled"] >= 1, timeout=20)
        assert post(server.port, json.dumps(update(1002, chat=42, text="Ann")))[0] == 200
        assert story.failed.wait(20)
        assert post(server.port, json.dumps(update(1003, chat=42, text="30")))[0] == 200
        assert post(server.port, json.dumps(update(1004, chat=43, text="hello")))[0] == 200
        assert eventually(lambda: story.other == ["hello"], timeout=20)
        assert story.answers == [], "the chat's later answer ran while its earlier one waited for its retry"
        assert eventually(lambda: len(story.answers) == 2, timeout=20)
    finally:
        server.stop()
        stop(fence)
        _STORY.clear()
    assert story.answers == [("name", 42, "Ann"), ("age", 42, "30")]


def test_exhaustion_releases_the_chat(store: Any) -> None:
    """A step that fails on every attempt holds its chat until its attempts are spent; then the chat's next
    message runs (as a plain message: the failed step was never taken)."""
    tries: list[str] = []
    seen: list[tuple[str, int]] = []
    with FakeBotAPI(max_long_poll=0.3) as api:
        bot = telebot.TeleBot(api.token, threaded=False)

        @bot.message_handler(func=lambda message: True)
        def echo(message: telebot.types.Message) -> None:
            if message.text == "boom":
                tries.append("boom")
                raise RuntimeError("always fails")
            seen.append((message.text or "", len(tries)))

        fence = make_fence(bot, store, retry=lambda error, attempt: 0.3, max_attempts=3)
        fence.start()
        try:
            api.push_message(42, "boom")
            api.push_message(42, "after")
            assert eventually(lambda: bool(seen), timeout=20)
        finally:
            stop(fence)
    assert seen == [("after", 3)]


def test_a_failed_step_holds_the_answers_that_arrived_with_it(store: Any) -> None:
    """'Ann' and '30' arrive in one getUpdates batch (stored, and 'Ann' claimed, together): 'Ann' fails once, so
    '30' waits for its retry instead of running next: name 'Ann', age '30'."""
    story = Story()
    with FakeBotAPI(max_long_poll=0.3) as api:
        fence = make_fence(_bot(api.token, story), store, retry=_retry)
        fence.start()
        try:
            api.push_message(42, "/start")
            assert eventually(lambda: fence.stats()["settled"] >= 1, timeout=20)
            api.push_message(42, "Ann")
            api.push_message(42, "30")
            assert eventually(lambda: len(story.answers) == 2, timeout=20)
        finally:
            stop(fence)
            _STORY.clear()
    assert story.answers == [("name", 42, "Ann"), ("age", 42, "30")]
