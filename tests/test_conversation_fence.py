"""Conversations under a running fence: which of telebot's storages the fence replaces, and a state change that
commits with its update (or, when the handler raises, not at all)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, stop
from telebot import custom_filters
from telebot.handler_backends import MemoryHandlerBackend
from telebot.storage import StateMemoryStorage, StatePickleStorage

from telegram_fence import ConfigurationError, SqliteUpdateStore
from telegram_fence.conversation import FenceHandlerBackend, FenceStateStorage
from telegram_fence.conversation.sql import list_steps
from telegram_fence.testing import FakeBotAPI


def test_telebots_in_memory_defaults_are_replaced_and_said_once(
    bot: telebot.TeleBot, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Fence(bot, path) replaces StateMemoryStorage and both memory handler backends, with one INFO line."""
    assert type(bot.current_states) is StateMemoryStorage and type(bot.next_step_backend) is MemoryHandlerBackend
    with caplog.at_level(logging.INFO, logger="telegram_fence"):
        fence = make_fence(bot, db)
    lines = [r for r in caplog.records if "kept in the fence's store" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert isinstance(bot.current_states, FenceStateStorage)
    assert isinstance(bot.next_step_backend, FenceHandlerBackend) and bot.next_step_backend.kind == "next_step"
    assert isinstance(bot.reply_backend, FenceHandlerBackend) and bot.reply_backend.kind == "reply"
    first = bot.current_states
    fence.store.close()
    again = make_fence(bot, db)  # a second Fence on the same bot binds it to its own, open store
    assert bot.current_states is not first and bot.get_state(1, 1) is None
    again.store.close()


def test_a_storage_the_bot_configured_is_kept_unless_states_true(
    api: FakeBotAPI, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A bot with its own storage keeps it (said at INFO), but not telebot's file-saved next-step handlers (taken
    over, said at INFO); states=True replaces it; states=False keeps all."""
    pickled = StatePickleStorage(file_path=str(tmp_path / "states.pkl"))
    own = telebot.TeleBot(api.token, threaded=False, state_storage=pickled)
    own.enable_save_next_step_handlers(delay=0, filename=str(tmp_path / "steps.save"))
    with caplog.at_level(logging.INFO, logger="telegram_fence"):
        fence = make_fence(own, str(tmp_path / "a.db"))
    assert own.current_states is pickled and isinstance(own.next_step_backend, FenceHandlerBackend)
    assert isinstance(own.reply_backend, FenceHandlerBackend)  # still telebot's default: replaced
    assert any("own storage is kept" in r.getMessage() and "StatePickleStorage" in r.getMessage()
               for r in caplog.records)
    assert any("file-saved next-step handlers" in r.getMessage() and "steps.save" in r.getMessage()
               for r in caplog.records)
    fence.store.close()
    fence = make_fence(own, str(tmp_path / "b.db"), states=True)
    assert isinstance(own.current_states, FenceStateStorage)
    assert isinstance(own.next_step_backend, FenceHandlerBackend)
    fence.store.close()
    plain = telebot.TeleBot(api.token, threaded=False)
    fence = make_fence(plain, str(tmp_path / "c.db"), states=False)
    assert type(plain.current_states) is StateMemoryStorage and type(plain.next_step_backend) is MemoryHandlerBackend
    fence.store.close()
    with pytest.raises(ConfigurationError, match="states="):
        make_fence(plain, str(tmp_path / "d.db"), states="yes")


@pytest.mark.parametrize("threaded", [False, True], ids=["plain", "threaded-bot"])
def test_a_handler_that_sets_a_state_and_raises_is_retried_in_the_old_state(
    api: FakeBotAPI, db: str, threaded: bool
) -> None:
    """The first attempt moves the user to 'age' and raises; its retry still finds 'name', and only the retry's
    change (to 'age') is stored (also for a bot built threaded, as telebot's default is)."""
    bot = telebot.TeleBot(api.token, threaded=threaded)
    seen: list[Any] = []

    @bot.message_handler(state="name")
    def got_name(message: telebot.types.Message) -> None:
        seen.append(bot.get_state(message.from_user.id, message.chat.id))
        bot.set_state(message.from_user.id, "age", message.chat.id)
        bot.add_data(message.from_user.id, message.chat.id, name=message.text)
        if len(seen) == 1:
            raise RuntimeError("the first attempt fails after changing the state")
        bot.send_message(message.chat.id, "How old are you?")

    bot.add_custom_filter(custom_filters.StateFilter(bot))
    store = SqliteUpdateStore(db)
    fence = make_fence(bot, store, retry=lambda error, attempt: 0.0)
    bot.set_state(42, "name", 42)  # outside any attempt: written at once
    fence.start()
    try:
        api.push_message(42, "Ann")
        assert api.wait_sent(1, timeout=10)
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert seen == ["name", "name"]
    reopened = SqliteUpdateStore(db)
    check = telebot.TeleBot(api.token, threaded=False)
    make_fence(check, reopened)
    assert check.get_state(42, 42) == "age"
    with check.retrieve_data(42, 42) as data:
        assert data == {"name": "Ann"}
    reopened.close()
    store.close()


def test_a_fence_handler_reads_states_on_first_use_and_its_changes_commit(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """With the fence's own handler (telebot's dispatch never runs) nothing is read ahead, yet a handler that asks
    for a state reads the stored one, and the state it sets commits with its settle."""
    fence = make_fence(bot, db)
    seen: list[Any] = []

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        chat, user = update.message.chat.id, update.message.from_user.id
        seen.append(bot.get_state(user, chat))
        bot.set_state(user, "asked", chat)

    fence.start()
    try:
        api.push_message(1, "first")
        assert eventually(lambda: fence.stats()["settled"] == 1)
        api.push_message(1, "second")
        assert eventually(lambda: fence.stats()["settled"] == 2)
    finally:
        stop(fence)
    assert seen == [None, "asked"]


#: What the file-saved step below was given.
SAVED_STEP: list[str] = []


def saved_step(message: telebot.types.Message) -> None:
    SAVED_STEP.append(message.text or "")


def test_next_step_handlers_loaded_from_telebots_file_move_into_the_store(api: FakeBotAPI, tmp_path: Any) -> None:
    """A step telebot saved to its file before the bot moved under the fence, loaded as its example loads it, is
    moved into the store: the chat's next message takes it."""
    saves = str(tmp_path / "saves" / "step.save")
    before = telebot.TeleBot(api.token, threaded=False)
    before.enable_save_next_step_handlers(delay=0, filename=saves)
    before.register_next_step_handler_by_chat_id(42, saved_step)  # written to the file at once (delay 0)
    SAVED_STEP.clear()
    bot = telebot.TeleBot(api.token, threaded=False)
    bot.enable_save_next_step_handlers(delay=0, filename=saves)
    bot.load_next_step_handlers(filename=saves)
    fence = make_fence(bot, str(tmp_path / "bot.db"))
    with fence.store.write() as conn:
        stored = list_steps(conn)
    assert [(s["kind"], s["group"], s["callback"].rsplit(":", 1)[-1]) for s in stored] == [
        ("next_step", "42", "saved_step")]
    fence.start()
    try:
        api.push_message(42, "red")
        assert eventually(lambda: SAVED_STEP == ["red"], timeout=20)
    finally:
        stop(fence)
