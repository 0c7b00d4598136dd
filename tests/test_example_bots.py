"""Bots of the shapes of pyTelegramBotAPI's own examples move to the fence with the import and the run line only.

Each bot below is written here (the examples are GPL-2 and not copied): the same shapes as telebot's
``echo_bot``, ``chat_member_example``, ``step_example``, ``skip_updates_example``, ``inline_keyboard_example``
and ``custom_filters/text_filter_example`` — ``telebot.TeleBot(token)`` with its defaults (threaded) and
``bot.infinity_polling(...)`` with the example's arguments. Each runs as a real script in a child process against
the fake Bot API, once as written and once with ``from telegram_fence import Fence`` added and the run line
changed to ``Fence(bot, DB).run(...)`` with the same arguments; what the users see must be the same.
"""

from __future__ import annotations

import difflib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from telegram_fence.testing import FakeBotAPI, ReadinessSocket

HERE = Path(__file__).parent

PROLOGUE = '''import os

import telebot
{fence_import}
TOKEN = os.environ["BOT_TOKEN"]
'''

ECHO = '''
bot = telebot.TeleBot(TOKEN)


@bot.message_handler(commands=["help", "start"])
def welcome(message):
    bot.reply_to(message, "Hi, I repeat what you say.")


@bot.message_handler(func=lambda message: True)
def echo(message):
    bot.reply_to(message, message.text)


{run}
'''

CHAT_MEMBER = '''from telebot import util

bot = telebot.TeleBot(TOKEN)


@bot.chat_member_handler()
def member_changed(update):
    user = update.new_chat_member.user
    bot.send_message(update.chat.id, f"{{user.first_name}}: {{update.old_chat_member.status}} -> "
                                     f"{{update.new_chat_member.status}}")


@bot.my_chat_member_handler()
def me_changed(update):
    bot.send_message(update.chat.id, f"I am {{update.new_chat_member.status}} here")


@bot.message_handler(commands=["ping"])
def ping(message):
    bot.reply_to(message, "pong")


{run}
'''

STEPS = '''
bot = telebot.TeleBot(TOKEN)
people = {{}}


# The next step is registered before the question is sent, so an answer can never come before it.
@bot.message_handler(commands=["start"])
def start(message):
    bot.register_next_step_handler(message, took_name)
    bot.reply_to(message, "What is your name?")


def took_name(message):
    people[message.chat.id] = {{"name": message.text}}
    bot.register_next_step_handler(message, took_age)
    bot.reply_to(message, "How old are you?")


def took_age(message):
    if not message.text.isdigit():
        bot.register_next_step_handler(message, took_age)
        bot.reply_to(message, "A number, please. How old are you?")
        return
    person = people[message.chat.id]
    bot.send_message(message.chat.id, f"Nice to meet you, {{person['name']}} ({{message.text}})")


{run}
'''

SKIP = '''
bot = telebot.TeleBot(TOKEN)


@bot.message_handler(func=lambda message: True)
def echo(message):
    bot.reply_to(message, "seen: " + message.text)


{run}
'''

KEYBOARD = '''from telebot.types import InlineKeyboardButton, InlineKeyboardMarkup

bot = telebot.TeleBot(TOKEN)


def yes_no():
    markup = InlineKeyboardMarkup(row_width=2)
    markup.add(InlineKeyboardButton("Yes", callback_data="yes"), InlineKeyboardButton("No", callback_data="no"))
    return markup


@bot.callback_query_handler(func=lambda call: True)
def pressed(call):
    bot.answer_callback_query(call.id, "You said " + call.data)
    bot.edit_message_text("Answered: " + call.data, call.message.chat.id, call.message.message_id)


@bot.message_handler(func=lambda message: True)
def ask(message):
    bot.send_message(message.chat.id, "Yes or no?", reply_markup=yes_no())


{run}
'''

FILTERS = '''from telebot import custom_filters

bot = telebot.TeleBot(TOKEN)


@bot.message_handler(text=["hi", "hello"])
def greeting(message):
    bot.send_message(message.chat.id, "Hi to you too")


@bot.message_handler(text_startswith="/say ")
def say(message):
    bot.send_message(message.chat.id, message.text[len("/say "):])


@bot.message_handler(func=lambda message: True)
def other(message):
    bot.send_message(message.chat.id, "I only answer hi, hello and /say")


bot.add_custom_filter(custom_filters.TextMatchFilter())
bot.add_custom_filter(custom_filters.TextStartsFilter())

{run}
'''


@dataclass(frozen=True)
class Shape:
    """One example bot: its body, the arguments of its run line, and what the test does to it."""

    name: str
    body: str
    run_args: str
    script: Callable[[FakeBotAPI], None]
    before_start: Callable[[FakeBotAPI], None] = lambda api: None


def _member(chat_id: int, user_id: int, old: str, new: str, key: str = "chat_member") -> dict[str, Any]:
    user = {"id": user_id, "is_bot": key == "my_chat_member", "first_name": f"user{user_id}"}
    return {key: {
        "chat": {"id": chat_id, "type": "supergroup", "title": "group"}, "from": user, "date": 1,
        "old_chat_member": {"status": old, "user": user}, "new_chat_member": {"status": new, "user": user},
    }}


def _say(api: FakeBotAPI, chat_id: int, text: str, answers: int = 1) -> None:
    """Push a message and wait until the bot sent ``answers`` more messages."""
    before = len(api.sent)
    api.push_message(chat_id, text)
    assert api.wait_sent(before + answers, timeout=20), f"no answer to {text!r}: {[s.text for s in api.sent]}"


def _echo(api: FakeBotAPI) -> None:
    _say(api, 1, "/start")
    _say(api, 2, "hello there")
    _say(api, 1, "again")


def _chat_member(api: FakeBotAPI) -> None:
    for update in (_member(-100, 7, "left", "member"), _member(-100, 999, "left", "member", key="my_chat_member")):
        before = len(api.sent)
        api.push_update(update)  # one at a time: plain telebot's pool may answer two at once in either order
        assert api.wait_sent(before + 1, timeout=20)
    _say(api, -100, "/ping")


def _steps(api: FakeBotAPI) -> None:
    for chat in (1, 2):
        _say(api, chat, "/start")
    _say(api, 1, "Ann")
    _say(api, 2, "Bob")
    _say(api, 1, "old")
    _say(api, 1, "33")
    _say(api, 2, "41")


def _pending(api: FakeBotAPI) -> None:
    for i in range(3):
        api.push_message(1, f"sent while the bot was down {i}")


def _skip(api: FakeBotAPI) -> None:
    # telebot's skip_pending (and so the fence's) drops all but the newest update waiting: that one is answered.
    assert api.wait_sent(1, timeout=20)
    _say(api, 1, "fresh")


def _keyboard(api: FakeBotAPI) -> None:
    _say(api, 5, "question")
    before = len(api.sent)
    api.push_callback_query(5, "yes")
    assert api.wait_sent(before + 1, timeout=20)  # the edit


def _filters(api: FakeBotAPI) -> None:
    _say(api, 3, "hi")
    _say(api, 3, "/say something kind")
    _say(api, 3, "what?")


SHAPES = [
    Shape("echo_bot", ECHO, "timeout=10, long_polling_timeout=5", _echo),
    Shape("chat_member_example", CHAT_MEMBER, "allowed_updates=util.update_types", _chat_member),
    Shape("step_example", STEPS, "", _steps),
    Shape("skip_updates_example", SKIP, "skip_pending=True", _skip, before_start=_pending),
    Shape("inline_keyboard_example", KEYBOARD, "", _keyboard),
    Shape("text_filter_example", FILTERS, "", _filters),
]


def _source(shape: Shape, fenced: bool) -> str:
    """The script: as written for telebot, or moved to the fence (the import added, the run line changed)."""
    args = shape.run_args
    if fenced:
        run = f'Fence(bot, os.environ["BOT_DB"]).run({args})'
        head = PROLOGUE.format(fence_import="from telegram_fence import Fence\n")
    else:
        run = f"bot.infinity_polling({args})"
        head = PROLOGUE.format(fence_import="")
    return head + shape.body.format(run=run)


def _what_users_saw(api: FakeBotAPI) -> dict[int, list[tuple[str, str]]]:
    """Per chat, in order: every message the bot sent or edited (method, text), and each callback answer."""
    seen: dict[int, list[tuple[str, str]]] = {}
    for sent in api.sent:
        seen.setdefault(sent.chat_id, []).append((sent.method, sent.text))
    for call in api.calls_to("answerCallbackQuery"):
        seen.setdefault(0, []).append(("answerCallbackQuery", str(call.params.get("text"))))
    return seen


def _run_bot(shape: Shape, fenced: bool, tmp_path: Path) -> dict[int, list[tuple[str, str]]]:
    """Run the script in a child process against a fresh fake server; what the users saw."""
    path = tmp_path / f"{shape.name}_{'fenced' if fenced else 'plain'}.py"
    path.write_text(_source(shape, fenced))
    with FakeBotAPI(max_long_poll=0.3) as api, ReadinessSocket() as ready:
        shape.before_start(api)
        env = ready.env(BOT_TOKEN=api.token, BOT_DB=str(tmp_path / f"{shape.name}.db"),
                        PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
        child = subprocess.Popen(
            [sys.executable, str(HERE / "example_bot_child.py"), str(path), api.api_url, api.file_url],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            shape.script(api)
        finally:
            if fenced:  # the fence says when a SIGTERM stops it cleanly; telebot's own loop says nothing
                ready.wait_ready(child, timeout=30)
            child.send_signal(signal.SIGTERM)
            output, _ = child.communicate(timeout=30)
        if fenced:
            assert child.returncode == 0, output
        assert "Traceback" not in output, output
        return _what_users_saw(api)


def test_the_moved_scripts_differ_in_the_import_and_the_run_line_only() -> None:
    """For every bot, the fenced script is the telebot script with one import added and one line changed."""
    for shape in SHAPES:
        plain, fenced = _source(shape, False).splitlines(), _source(shape, True).splitlines()
        changes = [line for line in difflib.ndiff(plain, fenced) if line[:1] in "+-"]
        assert changes == [
            "+ from telegram_fence import Fence",
            f"- bot.infinity_polling({shape.run_args})",
            f'+ Fence(bot, os.environ["BOT_DB"]).run({shape.run_args})',
        ], shape.name


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_an_example_bot_behaves_the_same_under_the_fence(shape: Shape, tmp_path: Path) -> None:
    """The bot built with telebot's defaults answers every user exactly as under plain telebot's
    infinity_polling(...), with the same arguments carried by Fence(...).run(...)."""
    plain = _run_bot(shape, False, tmp_path)
    fenced = _run_bot(shape, True, tmp_path)
    assert plain, "the plain bot answered nobody: the script is wrong"
    assert fenced == plain
