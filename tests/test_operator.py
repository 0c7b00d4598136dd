"""Tests for telegram_fence.delivery.operator.OperatorChannel against the real-HTTP fake Bot API server."""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import telebot

from telegram_fence.delivery import operator as operator_module
from telegram_fence.delivery.broadcast_message import TEXT_LIMIT
from telegram_fence.delivery.operator import OperatorChannel, split_text
from telegram_fence.errors import ConfigurationError
from telegram_fence.testing import FakeBotAPI

CHAT = -100_555


def texts(api: FakeBotAPI, chat_id: int = CHAT) -> list[str | None]:
    return [s.text for s in api.sent_to(chat_id)]


def fence_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fence-operator"]


@pytest.fixture
def channels() -> Iterator[list[OperatorChannel]]:
    """Channels a test made; each is closed (quickly) afterwards so no thread outlives its test."""
    made: list[OperatorChannel] = []
    yield made
    for channel in made:
        channel.close(timeout=0)


@pytest.fixture
def make(fake_bot: telebot.TeleBot, channels: list[OperatorChannel]) -> Any:
    def factory(**kw: Any) -> OperatorChannel:
        kw.setdefault("backoff", 0.01)
        kw.setdefault("max_backoff", 0.05)
        channel = OperatorChannel(fake_bot, kw.pop("chat_id", CHAT), **kw)
        channels.append(channel)
        return channel

    return factory


def wait_calls(api: FakeBotAPI, n: int, timeout: float = 5.0) -> bool:
    """Poll (with a deadline) until ``n`` sendMessage requests *arrived*, answered or not.

    ``api.wait_for`` is only woken when a request finishes, so it cannot see one still being delayed.
    """
    deadline = time.monotonic() + timeout
    while len(api.calls_to("sendMessage")) < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


# -- pure policy ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("", 10, []),
        ("short", 10, ["short"]),
        ("exactly10!", 10, ["exactly10!"]),
        ("line one\nline two\nline three", 12, ["line one\n", "line two\n", "line three"]),
        ("aaaa bbbb cccc dddd", 10, ["aaaa bbbb ", "cccc dddd"]),
        ("x" * 25, 10, ["x" * 10, "x" * 10, "x" * 5]),
        ("\n" + "y" * 15, 10, ["\n" + "y" * 9, "y" * 6]),  # a break in the first half is not used
        ("😀" * 6, 10, ["😀" * 5, "😀"]),  # 2 UTF-16 units each
        ("ab😀cdefghi", 3, ["ab", "😀c", "def", "ghi"]),
    ],
)
def test_split_text(text: str, limit: int, expected: list[str]) -> None:
    """split_text cuts at line breaks, then spaces, then hard, counting UTF-16 units, and loses nothing."""
    pieces = split_text(text, limit)
    assert pieces == expected
    assert "".join(pieces) == text
    assert all(len(p.encode("utf-16-le")) // 2 <= limit for p in pieces)


def test_split_text_refuses_tiny_limit() -> None:
    """A limit below 2 cannot hold a surrogate pair and is refused with ConfigurationError."""
    with pytest.raises(ConfigurationError, match="limit"):
        split_text("abc", 1)


def test_bad_settings_refused(fake_bot: telebot.TeleBot) -> None:
    """Unusable constructor arguments raise ConfigurationError naming the argument."""
    with pytest.raises(ConfigurationError, match="capacity"):
        OperatorChannel(fake_bot, CHAT, capacity=0)
    with pytest.raises(ConfigurationError, match="chat_id"):
        OperatorChannel(fake_bot, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="send_message"):
        OperatorChannel(object(), CHAT)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        OperatorChannel(fake_bot, CHAT, max_attempts=0)
    with pytest.raises(ConfigurationError, match="secrets"):
        OperatorChannel(fake_bot, CHAT, secrets="abc")


# -- delivery ------------------------------------------------------------------------------------------


def test_posts_are_delivered_in_order_by_a_named_thread(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """Messages arrive in the order posted, sent by a thread named fence-operator that close() joins."""
    channel = make()
    assert fence_threads() == []  # started lazily
    for i in range(20):
        channel.post(f"event {i}")
    assert [t.daemon for t in fence_threads()] == [True]
    assert channel.drain(10)
    assert texts(fake_bot_api) == [f"event {i}" for i in range(20)]
    assert (channel.delivered, channel.failed, channel.dropped, channel.pending) == (20, 0, 0, 0)
    assert channel.close(5) is True
    assert fence_threads() == []


def test_post_never_raises(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """post() accepts non-strings, objects whose str and repr raise, and empty text, without raising."""

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no str")

        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    channel = make()
    for value in (42, {"a": 1}, None, Unprintable(), "", "   "):
        channel.post(value)
    assert channel.drain(10)
    assert texts(fake_bot_api) == [
        "42",
        "{'a': 1}",
        "None",
        "<unprintable Unprintable>",
        "(empty operator message)",
        "(empty operator message)",
    ]


def test_post_does_not_wait_for_a_slow_send(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """While sendMessage hangs, post() keeps returning: all posts finish before the first send is answered."""
    fake_bot_api.delay("sendMessage", 2)
    channel = make()
    channel.post("first")
    assert wait_calls(fake_bot_api, 1)
    for i in range(50):
        channel.post(f"more {i}")
    assert fake_bot_api.sent == []  # the first send is still waiting for its answer
    assert channel.pending == 51
    assert channel.drain(10)
    assert len(texts(fake_bot_api)) == 51


def test_full_queue_drops_oldest_and_reports(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """With the sender blocked, a full queue drops its oldest messages, counts them, and reports the count."""
    fake_bot_api.delay("sendMessage", 1)
    channel = make(capacity=3)
    channel.post("m1")
    assert wait_calls(fake_bot_api, 1)  # m1 is on the wire
    for i in range(2, 9):
        channel.post(f"m{i}")
    assert channel.dropped == 4  # m2..m5 pushed out by m6..m8
    assert channel.drain(10)
    assert texts(fake_bot_api) == ["m1", "4 operator messages dropped (queue full)", "m6", "m7", "m8"]
    assert channel.delivered == 5
    assert channel.close(5) is False  # not everything posted was delivered


def test_steady_overload_is_reported_without_doubling_traffic(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """Drops that continue while sending are reported at most once per capacity messages, and in total."""
    fake_bot_api.set_latency("sendMessage", 0.02)
    channel = make(capacity=4)
    posted = 0
    for burst in range(12):  # six posts every time a send goes out: faster than the sender
        for _ in range(6):
            channel.post(f"n{posted}")
            posted += 1
        assert wait_calls(fake_bot_api, burst + 1)
    assert channel.drain(20)
    sent = texts(fake_bot_api)
    reports = [t for t in sent if t and "dropped" in t]
    normal = [t for t in sent if t and "dropped" not in t]
    assert sum(int(r.split()[0]) for r in reports) == channel.dropped > 0
    assert len(normal) + channel.dropped == posted
    assert normal == sorted(normal, key=lambda t: int(t[1:]))  # order kept
    gaps = [i for i, t in enumerate(sent) if t in reports]
    assert all(b - a > 4 for a, b in itertools.pairwise(gaps))


def test_retry_after_is_honoured(fake_bot_api: FakeBotAPI, make: Any, caplog: pytest.LogCaptureFixture) -> None:
    """After a 429 with retry_after=1 the channel waits at least one second before sending again."""
    caplog.set_level(logging.INFO, logger="telegram_fence.operator")
    fake_bot_api.fail("sendMessage", 429, retry_after=1)
    channel = make(max_attempts=1)  # a 429 wait is not a failed attempt
    channel.post("rate limited")
    assert channel.drain(10)
    calls = fake_bot_api.calls_to("sendMessage")
    assert len(calls) == 2
    assert calls[1].time - calls[0].time >= 1.0
    assert texts(fake_bot_api) == ["rate limited"]
    waits = [r for r in caplog.records if r.getMessage() == "operator channel waiting for retry_after"]
    assert [(r.retry_after, r.chat_id) for r in waits] == [(1.0, CHAT)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("retry_after", [10**9, math.inf])
def test_an_absurd_retry_after_is_waited_only_up_to_the_cap(
    fake_bot_api: FakeBotAPI, make: Any, monkeypatch: pytest.MonkeyPatch, retry_after: float
) -> None:
    """A 429 asking for decades (or infinity) parks the channel at most the retry cap; then the message goes out."""
    from telegram_fence import retry

    monkeypatch.setattr(retry, "MAX_RETRY_AFTER_WAIT", 0.3)
    fake_bot_api.fail("sendMessage", 429, retry_after=retry_after)  # type: ignore[arg-type]
    channel = make()
    channel.post("after the limit")
    assert channel.drain(15)
    assert texts(fake_bot_api) == ["after the limit"]


def test_a_lone_surrogate_in_a_message_is_sent_as_its_escape(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """A message quoting an exception text with a lone surrogate is delivered, the surrogate as its escape."""
    channel = make()
    channel.post("fence ended: ValueError: bad \ud800 text")
    assert channel.drain(10)
    assert texts(fake_bot_api) == ["fence ended: ValueError: bad \\ud800 text"]
    assert (channel.delivered, channel.failed) == (1, 0)


def test_transient_and_ambiguous_failures_are_retried(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """5xx answers and dropped connections are retried with backoff until the message goes through."""
    fake_bot_api.fail("sendMessage", 502, times=2)
    fake_bot_api.drop("sendMessage", times=1)
    channel = make(max_attempts=5)
    channel.post("eventually")
    assert channel.drain(10)
    assert len(fake_bot_api.calls_to("sendMessage")) == 4
    assert texts(fake_bot_api) == ["eventually"]
    assert (channel.delivered, channel.failed) == (1, 0)


def test_retries_are_bounded_and_the_thread_goes_on(
    fake_bot_api: FakeBotAPI, make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A message failing transiently max_attempts times is given up and logged; the next one is still sent."""
    fake_bot_api.fail("sendMessage", 503, times=3)
    channel = make(max_attempts=3)
    channel.post("doomed")
    channel.post("fine")
    assert channel.drain(10)
    assert len(fake_bot_api.calls_to("sendMessage")) == 4
    assert texts(fake_bot_api) == ["fine"]
    assert (channel.delivered, channel.failed) == (1, 1)
    [gave_up] = [r for r in caplog.records if r.getMessage().startswith("operator message given up after 3 attempts")]
    assert gave_up.levelno == logging.ERROR and gave_up.attempt == 3  # type: ignore[attr-defined]
    assert "503" in gave_up.getMessage(), "the cause is in the message"
    assert "doomed" not in caplog.text  # the message text is never logged


def test_refused_messages_are_given_up_without_stopping(
    fake_bot_api: FakeBotAPI, make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused message and a blocked chat each cost one call, are logged, and later messages still go out."""
    fake_bot_api.fail("sendMessage", 400, "Bad Request: can't parse entities: unclosed tag")
    channel = make()
    channel.post("<b>bad markup")
    channel.post("after refusal")
    assert channel.drain(10)
    fake_bot_api.block(CHAT)
    channel.post("to a blocked chat")
    assert channel.drain(10)
    fake_bot_api.unblock(CHAT)
    channel.post("after unblock")
    assert channel.drain(10)
    assert texts(fake_bot_api) == ["after refusal", "after unblock"]
    assert len(fake_bot_api.calls_to("sendMessage")) == 4
    assert (channel.delivered, channel.failed) == (2, 2)
    refusals = [r for r in caplog.records if r.getMessage() == "operator message refused"]
    assert len(refusals) == 2 and all(r.levelno == logging.WARNING for r in refusals)
    assert "MessageRefused" in refusals[0].error and "RecipientGone" in refusals[1].error  # type: ignore[attr-defined]


def test_long_text_is_split(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """A text over 4,096 characters (which the server would refuse) arrives whole, in several messages."""
    text = "\n".join(f"line {i:05d} " + "x" * 80 for i in range(200))  # ~18,000 characters
    channel = make()
    channel.post(text)
    assert channel.drain(10)
    pieces = texts(fake_bot_api)
    assert len(pieces) == 5
    assert all(p is not None and len(p) <= TEXT_LIMIT for p in pieces)
    assert "".join(p or "" for p in pieces) == text
    assert channel.delivered == 1


def test_tokens_and_secrets_are_masked(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """The bot's own token, any other bot token and configured secrets never reach the chat."""
    other = "987654321:ZZHdqTcvCH1vGWJxfSeofSAs0K5PALDsawq"
    channel = make(secrets=["db-password-1"])
    channel.post(f"crash: GET /bot{fake_bot_api.token}/getUpdates, other {other}, pw db-password-1")
    assert channel.drain(10)
    [text] = texts(fake_bot_api)
    assert text == f"crash: GET /bot{fake_bot_api.bot_id}:***/getUpdates, other 987654321:***, pw ***"


def test_drain_times_out_while_blocked(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """drain() returns False when the queue cannot empty in time and True once it has."""
    fake_bot_api.delay("sendMessage", 1)
    channel = make()
    assert channel.drain(0) is True  # nothing posted yet
    channel.post("slow")
    assert channel.drain(0.05) is False
    assert channel.drain(10) is True


def test_close_interrupts_a_long_retry_after(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """close() stops a 60 s retry_after wait promptly, joins the thread and keeps the message as pending."""
    fake_bot_api.fail("sendMessage", 429, retry_after=60)
    channel = make()
    channel.post("waiting")
    assert wait_calls(fake_bot_api, 1)
    started = time.monotonic()
    assert channel.close(timeout=0.2) is False
    assert time.monotonic() - started < 10  # far below the 60 s Telegram asked for
    assert fence_threads() == []
    assert channel.pending == 1 and channel.delivered == 0
    assert len(fake_bot_api.calls_to("sendMessage")) == 1


def test_close_while_a_send_hangs(fake_bot_api: FakeBotAPI, make: Any, caplog: pytest.LogCaptureFixture) -> None:
    """close() returns (False) while a send is stuck on the wire, logging that the thread is still busy."""
    fake_bot_api.delay("sendMessage", 3)
    channel = make()
    channel.post("stuck")
    assert wait_calls(fake_bot_api, 1)
    assert channel.close(timeout=0) is False
    busy = [r for r in caplog.records if r.getMessage() == "operator channel thread still busy after close"]
    assert len(busy) == 1 and busy[0].thread_name == "fence-operator"  # type: ignore[attr-defined]
    [thread] = fence_threads()
    fake_bot_api.stop(timeout=1)  # ends the hanging request, so the thread can finish
    thread.join(10)
    assert not thread.is_alive()
    assert channel.pending + channel.delivered == 1  # sent late, or kept as pending: never lost silently


def test_post_after_close_is_counted_not_sent(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """After close(), post() neither raises nor sends; the message counts as dropped."""
    channel = make()
    channel.post("before")
    assert channel.close(5) is True
    channel.post("after 1")
    channel.post("after 2")
    assert texts(fake_bot_api) == ["before"]
    assert channel.dropped == 2
    assert channel.close(1) is False  # closing again is harmless; two messages were not delivered


def test_context_manager_closes(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """Leaving a with-block drains the channel and joins its thread."""
    with OperatorChannel(fake_bot, CHAT) as channel:
        channel.post("inside")
    assert texts(fake_bot_api) == ["inside"]
    assert fence_threads() == []


def test_posts_from_many_threads(fake_bot_api: FakeBotAPI, make: Any) -> None:
    """Eight threads posting at once lose nothing (within capacity) and keep each thread's own order."""
    channel = make(capacity=1000)
    start = threading.Barrier(8)

    def producer(n: int) -> None:
        start.wait()
        for i in range(25):
            channel.post(f"{n}:{i}")

    threads = [threading.Thread(target=producer, args=(n,), name=f"producer-{n}") for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert channel.drain(20)
    sent = texts(fake_bot_api)
    assert len(sent) == 200 and channel.dropped == 0
    for n in range(8):
        mine = [int(t.split(":")[1]) for t in sent if t and t.startswith(f"{n}:")]
        assert mine == list(range(25))


def test_public_names() -> None:
    """The module exports exactly its documented public names."""
    assert sorted(operator_module.__all__) == ["OperatorChannel", "split_text"]
