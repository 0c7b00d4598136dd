"""A Bot API call Telegram refuses inside a handler: one readable log line; its exhaustion says where to look."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import telebot

from telegram_fence import Exhaustion, Fence
from telegram_fence.retry import RetryPolicy
from telegram_fence.testing import FakeBotAPI
from telegram_fence.textlog import TextFormatter


def _refusal_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("telegram_fence") and "editMessageText" in r.getMessage()]


def _run_until_exhausted(api: FakeBotAPI, bot: telebot.TeleBot, db: str, retry: RetryPolicy | None = None,
                         max_attempts: int = 5) -> Exhaustion:
    exhausted: list[Exhaustion] = []
    done = threading.Event()

    def on_exhausted(exhaustion: Exhaustion) -> None:
        exhausted.append(exhaustion)
        done.set()

    fence = Fence(bot, db, on_exhausted=on_exhausted, retry=retry, max_attempts=max_attempts)
    fence.start()
    try:
        api.push_message(7, "edit me")
        assert done.wait(10), "the update was never exhausted"
    finally:
        fence.stop()
        assert fence.join()
    return exhausted[0]


def _editing_bot(api: FakeBotAPI) -> telebot.TeleBot:
    """A bot whose handler edits its own reply to the text it already has: Telegram's 400 "message is not modified"."""
    bot = telebot.TeleBot(api.token, threaded=False)

    @bot.message_handler(func=lambda m: True)
    def edit(message: Any) -> None:
        sent = bot.send_message(message.chat.id, "same text")
        bot.edit_message_text("same text", message.chat.id, sent.message_id)

    return bot


def test_a_refused_call_is_logged_in_one_line_with_the_update_the_method_and_telegrams_description(
    api: FakeBotAPI, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 400 from editMessageText inside a handler is logged as one line naming the update id, the method and
    Telegram's description, and its exhaustion line names the command that shows it (no traceback in the log)."""
    caplog.set_level(logging.WARNING, logger="telegram_fence")
    exhaustion = _run_until_exhausted(api, _editing_bot(api), db)
    records = _refusal_records(caplog)
    assert len(records) == 1, [r.getMessage() for r in caplog.records]
    record = records[0]
    line = TextFormatter().format(record)
    assert "\n" not in line
    assert line.count("message is not modified") == 1, line  # stated once, not again as description= and error=
    message = record.getMessage()
    assert f"update {exhaustion.identity.update_id} exhausted" in message
    assert "Telegram refused editMessageText (error 400): Bad Request: message is not modified" in message
    assert f"see it with: telegram-fence exhaustions {db}" in message
    assert record.exc_info is None
    assert (record.method, record.error_code) == ("editMessageText", 400)  # type: ignore[attr-defined]
    assert record.description.startswith("Bad Request: message is not modified")  # type: ignore[attr-defined]
    # The store keeps the whole error (traceback included) for `telegram-fence show`.
    assert "ApiTelegramException" in exhaustion.error


def test_a_refusal_that_keeps_failing_is_retried_with_readable_lines_then_exhausted(
    api: FakeBotAPI, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Under a policy that retries refusals, each failed attempt logs the same readable line with the attempt number,
    and the last one ends in an exhaustion that says where to see it."""
    caplog.set_level(logging.WARNING, logger="telegram_fence")
    exhaustion = _run_until_exhausted(api, _editing_bot(api), db, retry=lambda error, attempt: 0.0, max_attempts=3)
    lines = [r.getMessage() for r in _refusal_records(caplog)]
    assert len(lines) == 3, lines
    for record in _refusal_records(caplog):
        assert TextFormatter().format(record).count("message is not modified") == 1
    for attempt, line in enumerate(lines[:2], start=1):
        assert line.startswith(f"update {exhaustion.identity.update_id}: handler failed (attempt {attempt} of 3): "
                               "Telegram refused editMessageText (error 400): Bad Request: message is not modified")
    assert "exhausted after attempt 3" in lines[2] and "telegram-fence exhaustions" in lines[2]


def test_any_other_handler_error_keeps_its_type_and_traceback(
    api: FakeBotAPI, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An error that is no Telegram refusal is logged as ``Type: message`` with its traceback, as before."""
    caplog.set_level(logging.WARNING, logger="telegram_fence")
    bot = telebot.TeleBot(api.token, threaded=False)

    @bot.message_handler(func=lambda m: True)
    def boom(message: Any) -> None:
        raise ValueError("broken handler")

    _run_until_exhausted(api, bot, db, retry=lambda error, attempt: None)
    [record] = [r for r in caplog.records if "exhausted after attempt" in r.getMessage()]
    assert "ValueError: broken handler" in record.getMessage()
    assert record.exc_info is not None


def test_where_an_error_was_raised_is_the_bots_own_innermost_frame() -> None:
    """``raised_at`` names the innermost frame outside the standard library, installed packages and
    telegram_fence: for an error raised inside ``json`` (stdlib) or telebot, the bot's line that called it."""
    import json

    from telebot import util

    from telegram_fence.runtime.attempt import raised_at

    def bot_code() -> None:
        json.loads("{not json")

    try:
        bot_code()
    except ValueError as exc:
        where = raised_at(exc)
    assert where is not None and where.endswith(f"test_handler_refusal.py:{bot_code.__code__.co_firstlineno + 1} "
                                                "in bot_code"), where
    try:
        util.validate_token("no colon")  # raises inside telebot
    except ValueError as exc:
        where = raised_at(exc)
    assert where is not None and "test_handler_refusal.py:" in where and "test_where_an_error" in where, where
    assert raised_at(ValueError("never raised")) is None
