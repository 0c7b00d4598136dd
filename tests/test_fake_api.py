"""The fake Bot API server, driven by the real telebot client over HTTP."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import telebot
from telebot import apihelper, types

from telegram_fence.errors import ConfigurationError
from telegram_fence.testing import ApiError, Call, FakeBotAPI, Sent


def api_error(fn: Callable[[], Any]) -> apihelper.ApiTelegramException:
    """Run ``fn`` and return the ``ApiTelegramException`` it must raise."""
    with pytest.raises(apihelper.ApiTelegramException) as info:
        fn()
    return info.value


def raw(api: FakeBotAPI, method: str, **params: Any) -> requests.Response:
    """One plain HTTP GET to the fake, bypassing telebot's parameter handling."""
    return requests.get(api.api_url.format(api.token, method), params=params, timeout=10)


class Poller(threading.Thread):
    """A getUpdates call on its own thread, keeping its result or error."""

    def __init__(self, bot: telebot.TeleBot, **kwargs: Any) -> None:
        super().__init__(name="test-poller", daemon=True)
        self.bot, self.kwargs = bot, kwargs
        self.result: list[types.Update] | None = None
        self.error: BaseException | None = None
        self.elapsed = 0.0

    def run(self) -> None:
        started = time.monotonic()
        try:
            self.result = self.bot.get_updates(**self.kwargs)
        except BaseException as exc:
            self.error = exc
        self.elapsed = time.monotonic() - started


# ------------------------------------------------------------------ basics and dispatch


def test_get_me_answers_the_bot_of_the_token(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """getMe answers a bot user whose id is the token's numeric prefix."""
    me = fake_bot.get_me()
    assert me.is_bot
    assert me.id == fake_bot_api.bot_id == int(fake_bot_api.token.split(":")[0])
    assert len(fake_bot_api.token.split(":")[1]) == 35


def test_pushed_messages_dispatch_to_command_and_catch_all_handlers(
    fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot
) -> None:
    """A pushed "/start" reaches a commands=["start"] handler and plain text reaches func=lambda handlers."""
    seen: list[tuple[str, str | None]] = []

    @fake_bot.message_handler(commands=["start"])
    def start(message: types.Message) -> None:
        seen.append(("start", message.text))
        fake_bot.reply_to(message, "hello")

    @fake_bot.message_handler(func=lambda m: True)
    def other(message: types.Message) -> None:
        seen.append(("other", message.text))

    fake_bot_api.push_message(42, "/start now")
    fake_bot_api.push_message(-1001234567890, "group text", user_id=7)
    updates = fake_bot.get_updates(long_polling_timeout=1)
    fake_bot.process_new_updates(updates)
    assert seen == [("start", "/start now"), ("other", "group text")]
    assert updates[1].message.chat.type == "supergroup" and updates[1].message.from_user.id == 7
    [reply] = fake_bot_api.sent
    assert (reply.chat_id, reply.text, reply.method) == (42, "hello", "sendMessage")
    assert reply.params["reply_parameters"]  # telebot's reply_to arrived as a parameter


def test_update_ids_increase_and_explicit_ids_must_grow(fake_bot_api: FakeBotAPI) -> None:
    """Update ids start at 1000 and increase; push_update assigns missing ids and refuses a lower one."""
    first = fake_bot_api.push_message(1, "a")
    second = fake_bot_api.push_callback_query(1, "data")
    third = fake_bot_api.push_update({"update_id": 5000, "message": {"message_id": 1}})
    fourth = fake_bot_api.push_update({"edited_message": {"message_id": 1}})
    assert (first, second, third, fourth) == (1000, 1001, 5000, 5001)
    with pytest.raises(ValueError, match="update_id"):
        fake_bot_api.push_update({"update_id": 10, "message": {}})
    assert fake_bot_api.push_messages(3, chats=[1, 2]) == [5002, 5003, 5004]


def test_message_ids_increase_per_chat(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """Message ids are counted per chat, shared by user messages and bot messages."""
    fake_bot_api.push_message(1, "x")
    ids_1 = [fake_bot.send_message(1, "a").message_id, fake_bot.send_message(1, "b").message_id]
    ids_2 = [fake_bot.send_message(2, "a").message_id]
    assert ids_1 == [2, 3] and ids_2 == [1]
    assert [s.message_id for s in fake_bot_api.sent_to(1)] == [2, 3]


# ------------------------------------------------------------------ getUpdates


def test_offset_confirms_and_forgets_updates_below_it(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """Unconfirmed updates come again; an offset confirms everything below it, which is then forgotten."""
    ids = fake_bot_api.push_messages(3)
    again = [u.update_id for u in fake_bot.get_updates(long_polling_timeout=1)]
    assert again == ids == [u.update_id for u in fake_bot.get_updates(long_polling_timeout=1)]
    assert fake_bot_api.confirmed_offset == 0
    rest = fake_bot.get_updates(offset=ids[1], long_polling_timeout=1)
    assert [u.update_id for u in rest] == ids[1:]
    assert fake_bot_api.confirmed_offset == ids[1]
    assert fake_bot_api.pending_count == 2
    assert fake_bot.get_updates(offset=ids[2] + 1, long_polling_timeout=0.01) == []
    assert fake_bot_api.pending_count == 0
    assert fake_bot_api.wait_confirmed(ids[2] + 1, timeout=0)


def test_limit_caps_the_batch_between_1_and_100(fake_bot_api: FakeBotAPI) -> None:
    """limit bounds the batch; values outside 1..100 are clamped like Telegram does."""
    fake_bot_api.push_messages(150)
    assert len(raw(fake_bot_api, "getUpdates", limit=7).json()["result"]) == 7
    assert len(raw(fake_bot_api, "getUpdates").json()["result"]) == 100
    assert len(raw(fake_bot_api, "getUpdates", limit=500).json()["result"]) == 100
    assert len(raw(fake_bot_api, "getUpdates", limit=0).json()["result"]) == 1


def test_long_poll_returns_as_soon_as_an_update_arrives(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """A long poll waiting on an empty queue returns when an update is pushed, long before its timeout."""
    poller = Poller(fake_bot, long_polling_timeout=6, timeout=20)
    poller.start()
    assert fake_bot_api.wait_for(lambda: fake_bot_api.polling)
    update_id = fake_bot_api.push_message(3, "wake up")
    poller.join(10)
    assert poller.error is None and poller.result is not None
    assert [u.update_id for u in poller.result] == [update_id]
    assert poller.elapsed < 3.0


def test_long_poll_is_capped_by_max_long_poll() -> None:
    """max_long_poll shortens the wait a client asked for, and an empty poll answers an empty list."""
    with FakeBotAPI(max_long_poll=0.2) as api:
        bot = telebot.TeleBot(api.token, threaded=False)
        started = time.monotonic()
        assert bot.get_updates(long_polling_timeout=30, timeout=40) == []
        assert time.monotonic() - started < 15


def test_allowed_updates_filters_types_and_is_remembered(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """allowed_updates keeps other update types out, and applies to later calls that omit it."""
    fake_bot_api.push_message(1, "text")
    callback = fake_bot_api.push_callback_query(1, "pressed")
    first = fake_bot.get_updates(allowed_updates=["callback_query"], long_polling_timeout=0.01)
    assert [u.update_id for u in first] == [callback]
    assert first[0].callback_query.data == "pressed"
    second = fake_bot.get_updates(long_polling_timeout=0.01)
    assert [u.update_id for u in second] == [callback]
    both = fake_bot.get_updates(allowed_updates=[], long_polling_timeout=0.01)
    assert len(both) == 2


def test_second_concurrent_poll_gets_409_conflict(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """While one getUpdates waits, another one for the same token is refused with Telegram's 409."""
    poller = Poller(fake_bot, long_polling_timeout=6, timeout=20)
    poller.start()
    assert fake_bot_api.wait_for(lambda: fake_bot_api.polling)
    error = api_error(lambda: telebot.TeleBot(fake_bot_api.token).get_updates(long_polling_timeout=1))
    assert error.error_code == 409
    assert error.description == (
        "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
    )
    update_id = fake_bot_api.push_message(1, "release")
    poller.join(10)
    assert poller.result is not None and [u.update_id for u in poller.result] == [update_id]


def test_a_poll_whose_client_hung_up_is_superseded(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """A getUpdates whose client went away (killed, timed out) does not block the next poller with 409."""
    with socket.create_connection(("127.0.0.1", fake_bot_api.port), timeout=5) as sock:
        path = f"/bot{fake_bot_api.token}/getUpdates?timeout=30"
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert fake_bot_api.wait_for(lambda: fake_bot_api.polling)
    assert fake_bot.get_updates(long_polling_timeout=0.01) == []  # no 409: the old poll is superseded
    update_id = fake_bot_api.push_message(1, "for the new poller")
    assert [u.update_id for u in fake_bot.get_updates(long_polling_timeout=0.01)] == [update_id]


def test_webhook_makes_get_updates_409_until_deleted(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """With a webhook set getUpdates gets 409; deleteWebhook (with drop_pending_updates) lifts it."""
    fake_bot_api.push_message(1, "pending")
    assert fake_bot.set_webhook("https://example.org/hook")
    assert fake_bot_api.webhook_url == "https://example.org/hook"
    assert fake_bot.get_webhook_info().pending_update_count == 1
    error = api_error(lambda: fake_bot.get_updates(long_polling_timeout=0.01))
    assert error.error_code == 409 and "webhook is active" in error.description
    assert api_error(lambda: fake_bot.set_webhook("http://plain.example/")).error_code == 400
    assert fake_bot.delete_webhook(drop_pending_updates=True)
    assert fake_bot.get_updates(long_polling_timeout=0.01) == []


def test_negative_offset_keeps_only_the_last_updates(fake_bot_api: FakeBotAPI) -> None:
    """offset=-N forgets all but the last N pending updates."""
    ids = fake_bot_api.push_messages(5)
    result = raw(fake_bot_api, "getUpdates", offset=-2).json()["result"]
    assert [u["update_id"] for u in result] == ids[-2:]
    assert fake_bot_api.pending_count == 2


def test_parameters_arrive_by_query_form_and_json_body(fake_bot_api: FakeBotAPI) -> None:
    """sendMessage reads chat_id and text from the query string, a form body, or a JSON body."""
    url = fake_bot_api.api_url.format(fake_bot_api.token, "sendMessage")
    assert requests.post(url, params={"chat_id": 1, "text": "query"}, timeout=5).json()["ok"]
    assert requests.post(url, data={"chat_id": 2, "text": "form"}, timeout=5).json()["ok"]
    assert requests.post(url, json={"chat_id": 3, "text": "json"}, timeout=5).json()["ok"]
    assert [(s.chat_id, s.text) for s in fake_bot_api.sent] == [(1, "query"), (2, "form"), (3, "json")]


# ------------------------------------------------------------------ sending and records


def test_calls_and_sent_are_recorded_and_returned_as_copies(
    fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot
) -> None:
    """Every request is a Call with its parameters and time; accepted messages are Sent; reads are copies."""
    before = time.time()
    fake_bot.send_message(9, "one")
    fake_bot.send_chat_action(9, "typing")
    calls = fake_bot_api.calls
    assert [c.method for c in calls] == ["sendMessage", "sendChatAction"]
    assert isinstance(calls[0], Call) and calls[0].params == {"chat_id": "9", "text": "one"}
    assert before <= calls[0].time <= time.time()
    sent = fake_bot_api.sent
    assert sent == [Sent(9, "one", 1, "sendMessage", {"chat_id": "9", "text": "one"})]
    sent.clear()
    calls.clear()
    assert len(fake_bot_api.sent) == 1 and len(fake_bot_api.calls) == 2
    assert len(fake_bot_api.calls_to("sendchataction")) == 1


def test_callback_query_answer_and_edit(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """A button press dispatches to a callback handler, which answers it once and edits the bot's message."""
    message = fake_bot.send_message(5, "choose")

    @fake_bot.callback_query_handler(func=lambda q: True)
    def pressed(query: types.CallbackQuery) -> None:
        fake_bot.answer_callback_query(query.id, "ok")
        fake_bot.edit_message_text(f"chose {query.data}", query.message.chat.id, query.message.message_id)

    fake_bot_api.push_callback_query(5, "A")
    updates = fake_bot.get_updates(long_polling_timeout=1)
    assert updates[0].callback_query.message.message_id == message.message_id
    fake_bot.process_new_updates(updates)
    edit = fake_bot_api.sent[-1]
    assert (edit.method, edit.text, edit.message_id) == ("editMessageText", "chose A", message.message_id)
    again = api_error(lambda: fake_bot.answer_callback_query(updates[0].callback_query.id))
    assert again.error_code == 400 and "query is too old" in again.description
    unchanged = api_error(lambda: fake_bot.edit_message_text("chose A", 5, message.message_id))
    assert "message is not modified" in unchanged.description
    missing = api_error(lambda: fake_bot.edit_message_text("x", 5, 999))
    assert missing.description == "Bad Request: message to edit not found"


def test_set_my_commands_and_chat_action(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """setMyCommands and sendChatAction answer true."""
    assert fake_bot.set_my_commands([types.BotCommand("start", "Start the bot")])
    assert fake_bot.send_chat_action(1, "typing")


def test_a_test_adds_a_method_through_the_public_api(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """add_method answers a method the fake lacks (or refuses with ApiError); the call is recorded under its name."""
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    def send_dice(params: dict[str, Any]) -> Any:
        with lock:
            seen.append(params)
        if params.get("emoji") == "🚫":
            raise ApiError(400, "Bad Request: invalid dice emoji")
        return {"message_id": 1, "date": 0, "chat": {"id": int(params["chat_id"]), "type": "private"},
                "dice": {"emoji": params.get("emoji", "🎲"), "value": 6}}

    fake_bot_api.add_method("sendDice", send_dice)
    message = fake_bot.send_dice(42, emoji="🎯")
    assert message.dice.value == 6 and message.dice.emoji == "🎯"
    error = api_error(lambda: fake_bot.send_dice(42, emoji="🚫"))
    assert error.error_code == 400 and error.description == "Bad Request: invalid dice emoji"
    assert [c.method for c in fake_bot_api.calls_to("sendDice")] == ["sendDice", "sendDice"]
    assert len(seen) == 2

    fake_bot_api.add_method("getMe", lambda params: {"id": 7, "is_bot": True, "first_name": "Other"})
    assert fake_bot.get_me().first_name == "Other"  # a built-in one can be replaced
    fake_bot_api.fail("sendDice", 500, "Internal Server Error")
    assert api_error(lambda: fake_bot.send_dice(42)).error_code == 500  # scripted faults apply to added methods
    with pytest.raises(ConfigurationError):
        fake_bot_api.add_method("getUpdates", lambda params: [])
    with pytest.raises(ConfigurationError):
        fake_bot_api.add_method("send dice", send_dice)


# ------------------------------------------------------------------ Telegram's refusals


REFUSALS: list[tuple[str, Callable[[FakeBotAPI], None], Callable[[telebot.TeleBot], Any], int, str]] = [
    (
        "too-long",
        lambda api: None,
        lambda bot: bot.send_message(1, "x" * 4097),
        400,
        "Bad Request: message is too long",
    ),
    (
        "empty-text",
        lambda api: None,
        lambda bot: apihelper.send_message(bot.token, 1, " "),
        400,
        "Bad Request: message text is empty",
    ),
    (
        "forgotten-chat",
        lambda api: api.forget_chat(1),
        lambda bot: bot.send_message(1, "hi"),
        400,
        "Bad Request: chat not found",
    ),
    (
        "blocked",
        lambda api: api.block(1),
        lambda bot: bot.send_message(1, "hi"),
        403,
        "Forbidden: bot was blocked by the user",
    ),
    (
        "deactivated",
        lambda api: api.deactivate(1),
        lambda bot: bot.send_chat_action(1, "typing"),
        403,
        "Forbidden: user is deactivated",
    ),
    (
        "revoked-token",
        lambda api: api.revoke_token(),
        lambda bot: bot.get_me(),
        401,
        "Unauthorized",
    ),
    (
        "wrong-token",
        lambda api: None,
        lambda bot: telebot.TeleBot("123456:" + "x" * 35).get_me(),
        401,
        "Unauthorized",
    ),
    (
        "unknown-method",
        lambda api: None,
        lambda bot: apihelper._make_request(bot.token, "sendTelepathy"),
        404,
        "Not Found",
    ),
]


@pytest.mark.parametrize(
    ("setup", "call", "code", "description"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_telegram_refusals(
    fake_bot_api: FakeBotAPI,
    fake_bot: telebot.TeleBot,
    setup: Callable[[FakeBotAPI], None],
    call: Callable[[telebot.TeleBot], Any],
    code: int,
    description: str,
) -> None:
    """Each refusal Telegram sends arrives with its status, error_code and description, and nothing is sent."""
    setup(fake_bot_api)
    error = api_error(lambda: call(fake_bot))
    assert error.error_code == code
    assert error.result.status_code == code
    assert error.description.startswith(description)
    assert fake_bot_api.sent == []


def test_the_length_limit_counts_visible_text(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """4,096 visible characters pass, markup left out of the count."""
    fake_bot.send_message(1, "y" * 4096)
    fake_bot.send_message(1, "<b>" + "z" * 4096 + "</b>", parse_mode="HTML")
    assert len(fake_bot_api.sent) == 2


# ------------------------------------------------------------------ faults


def test_fail_answers_429_with_retry_after_in_json_and_header(fake_bot_api: FakeBotAPI) -> None:
    """fail(..., 429, retry_after=N) answers Telegram's 429 JSON with parameters.retry_after and Retry-After."""
    fake_bot_api.fail("sendMessage", 429, retry_after=17)
    answer = raw(fake_bot_api, "sendMessage", chat_id=1, text="x")
    assert answer.status_code == 429 and answer.headers["Retry-After"] == "17"
    assert answer.json() == {
        "ok": False,
        "error_code": 429,
        "description": "Too Many Requests: retry after 17",
        "parameters": {"retry_after": 17},
    }
    assert raw(fake_bot_api, "sendMessage", chat_id=1, text="x").json()["ok"]


def test_faults_apply_fifo_per_method_with_times(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """Faults of one method run in order, each `times` times; other methods are untouched."""
    fake_bot_api.fail("sendMessage", 500, times=2)
    fake_bot_api.fail("sendMessage", 502, "Bad Gateway")
    codes = [api_error(lambda: fake_bot.send_message(1, "x")).error_code for _ in range(3)]
    assert codes == [500, 500, 502]
    assert fake_bot.get_me().is_bot
    fake_bot.send_message(1, "finally")
    assert [s.text for s in fake_bot_api.sent] == ["finally"]


def test_forever_faults_until_cleared(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """times=None repeats a fault until clear_faults(); method "*" matches every method."""
    fake_bot_api.fail("*", 503, times=None)
    for _ in range(3):
        assert api_error(fake_bot.get_me).error_code == 503
    fake_bot_api.clear_faults()
    assert fake_bot.get_me().is_bot


def test_drop_closes_the_connection_without_an_answer(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """drop() hangs up after reading the request; by default nothing is sent, with executed=True it is."""
    fake_bot_api.drop("sendMessage")
    with pytest.raises(requests.exceptions.ConnectionError):
        fake_bot.send_message(1, "lost")
    assert fake_bot_api.sent == [] and fake_bot_api.calls_to("sendMessage")
    fake_bot_api.drop("sendMessage", executed=True)
    with pytest.raises(requests.exceptions.ConnectionError):
        fake_bot.send_message(1, "sent but unanswered")
    assert [s.text for s in fake_bot_api.sent] == ["sent but unanswered"]
    assert fake_bot.send_message(1, "fine").text == "fine"


def test_delay_answers_late_and_a_short_timeout_gives_up(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """delay() answers after the given time; a client timeout shorter than it gets a read timeout."""
    fake_bot_api.delay("getMe", 0.3)
    started = time.monotonic()
    assert fake_bot.get_me().is_bot
    assert time.monotonic() - started >= 0.3
    fake_bot_api.delay("sendMessage", 1.0)
    with pytest.raises(requests.exceptions.ReadTimeout):
        fake_bot.send_message(1, "slow", timeout=0.2)
    assert fake_bot_api.wait_sent(1, timeout=6)  # the server still carried it out


def test_malformed_answers_200_with_a_non_json_body(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """malformed() answers HTTP 200 that is not the API's JSON, and the call is not carried out."""
    fake_bot_api.malformed("sendMessage")
    with pytest.raises(apihelper.ApiInvalidJSONException):
        fake_bot.send_message(1, "x")
    fake_bot_api.malformed("sendMessage", body=b'{"result": true}')
    with pytest.raises(KeyError):
        fake_bot.send_message(1, "x")
    assert fake_bot_api.sent == []


def test_fail_with_html_answers_a_non_json_error_page(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """fail(..., html=True) answers an HTML error page with that status, like a proxy in front of Telegram."""
    fake_bot_api.fail("getMe", 502, html=True)
    with pytest.raises(apihelper.ApiHTTPException) as info:
        fake_bot.get_me()
    assert info.value.result.status_code == 502


def test_latency_delays_every_call_of_a_method() -> None:
    """latency= and set_latency() add a delay to each call of that method only."""
    with FakeBotAPI(latency={"getMe": 0.15}) as api:
        bot = telebot.TeleBot(api.token, threaded=False)
        for _ in range(2):
            started = time.monotonic()
            bot.get_me()
            assert time.monotonic() - started >= 0.15
        api.set_latency("getMe", 0)
        api.set_latency("sendChatAction", 0.15)
        started = time.monotonic()
        bot.send_chat_action(1, "typing")
        assert time.monotonic() - started >= 0.15


def test_rate_limiter_answers_429_and_refused_calls_do_not_count(
    fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot
) -> None:
    """Over per_chat_per_s a send gets 429 with retry_after, other chats still pass, and a 429 is not sent."""
    fake_bot_api.rate_limit(per_chat_per_s=2, retry_after=3)
    fake_bot.send_message(1, "a")
    fake_bot.send_message(1, "b")
    error = api_error(lambda: fake_bot.send_message(1, "c"))
    assert error.error_code == 429 and error.result_json["parameters"] == {"retry_after": 3}
    fake_bot.send_message(2, "other chat")
    fake_bot.get_me()  # not a send method
    assert [s.text for s in fake_bot_api.sent] == ["a", "b", "other chat"]
    fake_bot_api.rate_limit(global_per_s=1)
    fake_bot.send_message(3, "one")
    assert api_error(lambda: fake_bot.send_message(4, "two")).error_code == 429
    fake_bot_api.rate_limit()
    fake_bot.send_message(4, "unlimited")


# ------------------------------------------------------------------ lifecycle


def test_install_and_uninstall_restore_telebot_globals() -> None:
    """install() points telebot at the fake and uninstall()/exit restore exactly the previous URLs."""
    before = (apihelper.API_URL, apihelper.FILE_URL)
    api = FakeBotAPI().start()
    try:
        api.install()
        api.install()  # idempotent
        assert (api.api_url, api.file_url) == (apihelper.API_URL, apihelper.FILE_URL)
        assert api.api_url == f"http://127.0.0.1:{api.port}/bot{{0}}/{{1}}"
        with FakeBotAPI() as inner:
            assert inner.api_url == apihelper.API_URL
        assert api.api_url == apihelper.API_URL
        api.uninstall()
        assert before == (apihelper.API_URL, apihelper.FILE_URL)
    finally:
        api.uninstall()
        api.stop()


def test_stop_wakes_a_long_poll_and_joins_its_threads() -> None:
    """stop() answers a waiting long poll at once and leaves no server thread running."""
    api = FakeBotAPI()
    with api:
        bot = telebot.TeleBot(api.token, threaded=False)
        poller = Poller(bot, long_polling_timeout=30, timeout=60)
        poller.start()
        assert api.wait_for(lambda: api.polling)
        started = time.monotonic()
    assert time.monotonic() - started < 5
    poller.join(5)
    assert not poller.is_alive()
    assert poller.result == [] or poller.error is not None
    assert not [t for t in threading.enumerate() if t.name.startswith(f"fake-bot-api:{api.port}")]


def test_restart_on_the_same_port_keeps_state() -> None:
    """A stopped server refuses connections; start() again serves the same port and pending updates."""
    api = FakeBotAPI()
    with api:
        update_id = api.push_message(1, "kept")
        port = api.port
    bot = telebot.TeleBot(api.token, threaded=False)
    with api_urls(api), pytest.raises(requests.exceptions.ConnectionError):
        bot.get_me()
    with api:
        assert api.port == port
        assert [u.update_id for u in bot.get_updates(long_polling_timeout=0.01)] == [update_id]


class api_urls:
    """Install a (maybe stopped) fake's URLs for a block."""

    def __init__(self, api: FakeBotAPI) -> None:
        self.api = api

    def __enter__(self) -> None:
        self.api.install()

    def __exit__(self, *exc: object) -> None:
        self.api.uninstall()


def test_wait_helpers_time_out_false_and_succeed_true(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """wait_sent/wait_confirmed/wait_for return False on timeout and True once the condition holds."""
    assert not fake_bot_api.wait_sent(1, timeout=0.05)
    assert not fake_bot_api.wait_confirmed(5, timeout=0.05)
    sender = threading.Thread(target=fake_bot.send_message, args=(1, "x"), name="test-sender")
    sender.start()
    assert fake_bot_api.wait_sent(1, timeout=5)
    sender.join()
    assert fake_bot_api.wait_for(lambda: len(fake_bot_api.calls) == 1)


def test_concurrent_pushes_get_unique_increasing_ids(fake_bot_api: FakeBotAPI) -> None:
    """Pushes from several threads never share an update id."""
    results: list[list[int]] = [[] for _ in range(4)]

    def push(slot: list[int]) -> None:
        slot.extend(fake_bot_api.push_message(1, "x") for _ in range(200))

    threads = [threading.Thread(target=push, args=(r,), name=f"test-push-{i}") for i, r in enumerate(results)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for r in results for i in r]
    assert len(set(every)) == 800
    assert all(r == sorted(r) for r in results)


def test_constructor_refuses_bad_arguments() -> None:
    """A malformed token, a negative long-poll cap or a bad fault argument is refused with its name."""
    with pytest.raises(ConfigurationError, match="token"):
        FakeBotAPI(token="no-colon")
    with pytest.raises(ConfigurationError, match="max_long_poll"):
        FakeBotAPI(max_long_poll=-1)
    api = FakeBotAPI()
    with pytest.raises(ConfigurationError, match="times"):
        api.fail("sendMessage", 500, times=0)
    with pytest.raises(ConfigurationError, match="status"):
        api.fail("sendMessage", 42)
    with pytest.raises(RuntimeError, match="start"):
        _ = api.api_url


# ------------------------------------------------------------------ the pytest plugin


def test_fake_bot_api_fixture_is_running_and_installed(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """The fake_bot_api fixture is started and installed; fake_bot holds its token and is not threaded."""
    assert fake_bot_api.api_url == apihelper.API_URL
    assert fake_bot.token == fake_bot_api.token and not fake_bot.threaded


def test_fence_store_fixture_opens_a_store_in_tmp_path(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The fence_store fixture yields a SqliteUpdateStore on tmp_path/fence.db."""
    store_module = pytest.importorskip("telegram_fence.store")
    if not hasattr(store_module, "SqliteUpdateStore"):
        pytest.skip("telegram_fence.store.SqliteUpdateStore is not written yet")
    store = request.getfixturevalue("fence_store")
    assert isinstance(store, store_module.SqliteUpdateStore)
    assert (tmp_path / "fence.db").exists()


def test_unreadable_requests_get_answers_not_silence(fake_bot_api: FakeBotAPI) -> None:
    """A JSON body that does not parse is a 400; a request the fake cannot handle is a 500 kept in internal_errors."""
    url = fake_bot_api.api_url.format(fake_bot_api.token, "sendMessage")
    bad_json = requests.post(url, data=b"{not json", headers={"Content-Type": "application/json"}, timeout=5)
    assert bad_json.status_code == 400 and bad_json.json()["description"].startswith("Bad Request")
    assert fake_bot_api.internal_errors == []
    with socket.create_connection(("127.0.0.1", fake_bot_api.port), timeout=5) as sock:
        path = f"/bot{fake_bot_api.token}/getMe"
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: many\r\n\r\n".encode())
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 500")
    assert len(fake_bot_api.internal_errors) == 1


def test_testing_package_exports_exactly_the_public_names() -> None:
    """telegram_fence.testing exports the fake server and its record types, and nothing else by accident."""
    import telegram_fence.testing as testing

    assert set(testing.__all__) >= {"ApiError", "Call", "FakeBotAPI", "Sent", "UploadedFile"}
    assert all(hasattr(testing, name) for name in testing.__all__)
