"""The fake Bot API's webhook mode, delivering to a real HTTP receiver on this machine."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
import telebot
from telebot import apihelper

from telegram_fence.testing import FakeBotAPI
from telegram_fence.testing.fake_api.webhook import describe_failure

SECRET = "s3cret_token-1"


class _ReceiverServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # forty connections at once must not overflow the listen backlog


class Receiver:
    """A tiny webhook endpoint: answers each POST from a script (then 200), counting concurrent requests."""

    def __init__(self, script: list[int | str] | None = None, *, forever: int | None = None, port: int = 0) -> None:
        self.script = list(script or [])
        self.forever = forever  # answer this status to everything once the script is used up
        self.cond = threading.Condition()
        self.requests: list[dict[str, Any]] = []  # {"update": ..., "headers": ..., "answer": ...}
        self.active = 0
        self.max_active = 0
        self.gate: threading.Event | None = None  # when set to an Event, requests wait for it
        self.server = _ReceiverServer(("127.0.0.1", port), self._handler())
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="test-webhook-receiver", daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook?x=1"

    def close(self) -> None:
        if self.gate is not None:
            self.gate.set()
        self.server.shutdown()
        self.thread.join()
        self.server.server_close()

    def update_ids(self, answer: int | str | None = None) -> list[int]:
        with self.cond:
            return [r["update"]["update_id"] for r in self.requests if answer is None or r["answer"] == answer]

    def wait(self, predicate: Any, timeout: float = 10.0) -> bool:
        with self.cond:
            return bool(self.cond.wait_for(predicate, timeout))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.cond:
                    receiver.active += 1
                    receiver.max_active = max(receiver.max_active, receiver.active)
                    answer: int | str = receiver.script.pop(0) if receiver.script else (receiver.forever or 200)
                    gate = receiver.gate
                    receiver.cond.notify_all()
                counted = True
                try:
                    if gate is not None:
                        gate.wait(30)
                    with receiver.cond:
                        receiver.requests.append(
                            {
                                "update": json.loads(body),
                                "headers": dict(self.headers),
                                "answer": answer,
                                "path": self.path,
                            }
                        )
                        # No longer active once it starts answering: the fake may start the next delivery as
                        # soon as the answer arrives, before this thread would reach its finally.
                        receiver.active -= 1
                        counted = False
                        receiver.cond.notify_all()
                    if answer == "drop":
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    assert isinstance(answer, int)
                    self.send_response(answer)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                finally:
                    if counted:
                        with receiver.cond:
                            receiver.active -= 1
                            receiver.cond.notify_all()

        return Handler


@pytest.fixture
def api() -> Iterator[FakeBotAPI]:
    with FakeBotAPI(webhook_retry_delay=0.01, webhook_max_retry_delay=0.05) as fake:
        yield fake


@pytest.fixture
def bot(api: FakeBotAPI) -> telebot.TeleBot:
    return telebot.TeleBot(api.token, threaded=False)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    yield rec
    rec.close()


def webhook_threads(api: FakeBotAPI) -> list[threading.Thread]:
    """The fake's live delivery threads."""
    prefix = f"fake-bot-api:{api.port}-webhook-"
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def poll_now(api: FakeBotAPI) -> list[Any]:
    """getUpdates without waiting (telebot always asks for a long poll), over plain HTTP."""
    answer = requests.get(api.api_url.format(api.token, "getUpdates"), params={"timeout": 0}, timeout=10).json()
    assert answer["ok"], answer
    return list(answer["result"])


def info(api: FakeBotAPI) -> dict[str, Any]:
    """getWebhookInfo's raw result, over plain HTTP."""
    answer = requests.get(api.api_url.format(api.token, "getWebhookInfo"), timeout=10).json()
    assert answer["ok"]
    return dict(answer["result"])


# ------------------------------------------------------------------ delivery


def test_delivery_posts_the_update_with_the_secret_header(
    api: FakeBotAPI, bot: telebot.TeleBot, receiver: Receiver
) -> None:
    """A pushed update is POSTed as JSON to the webhook's path with the secret header, then leaves the queue."""
    assert bot.set_webhook(receiver.url, secret_token=SECRET)
    update_id = api.push_message(42, "hello")
    assert api.wait_delivered(10)
    [request] = receiver.requests
    assert request["update"]["update_id"] == update_id and request["update"]["message"]["text"] == "hello"
    assert request["path"] == "/hook?x=1"
    assert request["headers"]["X-Telegram-Bot-Api-Secret-Token"] == SECRET
    assert request["headers"]["Content-Type"] == "application/json"
    assert api.pending_count == 0 and api.webhook_deliveries == 1 and api.webhook_attempts == 1


def test_no_secret_no_secret_header(api: FakeBotAPI, bot: telebot.TeleBot, receiver: Receiver) -> None:
    """Without a secret_token the delivery carries no secret header."""
    assert bot.set_webhook(receiver.url)
    api.push_message(42, "hello")
    assert api.wait_delivered(10)
    assert "X-Telegram-Bot-Api-Secret-Token" not in receiver.requests[0]["headers"]


def test_updates_queued_before_the_webhook_are_delivered(
    api: FakeBotAPI, bot: telebot.TeleBot, receiver: Receiver
) -> None:
    """Updates pending when the webhook is set are delivered to it."""
    ids = api.push_messages(3, chats=[1, 2])
    assert bot.set_webhook(receiver.url)
    assert api.wait_delivered(10)
    assert sorted(receiver.update_ids()) == ids


def test_a_500_is_retried_until_a_2xx_and_reported(api: FakeBotAPI, bot: telebot.TeleBot) -> None:
    """A non-2xx answer keeps the update queued and is retried; getWebhookInfo shows the error."""
    receiver = Receiver([500, 500])
    try:
        assert bot.set_webhook(receiver.url)
        update_id = api.push_message(7, "retry me")
        assert api.wait_delivered(10)
        assert receiver.update_ids() == [update_id] * 3
        assert [r["answer"] for r in receiver.requests] == [500, 500, 200]
        assert api.webhook_attempts == 3 and api.webhook_deliveries == 1
        result = info(api)
        assert result["last_error_message"] == "Wrong response from the webhook: 500 Internal Server Error"
        assert isinstance(result["last_error_date"], int) and result["last_error_date"] > 0
    finally:
        receiver.close()


def test_a_dropped_connection_is_retried(api: FakeBotAPI, bot: telebot.TeleBot) -> None:
    """A connection closed without an answer counts as a failure and the update is delivered again."""
    receiver = Receiver(["drop"])
    try:
        assert bot.set_webhook(receiver.url)
        update_id = api.push_message(7, "again")
        assert api.wait_delivered(10)
        assert receiver.update_ids() == [update_id, update_id]
        assert receiver.update_ids(200) == [update_id]
        assert info(api)["last_error_message"] == "Connection reset by peer"
    finally:
        receiver.close()


def test_a_refused_connection_is_retried_until_the_receiver_is_back(api: FakeBotAPI, bot: telebot.TeleBot) -> None:
    """While nothing listens the update stays queued with "Connection refused"; a receiver back on the port gets it."""
    receiver = Receiver()
    port = receiver.port
    assert bot.set_webhook(receiver.url, secret_token=SECRET)
    receiver.close()
    update_id = api.push_message(9, "are you there")
    assert api.wait_for(lambda: api.webhook_attempts >= 2, 10)
    result = info(api)
    assert result["last_error_message"] == "Connection refused"
    assert result["pending_update_count"] == 1
    back = Receiver(port=port)
    try:
        assert api.wait_delivered(10)
        assert back.update_ids() == [update_id]
    finally:
        back.close()


def test_max_connections_caps_concurrent_deliveries(api: FakeBotAPI, bot: telebot.TeleBot, receiver: Receiver) -> None:
    """With max_connections=3 and ten updates queued, exactly three deliveries are in flight at once."""
    receiver.gate = threading.Event()
    assert bot.set_webhook(receiver.url, max_connections=3)
    ids = api.push_messages(10, chats=[1, 2, 3, 4, 5])
    assert receiver.wait(lambda: receiver.active == 3)
    assert api.webhook_in_flight == 3
    assert len(webhook_threads(api)) <= 3
    receiver.gate.set()
    assert api.wait_delivered(10)
    assert receiver.max_active == 3
    assert sorted(receiver.update_ids()) == ids  # each delivered once


def test_one_connection_delivers_in_update_id_order(api: FakeBotAPI, bot: telebot.TeleBot) -> None:
    """With one connection a failed update is retried before any later one is sent."""
    receiver = Receiver([503])
    try:
        ids = api.push_messages(4, chats=[1, 2])
        assert bot.set_webhook(receiver.url, max_connections=1)
        assert api.wait_delivered(10)
        assert receiver.update_ids() == [ids[0], *ids]
    finally:
        receiver.close()


def test_stop_cuts_deliveries_and_joins_threads_and_start_resumes(api: FakeBotAPI, bot: telebot.TeleBot) -> None:
    """stop() joins every delivery thread and keeps unanswered updates queued; after start() they arrive."""
    receiver = Receiver()
    receiver.gate = threading.Event()
    try:
        assert bot.set_webhook(receiver.url, max_connections=2)
        ids = api.push_messages(3)
        assert receiver.wait(lambda: receiver.active == 2)
        api.stop()
        assert webhook_threads(api) == []
        assert api.pending_count == 3
        receiver.gate.set()
        receiver.wait(lambda: receiver.active == 0)
        api.start()
        assert api.wait_delivered(10)
        assert api.webhook_deliveries == 3 and sorted(receiver.update_ids()[2:]) == ids  # two cut, then all three
    finally:
        receiver.close()


# ------------------------------------------------------------------ polling vs. webhook


def test_get_updates_409_while_set_and_pending_kept_after_delete(api: FakeBotAPI, bot: telebot.TeleBot) -> None:
    """getUpdates answers 409 while a webhook is set; deleteWebhook keeps what was not delivered, unless dropped."""
    receiver = Receiver(forever=503)
    try:
        assert bot.set_webhook(receiver.url)
        ids = api.push_messages(2)
        with pytest.raises(apihelper.ApiTelegramException) as error:
            bot.get_updates(long_polling_timeout=1)
        assert error.value.error_code == 409
        assert "can't use getUpdates method while webhook is active" in error.value.description
        assert bot.delete_webhook()
        assert [u.update_id for u in bot.get_updates(long_polling_timeout=1)] == ids

        assert bot.set_webhook(receiver.url)
        api.push_message(3, "dropped")
        assert bot.delete_webhook(drop_pending_updates=True)
        assert api.pending_count == 0
        assert poll_now(api) == []
    finally:
        receiver.close()


def test_set_webhook_ends_a_running_long_poll_with_409(
    api: FakeBotAPI, bot: telebot.TeleBot, receiver: Receiver
) -> None:
    """A getUpdates long poll waiting when the webhook is set is answered 409 at once."""
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            telebot.TeleBot(api.token, threaded=False).get_updates(long_polling_timeout=20)
        except BaseException as exc:
            errors.append(exc)

    poller = threading.Thread(target=poll, name="test-long-poll")
    poller.start()
    assert api.wait_for(lambda: api.polling, 10)
    assert bot.set_webhook(receiver.url)
    poller.join(10)
    assert not poller.is_alive()
    [error] = errors
    assert isinstance(error, apihelper.ApiTelegramException) and error.error_code == 409


# ------------------------------------------------------------------ setWebhook and getWebhookInfo


def test_get_webhook_info_fields_and_never_the_secret(
    api: FakeBotAPI, bot: telebot.TeleBot, receiver: Receiver
) -> None:
    """getWebhookInfo answers url, certificate, pending count and max_connections, never the secret."""
    empty = info(api)
    assert empty == {"url": "", "has_custom_certificate": False, "pending_update_count": 0}
    receiver.gate = threading.Event()
    assert bot.set_webhook(
        receiver.url, secret_token=SECRET, max_connections=5, allowed_updates=["message", "callback_query"]
    )
    api.push_message(1, "held")
    assert receiver.wait(lambda: receiver.active == 1)
    raw = requests.get(api.api_url.format(api.token, "getWebhookInfo"), timeout=10).text
    assert SECRET not in raw
    result = json.loads(raw)["result"]
    assert result == {
        "url": receiver.url,
        "has_custom_certificate": False,
        "pending_update_count": 1,
        "max_connections": 5,
    }
    receiver.gate.set()
    assert api.wait_delivered(10)
    assert info(api)["pending_update_count"] == 0


def test_default_max_connections_is_40(api: FakeBotAPI, bot: telebot.TeleBot, receiver: Receiver) -> None:
    """A webhook set without max_connections reports 40."""
    assert bot.set_webhook(receiver.url)
    assert bot.get_webhook_info().max_connections == 40


def test_telebot_webhook_calls_work(api: FakeBotAPI, bot: telebot.TeleBot, receiver: Receiver) -> None:
    """telebot's set_webhook, get_webhook_info and remove_webhook work against the fake."""
    assert bot.set_webhook(receiver.url, secret_token=SECRET, max_connections=2, drop_pending_updates=True)
    hook = bot.get_webhook_info()
    assert hook.url == receiver.url and hook.max_connections == 2 and hook.pending_update_count == 0
    assert hook.last_error_message is None
    assert api.webhook_url == receiver.url
    assert bot.remove_webhook()
    assert api.webhook_url == "" and bot.get_webhook_info().url == ""
    assert poll_now(api) == []


def test_allowed_updates_filter_deliveries(api: FakeBotAPI, bot: telebot.TeleBot, receiver: Receiver) -> None:
    """Update kinds outside allowed_updates are not delivered."""
    assert bot.set_webhook(receiver.url, allowed_updates=["callback_query"])
    api.push_message(1, "not wanted")
    wanted = api.push_callback_query(1, "press")
    assert api.wait_delivered(10)
    assert receiver.update_ids() == [wanted]


@pytest.mark.parametrize(
    ("params", "description"),
    [
        ({"url": "http://example.org/hook"}, "An HTTPS URL must be provided"),
        ({"url": "http://127.0.0.1:1/hook", "max_connections": "0"}, "max_connections"),
        ({"url": "http://127.0.0.1:1/hook", "max_connections": "101"}, "max_connections"),
        ({"url": "http://127.0.0.1:1/hook", "secret_token": "no spaces"}, "secret token"),
        ({"url": "ftp://127.0.0.1/hook"}, "bad webhook"),
    ],
)
def test_set_webhook_refusals(api: FakeBotAPI, params: dict[str, str], description: str) -> None:
    """setWebhook refuses non-HTTPS URLs off this machine, max_connections outside 1..100 and bad secrets."""
    answer = requests.post(api.api_url.format(api.token, "setWebhook"), data=params, timeout=10)
    assert answer.status_code == 400 and description in answer.json()["description"]
    assert api.webhook_url == ""


def test_https_webhook_elsewhere_is_registered_but_never_delivered_to(api: FakeBotAPI, bot: telebot.TeleBot) -> None:
    """A webhook off this machine is accepted and reported, and updates stay queued (the fake never leaves it)."""
    assert bot.set_webhook("https://example.org/hook")
    api.push_message(1, "stays")
    assert not api.wait_delivered(0.3)
    assert api.webhook_attempts == 0 and bot.get_webhook_info().pending_update_count == 1


# ------------------------------------------------------------------ pure decisions


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (ConnectionRefusedError(), "Connection refused"),
        (ConnectionResetError(), "Connection reset by peer"),
        (http.client.RemoteDisconnected(), "Connection reset by peer"),
        (TimeoutError(), "Read timeout expired"),
    ],
)
def test_failure_messages(exc: BaseException, message: str) -> None:
    """A delivery without an HTTP answer is reported with Telegram's wording."""
    assert describe_failure(exc) == message
