"""Rate limits and the call journal's decisions: table tests of the pure functions, token buckets on a given
clock, and real HTTP: a 429 storm (no call to the paused chat before its time, from any thread) and a burst
to 500 chats that never exceeds the configured rates, measured from the fake server's timestamps."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, stop

from telegram_fence import ConfigurationError, Rates
from telegram_fence.calls import verdicts
from telegram_fence.calls.limits import Limits, scope_of
from telegram_fence.testing import FakeBotAPI


@pytest.mark.parametrize(("status", "body", "expected"), [
    (200, {"ok": True, "result": {}}, verdicts.Verdict("sent")),
    (400, {"ok": False, "error_code": 400, "description": "Bad Request"}, verdicts.Verdict("refused")),
    (403, {"ok": False, "error_code": 403, "description": "Forbidden"}, verdicts.Verdict("refused")),
    (429, {"ok": False, "error_code": 429, "parameters": {"retry_after": 3}}, verdicts.Verdict(None, 3.0, True)),
    (429, {"ok": False, "error_code": 429, "parameters": {"retry_after": 3600}},
     verdicts.Verdict(None, 3600.0, False)),
    (429, {"ok": False, "error_code": 429, "parameters": {"retry_after": "NaN"}}, verdicts.Verdict(None, 1.0, True)),
    (502, {"ok": False, "error_code": 502, "description": "Bad Gateway"}, verdicts.Verdict("uncertain")),
    (200, None, verdicts.Verdict("uncertain")),
    (502, None, verdicts.Verdict("uncertain")),
    (408, None, verdicts.Verdict(None)),
    (429, None, verdicts.Verdict(None, 1.0, True)),
    (404, None, verdicts.Verdict("refused")),
])
def test_what_an_answer_means_for_the_journal(status: int, body: Any, expected: verdicts.Verdict) -> None:
    """Each kind of answer maps to the state recorded, the pause taken and whether the call is sent again."""
    assert verdicts.judge_answer(status, body, max_wait=30.0) == expected


@pytest.mark.parametrize(("state", "recorded", "fp", "expected"), [
    ("sent", "sendMessage", "a", ("answer", False)),
    ("refused", "sendMessage", "a", ("answer", False)),
    ("sent", "sendMessage", "b", ("answer", True)),
    ("intent", "sendMessage", "a", ("uncertain", False)),
    ("uncertain", "sendMessage", "a", ("uncertain", False)),
    ("queued", "sendMessage", "a", ("queued", False)),
    ("sent", "sendPhoto", "a", ("mismatch", False)),
])
def test_what_a_journaled_row_means_for_a_retried_call(state: str, recorded: str, fp: str,
                                                      expected: tuple[str, bool]) -> None:
    """A recorded outcome is answered, a lapsed intent is uncertain, another method is a mismatch."""
    assert verdicts.replay_of(state, recorded, fp, "sendMessage", "a") == expected


def test_which_calls_are_journaled_and_how_they_are_named() -> None:
    """get* methods pass; the fingerprint ignores parameter order and sees every argument; chat ids parse."""
    assert not verdicts.journaled("getMe") and not verdicts.journaled("getUpdates")
    assert verdicts.journaled("sendMessage") and verdicts.journaled("answerCallbackQuery")
    one = verdicts.fingerprint("sendMessage", {"chat_id": "1", "text": "a"}, None)
    assert one == verdicts.fingerprint("sendMessage", {"text": "a", "chat_id": "1"}, None)
    assert one != verdicts.fingerprint("sendMessage", {"chat_id": "1", "text": "b"}, None)
    assert one != verdicts.fingerprint("sendPhoto", {"chat_id": "1", "text": "a"}, None)
    assert verdicts.chat_of({"chat_id": "-100123"}) == -100123
    assert verdicts.chat_of({"chat_id": "@channel"}) is None
    assert verdicts.chat_of({"chat_id": True}) is None
    assert verdicts.chat_of(None) is None
    # 64 bits: the bounds themselves are chats, a number past them is none (no store column holds it)
    assert verdicts.chat_of({"chat_id": -(2**63)}) == -(2**63)
    assert verdicts.chat_of({"chat_id": str(2**63 - 1)}) == 2**63 - 1
    assert verdicts.chat_of({"chat_id": 2**63}) is None
    assert verdicts.chat_of({"chat_id": str(-(2**63) - 1)}) is None


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_buckets_give_the_burst_then_the_rate() -> None:
    """A private chat gets its burst at once, then one call per 1/rate seconds; a group its own slower rate."""
    clock = _Clock()
    limits = Limits(Rates(per_chat=1.0, chat_burst=3, per_group_minute=20.0, group_burst=1, per_bot=1000.0),
                    clock=clock)
    assert [limits.ready(5) for _ in range(4)] == [True, True, True, False]
    clock.now += 1.0
    assert [limits.ready(5) for _ in range(2)] == [True, False]
    assert [limits.ready(-100) for _ in range(2)] == [True, False]
    clock.now += 2.9
    assert not limits.ready(-100), "20 per minute is one per 3 s"
    clock.now += 0.2
    assert limits.ready(-100)


def test_a_waiter_told_to_stop_spends_no_token_even_when_one_is_there() -> None:
    """A stale attempt's call waiting for the rate limits leaves the chat's token to the attempt that owns the
    update: once its stop is set, wait() returns False without taking one, and a waiter whose stop is set while
    it waits leaves within a quarter second, however long the wait it was in."""
    clock = _Clock()
    limits = Limits(Rates(per_chat=0.01, chat_burst=1), clock=clock)
    told = threading.Event()
    told.set()
    assert limits.wait(5, stop=told) is False
    assert limits.ready(5) and not limits.ready(5), "the one token was still there for the live caller"
    lost = threading.Event()
    timer = threading.Timer(0.2, lost.set)
    timer.start()
    began = time.monotonic()
    assert limits.wait(5, stop=lost) is False  # the next token is 100 s away
    assert time.monotonic() - began < 1.0
    timer.join()


def test_the_bot_bucket_holds_every_chat_and_paid_calls_have_their_own() -> None:
    """Once the bot's tokens are spent no chat gets a call; calls with allow_paid_broadcast use the paid rate."""
    clock = _Clock()
    limits = Limits(Rates(per_bot=2.0, bot_burst=2, paid_per_bot=100.0), clock=clock)
    assert limits.ready(1) and limits.ready(2)
    assert not limits.ready(3)
    assert limits.ready(3, paid=True)


def test_a_bot_pause_holds_every_chat_and_a_chat_pause_only_its_chat() -> None:
    """A 429 on a call without a chat pauses the bot; one on a chat's call pauses that chat; both end on time."""
    clock = _Clock()
    limits = Limits(clock=clock)
    limits.pause(7, 2.0)
    assert scope_of(7) == "chat:7" and scope_of(None) == "bot"
    assert not limits.ready(7) and limits.ready(8)
    limits.pause(None, 1.0)
    assert not limits.ready(8)
    clock.now += 1.0
    assert limits.ready(8) and not limits.ready(7)
    clock.now += 1.0
    assert limits.ready(7)
    limits.pause(7, float("inf"))
    clock.now += 601
    assert limits.ready(7), "a hostile retry_after is cut to the library's longest wait"


@pytest.mark.parametrize("field", ["per_chat", "chat_burst", "per_bot", "paid_per_bot"])
@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), True])
def test_rates_refuse_what_cannot_work(field: str, value: Any) -> None:
    """A rate or burst that is not a positive finite number is refused, naming it."""
    with pytest.raises(ConfigurationError, match=field):
        Rates(**{field: value})


def _to_chat(api: FakeBotAPI, chat: int) -> list[Any]:
    return [c for c in api.calls_to("sendMessage") if str(c.params.get("chat_id")) == str(chat)]


def test_a_429_storm_holds_the_paused_chat_for_every_thread(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """After a 429 with retry_after on chat 99, no call to chat 99 reaches the fake before its time, from any
    handler thread or a thread outside the fence; another chat is not held."""
    go = threading.Event()
    fence = make_fence(bot, db, workers=4)

    @fence.handler
    def handler(update: telebot.types.Update) -> None:
        if update.message.text != "first":
            assert go.wait(10)
        bot.send_message(99, f"to 99 from {update.update_id}")

    api.fail("sendMessage", 429, retry_after=2, times=1)
    fence.start()
    try:
        api.push_message(1, "first")
        assert eventually(lambda: fence.stats()["calls"]["paused"] == 1)
        for chat in (2, 3, 4, 5):
            api.push_message(chat, "later")
        go.set()
        outside = threading.Thread(target=lambda: bot.send_message(99, "from outside"), name="fence-test-outside")
        outside.start()
        bot.send_message(98, "another chat")
        outside.join(10)
        assert eventually(lambda: fence.stats()["settled"] == 5)
    finally:
        stop(fence)
    calls = _to_chat(api, 99)
    refused, later = calls[0], calls[1:]
    assert len(later) == 6 and {c.params["text"] for c in later} >= {"from outside"}
    assert all(c.time >= refused.time + 2.0 for c in later), [round(c.time - refused.time, 3) for c in later]
    assert _to_chat(api, 98)[0].time < refused.time + 2.0, "the pause held another chat"
    assert len({c.params["text"] for c in later}) == 6, "the refused call was sent again once, nothing twice"


def _max_in_window(times: list[float], window: float) -> int:
    times = sorted(times)
    best, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] > window:
            start += 1
        best = max(best, end - start + 1)
    return best


def test_a_burst_to_500_chats_never_exceeds_the_configured_rates(api: FakeBotAPI, bot: telebot.TeleBot,
                                                                 db: str) -> None:
    """500 chats, one reply each, with Rates(per_bot=250, bot_burst=25): in every window of w seconds the fake
    saw at most burst + rate * (w + 20 ms) replies (+1 for the window's edges; the 20 ms: a request reaches the
    fake a scheduling delay after the limiter let it go, and on a loaded machine a few arrive bunched)."""
    rates = Rates(per_bot=250.0, bot_burst=25)
    bot.message_handler(func=lambda m: True)(lambda m: bot.send_message(m.chat.id, "hi"))
    fence = make_fence(bot, db, workers=8, rate_limits=rates)
    fence.start()
    try:
        api.push_messages(500, chats=list(range(1, 501)))
        assert eventually(lambda: fence.stats()["settled"] == 500, timeout=60)
    finally:
        stop(fence)
    times = [c.time for c in api.calls_to("sendMessage")]
    assert len(times) == 500
    for window in (0.1, 0.5, 1.0):
        assert _max_in_window(times, window) <= rates.bot_burst + rates.per_bot * (window + 0.02) + 1, window
    assert max(times) - min(times) >= (500 - rates.bot_burst) / rates.per_bot * 0.9


def test_broadcasts_and_the_operator_channel_wait_for_a_pause_a_handler_met(
        api: FakeBotAPI, bot: telebot.TeleBot, db: str, tmp_path: Any) -> None:
    """While a fence runs, a Broadcast and the OperatorChannel in its process send nothing to a chat a handler's
    429 paused until the pause ends; the broadcast's other chat is not held."""
    from telegram_fence import Broadcast, OperatorChannel

    fence = make_fence(bot, db)
    bot.message_handler(func=lambda m: True)(lambda m: bot.send_message(99, "from the handler"))
    api.fail("sendMessage", 429, retry_after=2, times=1)
    fence.start()
    try:
        api.push_message(1, "hi")
        assert eventually(lambda: fence.stats()["calls"]["paused"] == 1)
        operator = OperatorChannel(telebot.TeleBot(api.token, threaded=False), 99)
        operator.post("operator note")
        broadcast = Broadcast(telebot.TeleBot(api.token, threaded=False), tmp_path / "broadcasts", "news")
        broadcast.create([98, 99], "news")
        report = broadcast.run(rate=100.0)
        assert operator.close(10)
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert report.pending == 0
    calls = _to_chat(api, 99)
    refused = calls[0]
    texts = {c.params["text"]: c.time for c in calls[1:]}
    assert set(texts) == {"from the handler", "operator note", "news"}
    assert all(at >= refused.time + 2.0 for at in texts.values()), {t: round(a - refused.time, 3)
                                                                    for t, a in texts.items()}
    assert _to_chat(api, 98)[0].time < refused.time + 2.0
