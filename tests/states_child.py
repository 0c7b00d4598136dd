"""Two conversation bots as a telebot user writes them, for the conversation crash drills; only the run line is the
fence's (``Fence(bot, DB).run()`` instead of ``bot.infinity_polling()``).

Usage: ``python states_child.py states|steps DB`` with ``TELEGRAM_API_URL`` (telebot's format string) and
``TELEGRAM_BOT_TOKEN``; ``CHILD_POLLING=1`` runs ``bot.infinity_polling()`` instead (the uninterrupted reference);
``CHILD_STATES=0`` runs the fence with ``states=False`` (telebot's memory storage: the drill's negative control);
``CHILD_LEASE`` sets the fence's lease (seconds, default 30). A ``DB`` of ``postgres:TABLE`` runs the fence on
``PostgresUpdateStore(TELEGRAM_FENCE_PG_DSN, table=TABLE)`` instead (one "host" of several on that store; a
non-leader tries to take the poll leadership every 0.5 s).

``states``: the conversation of pyTelegramBotAPI's ``examples/custom_states.py`` (written anew here, same shape):
``StateMemoryStorage``, a ``StatesGroup`` of name, age, color and hobby, ``StateContext`` through
``StateMiddleware``, ``/cancel`` in any state, a digit check for the age, a summary from ``state.data()``.
``steps``: the shape of ``examples/step_example.py`` with ``register_next_step_handler``, the answers so far
travelling as the next handler's arguments (the example keeps them in a dict in memory, which no storage of
handlers can bring back).

The fence says ``READY=1`` on ``$NOTIFY_SOCKET`` once a SIGTERM stops it cleanly (``telegram_fence.testing``'s
``ReadinessSocket`` listens).
"""

from __future__ import annotations

import os
import sys

import telebot
from telebot import apihelper, custom_filters, types
from telebot.states import State, StatesGroup
from telebot.states.sync.context import StateContext
from telebot.states.sync.middleware import StateMiddleware
from telebot.storage import StateMemoryStorage

from telegram_fence import Fence

apihelper.API_URL = os.environ["TELEGRAM_API_URL"]
TOKEN = os.environ["TELEGRAM_BOT_TOKEN"]
KIND, DB = sys.argv[1], sys.argv[2]

# as the example builds it: telebot's defaults (threaded=True), its memory storage
bot = telebot.TeleBot(TOKEN, state_storage=StateMemoryStorage(), use_class_middlewares=True)


class Survey(StatesGroup):
    name = State()
    age = State()
    color = State()
    hobby = State()


HOBBIES = ["Reading", "Traveling", "Gaming", "Cooking"]


def answer(message: types.Message, text: str) -> None:
    bot.send_message(message.chat.id, text, reply_parameters=types.ReplyParameters(message_id=message.message_id))


if KIND == "states":

    @bot.message_handler(commands=["start"])
    def start(message: types.Message, state: StateContext) -> None:
        state.set(Survey.name)
        answer(message, "Hello! What is your first name?")

    @bot.message_handler(state="*", commands=["cancel"])
    def cancel(message: types.Message, state: StateContext) -> None:
        state.delete()
        answer(message, "Your information has been cleared. Type /start to begin again.")

    @bot.message_handler(state=Survey.name)
    def got_name(message: types.Message, state: StateContext) -> None:
        state.set(Survey.age)
        answer(message, "How old are you?")
        state.add_data(name=message.text)

    @bot.message_handler(state=Survey.age, is_digit=True)
    def got_age(message: types.Message, state: StateContext) -> None:
        state.set(Survey.color)
        state.add_data(age=message.text)
        answer(message, "What is your favorite color?")

    @bot.message_handler(state=Survey.color)
    def got_color(message: types.Message, state: StateContext) -> None:
        state.set(Survey.hobby)
        state.add_data(color=message.text)
        answer(message, "What is one of your hobbies?")

    @bot.message_handler(state=Survey.hobby, text=HOBBIES)
    def finish(message: types.Message, state: StateContext) -> None:
        with state.data() as data:
            summary = (f"Summary: name={data.get('name')} age={data.get('age')} color={data.get('color')} "
                       f"hobby={message.text}")
        answer(message, summary)
        state.delete()

    @bot.message_handler(state=Survey.age, is_digit=False)
    def bad_age(message: types.Message) -> None:
        answer(message, "Please enter a valid number for age.")

    bot.add_custom_filter(custom_filters.StateFilter(bot))
    bot.add_custom_filter(custom_filters.IsDigitFilter())
    bot.add_custom_filter(custom_filters.TextMatchFilter())
    bot.setup_middleware(StateMiddleware(bot))

else:

    @bot.message_handler(commands=["start"])
    def welcome(message: types.Message) -> None:
        answer(message, "What's your name?")
        bot.register_next_step_handler(message, step_name)


def step_name(message: types.Message) -> None:
    answer(message, "How old are you?")
    bot.register_next_step_handler(message, step_age, message.text)


def step_age(message: types.Message, name: str) -> None:
    if not (message.text or "").isdigit():
        answer(message, "Age should be a number. How old are you?")
        bot.register_next_step_handler(message, step_age, name)
        return
    answer(message, "Male or Female?")
    bot.register_next_step_handler(message, step_sex, name, age=message.text)


def step_sex(message: types.Message, name: str, age: str) -> None:
    answer(message, f"Nice to meet you {name}, age {age}, {message.text}")


if __name__ == "__main__":
    if os.environ.get("CHILD_POLLING") == "1":
        bot.infinity_polling(timeout=1, long_polling_timeout=1)
    else:
        # CHILD_LEASE: a drill that kills mid-handling waits out the killed claim's lease (the default is 30 s)
        lease = float(os.environ.get("CHILD_LEASE", "30"))
        store: object = DB
        if DB.startswith("postgres:"):
            from telegram_fence.store.postgres import PostgresUpdateStore

            store = PostgresUpdateStore(os.environ["TELEGRAM_FENCE_PG_DSN"], table=DB.removeprefix("postgres:"),
                                        create_table=False, leader_check=0.5)
        sys.exit(Fence(bot, store, states=False, lease=lease).run() if os.environ.get("CHILD_STATES") == "0"
                 else Fence(bot, store, lease=lease).run())
