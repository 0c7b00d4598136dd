"""The one-line move: a bot built with telebot's defaults (threaded) runs under ``Fence``, and ``run()`` takes what
``infinity_polling()`` takes (allowed_updates reach getUpdates, skip_pending on the first start, timeouts)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import telebot
from telebot import util

from telegram_fence import ConfigurationError, Exhaustion, Fence
from telegram_fence.runtime.settings import polling_options
from telegram_fence.testing import FakeBotAPI


@contextmanager
def running(fence: Fence, **run_args: Any) -> Iterator[list[int]]:
    """``fence.run(**run_args)`` on a thread (as a script's last line would run it); stopped and joined after."""
    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(fence.run(**run_args)), name="test-run")
    thread.start()
    try:
        yield code
    finally:
        fence.stop()
        thread.join(30)
        assert not thread.is_alive()


def _member_update(chat_id: int, user_id: int, status: str) -> dict[str, Any]:
    """A ``chat_member`` update: ``user_id``'s status in the group ``chat_id`` changed to ``status``."""
    user = {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"}
    return {"chat_member": {
        "chat": {"id": chat_id, "type": "supergroup", "title": "group"}, "from": user, "date": 1,
        "old_chat_member": {"status": "left", "user": user}, "new_chat_member": {"status": status, "user": user},
    }}


def test_a_threaded_bot_runs_its_handlers_on_the_fences_workers_never_on_telebots_pool(
    api: FakeBotAPI, db: str
) -> None:
    """``TeleBot(token)`` (threaded=True, telebot's default) is accepted; every handler runs on a ``fence-`` thread
    and telebot's worker pool is never handed a task."""
    bot = telebot.TeleBot(api.token)
    assert bot.threaded
    handed: list[Any] = []
    telebots_put = bot.worker_pool.put

    def spy(task: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        handed.append(task)
        telebots_put(task, *args, **kwargs)

    bot.worker_pool.put = spy  # type: ignore[method-assign]
    threads: list[str] = []

    @bot.message_handler(func=lambda m: True)
    def echo(message: Any) -> None:
        threads.append(threading.current_thread().name)
        bot.reply_to(message, message.text)

    fence = Fence(bot, db)
    with running(fence):
        for i in range(6):
            api.push_message(i % 3 + 1, f"m{i}")
        assert api.wait_sent(6)
    assert sorted(s.text for s in api.sent) == [f"m{i}" for i in range(6)]
    assert len(threads) == 6 and all(name.startswith("fence-") for name in threads), threads
    assert handed == []
    assert "_exec_task" not in vars(bot)  # the fence took its change back at join()


def test_a_threaded_bots_handler_error_reaches_retry_and_exhaustion(api: FakeBotAPI, db: str) -> None:
    """A handler of a threaded bot that raises is retried by the fence and exhausted when it keeps failing, as for
    a ``threaded=False`` bot (nothing disappears into telebot's pool)."""
    bot = telebot.TeleBot(api.token)
    attempts: list[int] = []
    exhausted: list[Exhaustion] = []
    done = threading.Event()

    @bot.message_handler(func=lambda m: True)
    def fail(message: Any) -> None:
        attempts.append(message.message_id)
        raise ValueError("handler broke")

    def on_exhausted(exhaustion: Exhaustion) -> None:
        exhausted.append(exhaustion)
        done.set()

    fence = Fence(bot, db, max_attempts=3, retry=lambda error, attempt: 0.0, on_exhausted=on_exhausted)
    with running(fence):
        api.push_message(1, "boom")
        assert done.wait(10)
    assert len(attempts) == 3
    assert "ValueError: handler broke" in exhausted[0].error


def test_a_threaded_bots_exception_handler_still_decides(api: FakeBotAPI, db: str) -> None:
    """A threaded bot's ``exception_handler`` that says it handled the error makes the update settled, as telebot
    would treat it; the fence does not retry it."""

    class Handled(telebot.ExceptionHandler):
        seen: list[str] = []

        def handle(self, exception: Exception) -> bool:
            self.seen.append(str(exception))
            return True

    bot = telebot.TeleBot(api.token, exception_handler=Handled())

    @bot.message_handler(func=lambda m: True)
    def fail(message: Any) -> None:
        raise ValueError("taken care of")

    fence = Fence(bot, db)
    with running(fence):
        api.push_message(1, "x")
        # run() starts the fence on its thread: its workers appear in stats() once the pool is built
        assert api.wait_for(lambda: (fence.stats()["workers"] or {}).get("handled") == 1)
    assert Handled.seen == ["taken care of"]
    assert fence.stats()["workers"]["retried"] == 0


def test_allowed_updates_given_to_run_reach_getupdates_and_bring_chat_member_updates(
    api: FakeBotAPI, db: str
) -> None:
    """``run(allowed_updates=[..., "chat_member"])`` is sent with every getUpdates, so the bot receives the
    ``chat_member`` updates Telegram sends only when asked."""
    bot = telebot.TeleBot(api.token)
    seen: list[str] = []

    @bot.chat_member_handler()
    def member(update: Any) -> None:
        seen.append(update.new_chat_member.status)
        bot.send_message(update.chat.id, f"{update.new_chat_member.user.first_name} is {update.new_chat_member.status}")

    fence = Fence(bot, db)
    with running(fence, allowed_updates=util.update_types):
        api.push_update(_member_update(-100, 5, "member"))
        assert api.wait_sent(1)
    assert seen == ["member"]
    polls = api.calls_to("getUpdates")
    assert polls and all("chat_member" in str(call.params.get("allowed_updates")) for call in polls)


def test_without_allowed_updates_chat_member_updates_never_come(api: FakeBotAPI, db: str) -> None:
    """The control: run() without allowed_updates does not receive chat_member updates (Telegram's default)."""
    bot = telebot.TeleBot(api.token)
    seen: list[Any] = []
    bot.chat_member_handler()(seen.append)

    @bot.message_handler(func=lambda m: True)
    def echo(message: Any) -> None:
        bot.reply_to(message, message.text)

    fence = Fence(bot, db)
    with running(fence):
        api.push_update(_member_update(-100, 5, "member"))
        api.push_message(1, "after")
        assert api.wait_sent(1)
    assert seen == []


def test_skip_pending_drops_what_waits_at_the_first_start_only(api: FakeBotAPI, db: str) -> None:
    """``run(skip_pending=True)`` on a new database drops the updates waiting at Telegram but the newest, as
    telebot's skip_pending does, then handles new ones; on the next start, what waited while the bot was down is
    handled: nothing is dropped."""
    def make_bot() -> tuple[telebot.TeleBot, list[str]]:
        bot = telebot.TeleBot(api.token)
        texts: list[str] = []

        @bot.message_handler(func=lambda m: True)
        def echo(message: Any) -> None:
            texts.append(message.text)
            bot.reply_to(message, message.text)

        return bot, texts

    for i in range(3):
        api.push_message(1, f"old {i}")
    bot, texts = make_bot()
    first = Fence(bot, db)
    with running(first, skip_pending=True):
        assert api.wait_sent(1)
        api.push_message(1, "new")
        assert api.wait_sent(2)
        assert api.wait_for(lambda: first.stats()["settled"] == 2)
    assert texts == ["old 2", "new"]

    api.push_message(1, "while down")
    bot, texts = make_bot()
    with running(Fence(bot, db), skip_pending=True):
        assert api.wait_sent(3)
    assert texts == ["while down"]


def test_run_maps_the_long_poll_and_request_timeouts(api: FakeBotAPI, db: str) -> None:
    """``long_polling_timeout`` becomes the ``timeout`` Telegram long-polls for; ``timeout`` (telebot's HTTP
    timeout) becomes the fence's request timeout, with a watchdog margin that never cuts such a call short."""
    bot = telebot.TeleBot(api.token)
    fence = Fence(bot, db)
    with running(fence, timeout=90, long_polling_timeout=7, logger_level=logging.INFO):
        assert api.wait_for(lambda: len(api.calls_to("getUpdates")) >= 1)
    assert str(api.calls_to("getUpdates")[0].params["timeout"]) == "7"
    settings = fence._settings
    assert (settings.long_poll_timeout, settings.request_timeout) == (7, 90)
    assert settings.long_poll_timeout + settings.watchdog_margin > 90


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"restart_on_change": True}, "restart_on_change/path_to_watch"),
        ({"path_to_watch": "."}, "restart_on_change/path_to_watch"),
        ({"interval": -1}, "interval=-1 must be a number of seconds (0 or more)"),
        ({"interval": "0"}, "interval='0' must be a number of seconds"),
        ({"none_stop": "yes"}, "none_stop='yes' must be True or False"),
        ({"non_stop": 1}, "non_stop=1 must be True or False"),
        ({"limit": 100}, "run() does not take limit=: telebot's infinity_polling() does not take it either"),
        ({"allowed_updates": "message"}, "allowed_updates='message' must be a list"),
        ({"skip_pending": "yes"}, "skip_pending='yes' must be True or False"),
        ({"long_polling_timeout": 0}, "long_poll_timeout=0 must be a positive number"),
        ({"timeout": -1}, "request_timeout=-1 must be a positive number"),
    ],
)
def test_run_refuses_what_it_cannot_honour_with_a_clear_message(
    bot: telebot.TeleBot, db: str, args: dict[str, Any], message: str
) -> None:
    """``run()`` refuses telebot options it cannot honour, and bad values, with a ConfigurationError naming them,
    before anything starts."""
    fence = Fence(bot, db)
    with pytest.raises(ConfigurationError) as caught:
        fence.run(**args)
    assert message in str(caught.value)
    assert fence.stats()["poller"] is None


def test_the_common_infinity_polling_line_with_polling_arguments_moves_as_it_is(api: FakeBotAPI, db: str) -> None:
    """``infinity_polling(none_stop=True, interval=0, timeout=20)``, which scripts copy from one another, runs as
    ``Fence(bot, db).run(none_stop=True, interval=0, timeout=20)``: the handler answers, the stop is clean (0)."""
    bot = telebot.TeleBot(api.token)

    @bot.message_handler(func=lambda message: True)
    def echo(message: Any) -> None:
        bot.send_message(message.chat.id, message.text)

    fence = Fence(bot, db, long_poll_timeout=0.5)
    with running(fence, none_stop=True, interval=0, timeout=20) as code:
        api.push_message(42, "still here")
        assert api.wait_sent(1)
    assert code == [0]
    assert [m.text for m in api.sent_to(42)] == ["still here"]
    settings = fence._settings
    for args in ({"non_stop": False, "interval": 2.5}, {"none_stop": None}):  # accepted, and they change nothing
        assert polling_options(settings, timeout=None, skip_pending=False, long_polling_timeout=None,
                               logger_level=None, allowed_updates=None, restart_on_change=False, path_to_watch=None,
                               other=args) == settings, args


def test_run_takes_infinity_pollings_positional_order(bot: telebot.TeleBot, db: str) -> None:
    """``run(timeout, skip_pending, long_polling_timeout, ...)`` is infinity_polling's order: a call written
    positionally keeps its meaning (here a bad third argument is named as the long-poll timeout)."""
    fence = Fence(bot, db)
    with pytest.raises(ConfigurationError, match="long_poll_timeout=-5"):
        fence.run(20, False, -5)


def test_a_refused_fence_leaves_the_threaded_bot_as_it_was(api: FakeBotAPI, db: str) -> None:
    """A Fence that refuses its store changes nothing on the bot: telebot's own dispatch stays in place."""
    bot = telebot.TeleBot(api.token)
    with pytest.raises(ConfigurationError):
        Fence(bot, object())
    assert "_exec_task" not in vars(bot)
