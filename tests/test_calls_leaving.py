"""When a handler's Bot API call leaves, on both backends: only while its attempt owns the update (also after a
wait for the rate limits), never with a stale claim's answer written over another attempt's verdict, never
``uncertain`` when it failed before leaving, and a retried album of uploads is the same call. Real HTTP against
FakeBotAPI, SQLite files and the PostgreSQL server of TELEGRAM_FENCE_PG_DSN (skipped without it)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, stop
from pg_support import BACKENDS, no_wait, store_of
from tls_helpers import TlsFront, make_ca

from telegram_fence import OwnershipLost, Rates, queue_calls, telegram
from telegram_fence.calls.journal import list_calls
from telegram_fence.testing import FakeBotAPI, UploadedFile


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh store of each backend (the PostgreSQL tables are dropped afterwards)."""
    with store_of(request.param, tmp_path, "tf_leave") as store:
        yield store


def _rows(store: Any) -> list[Any]:
    with store.write() as conn:
        return list(list_calls(conn))


@pytest.mark.parametrize("hold", ["429", "bucket"])
def test_a_call_waiting_for_the_rate_limits_does_not_leave_once_its_attempt_lost_the_update(
        api: FakeBotAPI, store: Any, hold: str) -> None:
    """A reply waiting inside the journal for 5 s (a 429's retry_after, or an empty rate-limit bucket) while its
    handler passes handler_timeout (4 s) and a new attempt takes the update: the first attempt's call raises
    OwnershipLost instead of sending (and spends no token), and the new attempt sends the reply once the wait is
    over, once. (The new attempt's own 4 s cover the rest of the wait even when the first call took seconds.)"""
    options: dict[str, Any] = {}
    if hold == "429":
        api.fail("sendMessage", 429, retry_after=5)
    else:
        options["rate_limits"] = Rates(per_chat=0.2, chat_burst=1)
    bot = telebot.TeleBot(api.token, threaded=False)
    fence = make_fence(bot, store, handler_timeout=4.0, workers=2, retry=no_wait, **options)
    results: dict[int, Any] = {}
    second_done = threading.Event()

    @fence.attempt_handler
    def handler(upd: telebot.types.Update, ctx: Any) -> None:
        if hold == "bucket":
            bot.send_message(upd.message.chat.id, "first")  # spends the chat's one token
        try:
            results[ctx.attempt] = bot.send_message(upd.message.chat.id, "hello")
        except Exception as exc:
            results[ctx.attempt] = exc
            raise
        finally:
            if ctx.attempt == 2:
                second_done.set()

    fence.start()
    api.push_message(7, "hi")
    try:
        assert second_done.wait(15)
        assert eventually(lambda: 1 in results, timeout=15)
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert isinstance(results[1], OwnershipLost), results
    assert isinstance(results[2], telebot.types.Message), results
    assert [s.text for s in api.sent if s.text == "hello"] == ["hello"]
    hello = [r for r in _rows(store) if r.seq == (1 if hold == "bucket" else 0)]
    assert [(r.state, r.attempt) for r in hello] == [("sent", 2)]


def test_a_stale_attempts_late_answer_leaves_the_row_uncertain(api: FakeBotAPI, store: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A reply in flight (the server answers after 2 s) when its handler passes handler_timeout: the new attempt
    finds its intent and is told the call is uncertain; the first attempt's late answer then changes nothing in
    the journal (the row stays uncertain) and is logged."""
    api.delay("sendMessage", 2.0)
    bot = telebot.TeleBot(api.token, threaded=False)
    fence = make_fence(bot, store, handler_timeout=0.5, workers=2, retry=no_wait)
    results: dict[int, Any] = {}

    @fence.attempt_handler
    def handler(upd: telebot.types.Update, ctx: Any) -> None:
        results[ctx.attempt] = bot.send_message(upd.message.chat.id, "slow")

    caplog.set_level(logging.WARNING, logger="telegram_fence")
    fence.start()
    api.push_message(8, "hi")
    try:
        assert eventually(lambda: 1 in results and 2 in results, timeout=15)
    finally:
        stop(fence)
    assert results[2].message_id == 0, "the new attempt is told the call is uncertain (a stand-in message)"
    assert isinstance(results[1], telebot.types.Message) and results[1].message_id != 0
    assert [(r.state, r.attempt) for r in _rows(store)] == [("uncertain", 1)]
    assert any("keeps it uncertain" in r.getMessage() for r in caplog.records)


def _catching(bot: telebot.TeleBot, fence: Any, call: Any) -> list[BaseException]:
    caught: list[BaseException] = []

    @fence.attempt_handler
    def handler(upd: telebot.types.Update, ctx: Any) -> None:
        try:
            call(upd.message)
        except Exception as exc:
            caught.append(exc)

    return caught


def test_a_call_whose_tls_handshake_rejects_the_certificate_raises_and_leaves_no_row(
        api: FakeBotAPI, store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply sent through a TLS front whose certificate is not trusted fails in the handshake, before any byte of
    the request: the handler gets telebot's exception, nothing is journaled or counted uncertain, nothing reaches
    the fake."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    bot = telebot.TeleBot(api.token, threaded=False)
    fence = make_fence(bot, store, retry=no_wait)
    with TlsFront(make_ca(tmp_path / "ca"), api.port) as front:

        def call(message: telebot.types.Message) -> None:
            with telegram.api_server(front.api_url):
                bot.send_message(message.chat.id, "through the front")

        caught = _catching(bot, fence, call)
        fence.start()
        api.push_message(12, "hi")
        try:
            assert eventually(lambda: fence.stats()["settled"] == 1)
        finally:
            stop(fence)
    assert len(caught) == 1 and telegram.is_certificate_failure(caught[0]), caught
    assert _rows(store) == []
    assert fence.stats()["calls"]["uncertain"] == 0
    assert api.calls_to("sendMessage") == []


def test_a_call_whose_tls_handshake_fails_raises_and_leaves_no_row(api: FakeBotAPI, store: Any) -> None:
    """A reply sent over https to a server that speaks plain HTTP fails in the TLS handshake, before any byte of the
    request is written: the handler gets telebot's exception, nothing is journaled or counted uncertain, and the
    server never sees the request."""
    bot = telebot.TeleBot(api.token, threaded=False)
    fence = make_fence(bot, store, retry=no_wait)

    def call(message: telebot.types.Message) -> None:
        with telegram.api_server(api.api_url.replace("http://", "https://")):
            bot.send_message(message.chat.id, "over tls")

    caught = _catching(bot, fence, call)
    fence.start()
    api.push_message(13, "hi")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert len(caught) == 1 and "SSL" in repr(caught[0]), caught
    assert _rows(store) == []
    assert fence.stats()["calls"]["uncertain"] == 0
    assert api.calls_to("sendMessage") == []


@pytest.mark.parametrize("case", ["lone surrogate", "closed file", "lone surrogate queued"])
def test_a_call_that_fails_before_it_leaves_raises_as_telebot_does_and_leaves_no_row(
        api: FakeBotAPI, store: Any, tmp_path: Path, case: str) -> None:
    """Echoing a text with a lone surrogate (UnicodeEncodeError while telebot's request is built, sent or queued)
    and send_photo with a closed file (ValueError) reach the handler as plain telebot raises them; nothing is
    journaled, nothing counted uncertain, nothing reaches the fake."""
    bot = telebot.TeleBot(api.token, threaded=False)
    fence = make_fence(bot, store, retry=no_wait)
    photo = tmp_path / "p.jpg"
    photo.write_bytes(b"\xff\xd8\xff\xe0" + b"0" * 64)

    def call(message: telebot.types.Message) -> None:
        if case == "closed file":
            with open(photo, "rb") as f:
                pass
            bot.send_photo(message.chat.id, f)
        elif case == "lone surrogate":
            bot.send_message(message.chat.id, message.text)
        else:
            with queue_calls():
                bot.send_message(message.chat.id, message.text)

    caught = _catching(bot, fence, call)
    expected = ValueError if case == "closed file" else UnicodeEncodeError
    with pytest.raises(expected):  # what plain telebot does with the same call
        plain = telebot.TeleBot(api.token, threaded=False)
        if case == "closed file":
            with open(photo, "rb") as f:
                pass
            plain.send_photo(9, f)
        else:
            plain.send_message(9, "a\ud800b")
    fence.start()
    api.push_message(9, "a\ud800b")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert [type(e) for e in caught] == [expected]
    assert _rows(store) == []
    assert fence.stats()["calls"]["uncertain"] == 0
    assert api.calls_to("sendMessage") == [] and api.calls_to("sendPhoto") == []


@pytest.mark.parametrize("changed", [False, True])
def test_a_retried_album_of_uploads_is_replayed_as_the_same_call(
        api: FakeBotAPI, store: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, changed: bool) -> None:
    """A handler that sends an album of two uploaded photos and then fails once: its retry, sending the same
    album (telebot names each upload afresh), is replayed without a mismatch or a warning; a retry with another
    caption is counted mismatched (the handler changed)."""
    paths = []
    for name in ("a.jpg", "b.jpg"):
        path = tmp_path / name
        path.write_bytes(b"\xff\xd8\xff\xe0" + name.encode() * 32)
        paths.append(path)

    def media_group(params: dict[str, Any]) -> list[dict[str, Any]]:
        media = json.loads(params["media"])
        for item in media:  # every attach:// name must name an upload of the request
            assert isinstance(params[item["media"].removeprefix("attach://")], UploadedFile)
        chat = {"id": int(params["chat_id"]), "type": "private"}
        return [{"message_id": 100 + i, "date": 0, "chat": chat, "photo": []} for i in range(len(media))]

    api.add_method("sendMediaGroup", media_group)
    bot = telebot.TeleBot(api.token, threaded=False)
    fence = make_fence(bot, store, retry=no_wait)
    runs: list[int] = []

    @fence.attempt_handler
    def handler(upd: telebot.types.Update, ctx: Any) -> None:
        runs.append(ctx.attempt)
        caption = "album" if ctx.attempt == 1 or not changed else "album again"
        with open(paths[0], "rb") as a, open(paths[1], "rb") as b:
            media = [telebot.types.InputMediaPhoto(a, caption=caption), telebot.types.InputMediaPhoto(b)]
            bot.send_media_group(upd.message.chat.id, media)
        if ctx.attempt == 1:
            raise RuntimeError("fails after its album")

    caplog.set_level(logging.WARNING, logger="telegram_fence")
    fence.start()
    api.push_message(10, "hi")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert runs == [1, 2]
    assert len(api.calls_to("sendMediaGroup")) == 1
    calls = fence.stats()["calls"]
    assert (calls["replayed"], calls["mismatched"]) == (1, 1 if changed else 0)
    warned = [r for r in caplog.records if "other arguments" in r.getMessage()]
    assert len(warned) == (1 if changed else 0)


def test_a_durable_steps_call_waiting_for_the_rate_limits_does_not_leave_once_its_attempt_lost_the_update(
        api: FakeBotAPI, store: Any) -> None:
    """A Bot API call inside a durable step that waits 5 s for the chat's rate-limit bucket while its handler
    passes handler_timeout (2 s) raises OwnershipLost when its wait ends, and nothing of it reaches the fake."""
    bot = telebot.TeleBot(api.token, threaded=False)
    fence = make_fence(bot, store, handler_timeout=2.0, workers=2, retry=no_wait,
                       rate_limits=Rates(per_chat=0.2, chat_burst=1))
    raised: list[BaseException] = []

    @fence.attempt_handler
    def handler(upd: telebot.types.Update, ctx: Any) -> None:
        if ctx.attempt > 1:
            return
        bot.send_message(upd.message.chat.id, "first")  # spends the chat's one token
        try:
            ctx.step("greet", lambda: bot.send_message(upd.message.chat.id, "from the step").message_id)
        except Exception as exc:
            raised.append(exc)
            raise

    fence.start()
    api.push_message(11, "hi")
    try:
        assert eventually(lambda: bool(raised), timeout=15)
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert isinstance(raised[0], OwnershipLost), raised
    assert [s.text for s in api.sent] == ["first"]
