"""telegram_fence.telegram against real exceptions that telebot raises when talking to the fake Bot API."""

from __future__ import annotations

import errno
import http.client
import socket
import ssl
from collections.abc import Callable
from typing import Any

import pytest
import requests
import telebot
from telebot import apihelper
from tls_helpers import Authority, TlsFront, make_ca

from telegram_fence import telegram
from telegram_fence.errors import (
    Ambiguous,
    Conflict,
    Fatal,
    MessageRefused,
    RecipientGone,
    RetryAfter,
    TelegramError,
    Transient,
    Unauthorized,
)
from telegram_fence.ingress.long_poll import get_updates
from telegram_fence.telegram import call, classify, mask_tokens
from telegram_fence.testing import FakeBotAPI


def send(bot: telebot.TeleBot) -> Any:
    """The call most cases make: one plain sendMessage."""
    return bot.send_message(7, "hello")


def raised_by(fn: Callable[[], Any]) -> BaseException:
    """The exception ``fn`` raises (the test fails if it raises none)."""
    try:
        fn()
    except Exception as exc:
        return exc
    pytest.fail("the call did not raise")


# (id, setup on the fake, the telebot call, the class classify must pick, the foreign exception type)
CASES: list[tuple[str, Callable[[FakeBotAPI], Any], Callable[[telebot.TeleBot], Any], type, type]] = [
    (
        "429-json",
        lambda api: api.fail("sendMessage", 429, retry_after=12),
        send,
        RetryAfter,
        apihelper.ApiTelegramException,
    ),
    (
        "429-rate-limiter",
        lambda api: api.rate_limit(per_chat_per_s=1, retry_after=9),
        lambda bot: (bot.send_message(7, "first"), bot.send_message(7, "second")),
        RetryAfter,
        apihelper.ApiTelegramException,
    ),
    (
        "429-html-retry-after-header",
        lambda api: api.fail("sendMessage", 429, retry_after=12, html=True),
        send,
        RetryAfter,
        apihelper.ApiHTTPException,
    ),
    # Any 5xx may come after the server (behind a gateway) acted: never "not sent".
    ("500-json", lambda api: api.fail("sendMessage", 500), send, Ambiguous, apihelper.ApiTelegramException),
    ("502-json", lambda api: api.fail("sendMessage", 502), send, Ambiguous, apihelper.ApiTelegramException),
    (
        "502-html",
        lambda api: api.fail("sendMessage", 502, html=True),
        send,
        Ambiguous,
        apihelper.ApiHTTPException,
    ),
    (
        "504-html",
        lambda api: api.fail("sendMessage", 504, html=True),
        send,
        Ambiguous,
        apihelper.ApiHTTPException,
    ),
    (
        "503-html",
        lambda api: api.fail("sendMessage", 503, html=True),
        send,
        Ambiguous,
        apihelper.ApiHTTPException,
    ),
    (
        "dropped-after-the-server-acted",
        lambda api: api.drop("sendMessage", executed=True),
        send,
        Ambiguous,
        requests.exceptions.ConnectionError,
    ),
    (
        "dropped-after-sending",
        lambda api: api.drop("sendMessage"),
        send,
        Ambiguous,
        requests.exceptions.ConnectionError,
    ),
    (
        "read-timeout",
        lambda api: api.delay("sendMessage", 1.0),
        lambda bot: bot.send_message(7, "slow", timeout=0.2),
        Ambiguous,
        requests.exceptions.ReadTimeout,
    ),
    (
        "malformed-body",
        lambda api: api.malformed("sendMessage"),
        send,
        Ambiguous,
        apihelper.ApiInvalidJSONException,
    ),
    (
        "json-without-ok",
        lambda api: api.malformed("sendMessage", body=b'{"result": true}'),
        send,
        Ambiguous,
        KeyError,
    ),
    (
        "400-too-long",
        lambda api: None,
        lambda bot: bot.send_message(7, "x" * 5000),
        MessageRefused,
        apihelper.ApiTelegramException,
    ),
    (
        "400-cannot-parse-entities",
        lambda api: api.fail("sendMessage", 400, "Bad Request: can't parse entities: Can't find end tag"),
        lambda bot: bot.send_message(7, "<b>open", parse_mode="HTML"),
        MessageRefused,
        apihelper.ApiTelegramException,
    ),
    (
        "403-blocked",
        lambda api: api.block(7),
        send,
        RecipientGone,
        apihelper.ApiTelegramException,
    ),
    (
        "403-deactivated",
        lambda api: api.deactivate(7),
        send,
        RecipientGone,
        apihelper.ApiTelegramException,
    ),
    (
        "403-kicked-from-group",
        lambda api: api.block(-100),
        lambda bot: bot.send_message(-100, "hi"),
        RecipientGone,
        apihelper.ApiTelegramException,
    ),
    (
        "400-chat-not-found",
        lambda api: api.forget_chat(7),
        send,
        RecipientGone,
        apihelper.ApiTelegramException,
    ),
    (
        "409-webhook",
        lambda api: api.fail("getUpdates", 409, "Conflict: can't use getUpdates method while webhook is active"),
        lambda bot: bot.get_updates(long_polling_timeout=0.01),
        Conflict,
        apihelper.ApiTelegramException,
    ),
    (
        "401-revoked",
        lambda api: api.revoke_token(),
        send,
        Unauthorized,
        apihelper.ApiTelegramException,
    ),
    (
        "404-unknown-method",
        lambda api: None,
        lambda bot: apihelper._make_request(bot.token, "sendHologram"),
        Fatal,
        apihelper.ApiTelegramException,
    ),
]


@pytest.mark.parametrize(("setup", "action", "expected", "foreign"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_classify_real_telebot_exceptions(
    fake_bot_api: FakeBotAPI,
    fake_bot: telebot.TeleBot,
    setup: Callable[[FakeBotAPI], Any],
    action: Callable[[telebot.TeleBot], Any],
    expected: type,
    foreign: type,
) -> None:
    """Each failure telebot raises against the fake is classified into the error class that tells the next step."""
    setup(fake_bot_api)
    exc = raised_by(lambda: action(fake_bot))
    assert isinstance(exc, foreign), repr(exc)
    classified = classify(exc, "sendMessage")
    assert type(classified) is expected, f"{exc!r} -> {classified!r}"
    assert fake_bot_api.token.split(":")[1] not in str(classified)


def test_retry_after_carries_the_seconds_from_json_and_from_the_header(
    fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot
) -> None:
    """RetryAfter.seconds is Telegram's parameters.retry_after, or the Retry-After header of a non-JSON 429."""
    fake_bot_api.fail("sendMessage", 429, retry_after=37)
    from_json = classify(raised_by(lambda: send(fake_bot)))
    fake_bot_api.fail("sendMessage", 429, retry_after=8, html=True)
    from_header = classify(raised_by(lambda: send(fake_bot)))
    assert isinstance(from_json, RetryAfter) and from_json.seconds == 37
    assert isinstance(from_header, RetryAfter) and from_header.seconds == 8
    assert from_json.error_code == 429 and from_json.method == "sendMessage"


def _refused_send() -> tuple[FakeBotAPI, BaseException]:
    """A fake started and stopped (its port now closed) and what telebot raised sending to it."""
    api = FakeBotAPI()
    with api:
        pass
    bot = telebot.TeleBot(api.token, threaded=False)
    api.install()
    try:
        return api, raised_by(lambda: send(bot))
    finally:
        api.uninstall()


def test_refused_connection_is_transient_and_its_text_is_masked() -> None:
    """A closed port gives a requests ConnectionError (URL with the token inside); classify says Transient, masked."""
    api, exc = _refused_send()
    assert isinstance(exc, requests.exceptions.ConnectionError)
    secret = api.token.split(":")[1]
    assert secret in str(exc)  # telebot's own error leaks the token...
    classified = classify(exc, "sendMessage")
    assert isinstance(classified, Transient)
    assert secret not in str(classified) and secret not in classified.description  # ...ours does not
    assert f"{api.bot_id}:***" in str(classified)


def test_a_refused_connection_is_told_once_not_once_per_wrapper() -> None:
    """requests wraps urllib3's MaxRetryError, which wraps the refused socket, and each quotes the one inside: the
    classified text tells the wrapper once and ends with the root cause (it was the same sentence three times)."""
    _, exc = _refused_send()
    classified = classify(exc, "sendMessage")
    text = str(classified)
    assert isinstance(classified, Transient)
    assert text.count("Max retries exceeded") == 1, text
    assert "ConnectionError: " in text  # the outermost is kept...
    assert text.endswith("ConnectionRefusedError: [Errno 111] Connection refused"), text  # ...and the root cause


def test_call_raises_the_classified_error_chained_to_the_original(
    fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot
) -> None:
    """call() returns the result on success and raises the classified error `from` telebot's on failure."""
    assert call("getMe", fake_bot.get_me).is_bot
    fake_bot_api.block(7)
    with pytest.raises(RecipientGone) as info:
        call("sendMessage", send, fake_bot)
    assert isinstance(info.value.__cause__, apihelper.ApiTelegramException)
    assert info.value.error_code == 403 and info.value.method == "sendMessage"


def test_get_updates_returns_raw_dicts_and_confirms_the_offset(fake_bot_api: FakeBotAPI) -> None:
    """get_updates hands back Telegram's dicts and an offset confirms what lies below it."""
    first, second = fake_bot_api.push_messages(2)
    batch = get_updates(fake_bot_api.token, 0, long_poll_timeout=0.01)
    assert [u["update_id"] for u in batch] == [first, second]
    assert batch[0]["message"]["text"] == "message 0"
    assert get_updates(fake_bot_api.token, second + 1, long_poll_timeout=0.01) == []
    assert fake_bot_api.confirmed_offset == second + 1


def test_get_updates_raises_conflict_when_another_poller_holds_the_token(fake_bot_api: FakeBotAPI) -> None:
    """get_updates turns the 409 of a webhook into Conflict chained to telebot's exception."""
    fake_bot_api.push_update({"message": {"message_id": 1}})
    assert telebot.TeleBot(fake_bot_api.token).set_webhook("https://example.org/hook")
    with pytest.raises(Conflict) as info:
        get_updates(fake_bot_api.token, 0, long_poll_timeout=0.01)
    assert isinstance(info.value.__cause__, apihelper.ApiTelegramException)


def test_a_token_inside_an_error_description_is_masked(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """Whatever text the server sends back, the classified error never repeats the token."""
    fake_bot_api.fail("sendMessage", 400, f"Bad Request: weird echo of {fake_bot_api.token}")
    classified = classify(raised_by(lambda: send(fake_bot)))
    assert isinstance(classified, MessageRefused)
    assert fake_bot_api.token not in str(classified)
    assert f"{fake_bot_api.bot_id}:***" in classified.description


def test_classify_passes_telegram_errors_through_and_never_raises() -> None:
    """A TelegramError is returned as is; anything unknown becomes Fatal; OS-level errors are judged by kind."""
    original = Transient("x")
    assert classify(original) is original
    assert isinstance(classify(ValueError("odd")), Fatal)
    assert isinstance(classify(ConnectionRefusedError()), Transient)
    assert isinstance(classify(ConnectionResetError()), Ambiguous)
    assert isinstance(classify(TimeoutError()), Ambiguous)
    # A broken answer on the poller's own connection: it may have been acted on.
    assert isinstance(classify(http.client.IncompleteRead(b"{")), Ambiguous)
    assert isinstance(classify(http.client.BadStatusLine("x")), Ambiguous)
    assert all(isinstance(classify(e), TelegramError) for e in (KeyError("x"), RuntimeError(), OSError()))


TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawQ"

MASK_CASES = [
    (f"GET /bot{TOKEN}/getUpdates?offset=5", "GET /bot123456789:***/getUpdates?offset=5"),
    (
        f"https://api.telegram.org/file/bot{TOKEN}/photos/a.jpg",
        "https://api.telegram.org/file/bot123456789:***/photos/a.jpg",
    ),
    (f"token={TOKEN}", "token=123456789:***"),
    (f"{TOKEN} and {TOKEN[:-1]}Z", "123456789:*** and 123456789:***"),
    ("chat 123456789:short is not a token", "chat 123456789:short is not a token"),
    ("12:30 meeting", "12:30 meeting"),
    ("", ""),
]


@pytest.mark.parametrize(("text", "expected"), MASK_CASES)
def test_mask_tokens(text: str, expected: str) -> None:
    """Tokens are masked wherever they appear (URLs included), the bot id is kept, other text is untouched."""
    assert mask_tokens(text) == expected


def test_mask_tokens_also_masks_given_secrets() -> None:
    """Configured secrets are replaced too; empty secrets are ignored."""
    assert mask_tokens("pw=hunter2 key=abc", secrets=("hunter2", "", "abc")) == "pw=*** key=***"


def test_set_api_server_returns_and_restores_the_previous_urls() -> None:
    """set_api_server returns the previous pair so a caller can put it back exactly."""
    before = (apihelper.API_URL, apihelper.FILE_URL)
    previous = telegram.set_api_server("http://127.0.0.1:1/bot{0}/{1}", "http://127.0.0.1:1/file/bot{0}/{1}")
    try:
        assert previous == before
        assert apihelper.API_URL == "http://127.0.0.1:1/bot{0}/{1}"
    finally:
        telegram.set_api_server(*previous)
    assert before == (apihelper.API_URL, apihelper.FILE_URL)


# --- what counts as "not sent" -------------------------------------------------


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_ca(tmp_path_factory.mktemp("ca"))


def test_a_tls_failure_after_the_server_acted_is_ambiguous(
    fake_bot_api: FakeBotAPI, authority: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requests SSLError raised while the answer is read (the message was sent) is Ambiguous, not Transient
    ("not sent"), so a broadcast does not send again."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(authority.ca))
    with TlsFront(authority, fake_bot_api.port, break_after=("sendMessage",)) as front, telegram.api_server(
        front.api_url
    ):
        bot = telebot.TeleBot(fake_bot_api.token, threaded=False)
        exc = raised_by(lambda: send(bot))
    assert isinstance(exc, requests.exceptions.SSLError), repr(exc)
    assert front.broken == ["sendMessage"] and len(fake_bot_api.sent_to(7)) == 1  # the server did act
    classified = classify(exc, "sendMessage")
    assert type(classified) is Ambiguous, repr(classified)
    assert fake_bot_api.token.split(":")[1] not in str(classified)


def test_an_untrusted_certificate_is_fatal_and_says_so(
    fake_bot_api: FakeBotAPI, authority: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A certificate that fails verification is Fatal (retrying cannot fix it) and the text names the cause."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    with TlsFront(authority, fake_bot_api.port) as front, telegram.api_server(front.api_url):
        bot = telebot.TeleBot(fake_bot_api.token, threaded=False)
        exc = raised_by(lambda: send(bot))
    assert isinstance(exc, requests.exceptions.SSLError), repr(exc)
    classified = classify(exc, "sendMessage")
    assert type(classified) is Fatal and "certificate verification failed" in str(classified)
    assert telegram.is_certificate_failure(exc) and not fake_bot_api.sent_to(7)


def _raised(error: BaseException) -> BaseException:
    """``error`` as raised (so it carries a traceback and any context)."""
    try:
        raise error
    except BaseException as exc:
        return exc


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), Transient),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), Transient),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), Transient),
        (OSError(errno.EHOSTUNREACH, "No route to host"), Transient),
        (OSError(errno.EPIPE, "Broken pipe"), Ambiguous),
        (OSError("something else on the socket"), Ambiguous),
        (ConnectionResetError(errno.ECONNRESET, "reset"), Ambiguous),
        (ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC] decryption failed"), Ambiguous),
        (ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"), Fatal),
        (TimeoutError("timed out"), Ambiguous),
        (http.client.RemoteDisconnected("Remote end closed connection without response"), Ambiguous),
        (requests.exceptions.SSLError("EOF occurred in violation of protocol"), Ambiguous),
        (requests.exceptions.ReadTimeout("read timed out"), Ambiguous),
        (requests.exceptions.ConnectTimeout("connect timed out"), Transient),
        (requests.exceptions.ConnectionError("Failed to establish a new connection: connection refused"), Ambiguous),
        (requests.exceptions.ChunkedEncodingError("Connection broken: IncompleteRead"), Ambiguous),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else value.__name__,
)
def test_classify_counts_only_certain_failures_as_not_sent(error: BaseException, expected: type) -> None:
    """Transient only for failures that certainly came before the request was sent; a text is never evidence."""
    assert type(classify(_raised(error), "sendMessage")) is expected


@pytest.mark.parametrize(
    ("code", "expected"),
    [(500, Ambiguous), (502, Ambiguous), (503, Ambiguous), (504, Ambiguous), (408, Transient), (404, Fatal)],
)
def test_server_errors_are_ambiguous_from_json_and_from_bare_status(code: int, expected: type) -> None:
    """A 5xx (JSON answer or a gateway's bare status) may come after the server acted; a 408 did not reach it."""
    assert type(telegram.from_http_status(code, f"HTTP {code}", "sendMessage", {})) is expected
    if code != 408:
        assert type(telegram.from_answer(code, "error", {}, "sendMessage")) is expected


@pytest.mark.parametrize("order", ["started", "reversed"])
def test_two_request_senders_undone_in_either_order_restore_the_applications_own(order: str) -> None:
    """Two fences in one process install a sender each; stopped in the order they started (or the other), the
    application's own CUSTOM_REQUEST_SENDER is back and no undone sender stays in telebot's global."""
    def own(*args: Any, **kwargs: Any) -> Any:
        return None

    previous = apihelper.CUSTOM_REQUEST_SENDER
    apihelper.CUSTOM_REQUEST_SENDER = own  # type: ignore[assignment]
    try:
        first = telegram.install_request_sender(lambda *request: None)
        second = telegram.install_request_sender(lambda *request: None)
        undos = [first, second] if order == "started" else [second, first]
        undos[0]()
        assert apihelper.CUSTOM_REQUEST_SENDER is not own  # the other fence still runs: its sender stays
        undos[1]()
        assert apihelper.CUSTOM_REQUEST_SENDER is own
    finally:
        apihelper.CUSTOM_REQUEST_SENDER = previous
