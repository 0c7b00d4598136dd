"""Fenced calls: a plain telebot handler's Bot API calls are journaled, replayed on retry, never sent twice.

Real HTTP against the fake Bot API, real SQLite files, real worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import telebot
from helpers import eventually, make_fence, stop
from pg_support import no_wait

from telegram_fence import Fence, SqliteUpdateStore, queue_calls, uncertain_calls
from telegram_fence.calls.journal import list_calls
from telegram_fence.errors import CallMismatch
from telegram_fence.testing import FakeBotAPI


def _run_until_settled(bot: telebot.TeleBot, db: str, push: Callable[[], object], settled: int,
                       **options: Any) -> Fence:
    """Start a test fence on ``bot`` and ``db``, ``push()`` its updates, wait until ``settled`` are settled, stop;
    returns the stopped fence (its ``stats()`` still answer)."""
    fence = make_fence(bot, db, **options)
    fence.start()
    push()
    try:
        assert eventually(lambda: fence.stats()["settled"] == settled)
    finally:
        stop(fence)
    return fence


def _rows(db: str) -> list[Any]:
    with SqliteUpdateStore(db) as store, store.write() as conn:
        return list(list_calls(conn))


def test_a_retried_handler_replays_its_first_reply_instead_of_sending_it_again(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """A handler that replies, fails, and on retry replies twice more: the fake sees each reply exactly once."""
    attempts: list[int] = []
    replies: list[Any] = []

    @bot.message_handler(func=lambda m: True)
    def two_replies(message: telebot.types.Message) -> None:
        attempts.append(message.message_id)
        first = bot.reply_to(message, "first")
        replies.append(first.message_id)
        if len(attempts) == 1:
            raise RuntimeError("fails between its replies")
        bot.send_message(message.chat.id, "second")

    fence = _run_until_settled(bot, db, lambda: api.push_message(5, "hi"), 1, retry=no_wait)
    assert [s.text for s in api.sent] == ["first", "second"]
    assert len(attempts) == 2
    assert replies[0] == replies[1], "the replayed call returns the very Message telebot built the first time"
    states = [(r.seq, r.method, r.state) for r in _rows(db)]
    assert states == [(0, "sendMessage", "sent"), (1, "sendMessage", "sent")]
    assert fence.stats()["calls"]["replayed"] == 1


def test_a_recorded_refusal_is_raised_again_without_a_request(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """A call Telegram refused (400) raises the same ApiTelegramException on retry, and the fake sees it once."""
    errors: list[str] = []
    api.fail("sendMessage", 400, "Bad Request: message text is empty", times=1)

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        try:
            bot.send_message(message.chat.id, "x")
        except telebot.apihelper.ApiTelegramException as exc:
            errors.append(exc.description)
        if len(errors) == 1:
            raise RuntimeError("retry me")

    _run_until_settled(bot, db, lambda: api.push_message(5, "hi"), 1, retry=no_wait)
    assert errors == ["Bad Request: message text is empty"] * 2
    assert len(api.calls_to("sendMessage")) == 1
    assert [r.state for r in _rows(db)] == ["refused"]


def test_a_call_lost_after_it_left_is_uncertain_and_never_resent(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """A connection dropped after the server acted is recorded uncertain, returns the stand-in message of its chat
    (on the retry too), is reported, and is not resent."""
    api.drop("sendMessage", executed=True)
    got: list[Any] = []
    seen: list[Any] = []
    reported: list[Any] = []

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        got.append(bot.send_message(message.chat.id, "maybe"))
        seen.append(uncertain_calls())
        if len(got) == 1:
            raise RuntimeError("retry me")

    fence = make_fence(bot, db, retry=no_wait, on_uncertain=reported.append)
    fence.start()
    api.push_message(5, "hi")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
        assert fence.stats()["calls"]["journal"] == {"uncertain": 1}
    finally:
        stop(fence)
    assert [(m.chat.id, m.message_id, m.text) for m in got] == [(5, 0, "maybe"), (5, 0, "maybe")]
    assert [len(s) for s in seen] == [1, 1] and seen[0][0].method == "sendMessage"
    assert len(api.calls_to("sendMessage")) == 1
    assert [(c.seq, c.method, c.chat_id) for c in reported] == [(0, "sendMessage", 5)]
    assert [r.state for r in _rows(db)] == ["uncertain"]


def test_a_call_that_never_left_is_sent_by_the_next_attempt(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """A call whose connection was refused is forgotten and sent by the retry: it arrives exactly once."""
    sent_ok = threading.Event()
    calls = {"n": 0}
    real_url = telebot.apihelper.API_URL

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            telebot.apihelper.API_URL = "http://127.0.0.1:9/bot{0}/{1}"  # nothing listens on port 9
        try:
            bot.send_message(message.chat.id, "once")
        finally:
            telebot.apihelper.API_URL = real_url
        sent_ok.set()

    fence = make_fence(bot, db, retry=no_wait)
    fence.start()
    api.push_message(5, "hi")
    try:
        assert sent_ok.wait(10)
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert [s.text for s in api.sent] == ["once"]
    assert [r.state for r in _rows(db)] == ["sent"]
    assert fence.stats()["calls"]["retried"] == 1


def test_read_only_calls_pass_unjournaled_and_off_means_off(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """getMe/getChat are not journaled; with journal_calls=False nothing is journaled at all."""

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        bot.get_me()
        bot.send_message(message.chat.id, "hello")

    fence = make_fence(bot, db)
    fence.start()
    api.push_message(5, "hi")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert [r.method for r in _rows(db)] == ["sendMessage"]
    assert telebot.apihelper.CUSTOM_REQUEST_SENDER is None, "the sender is taken out when the fence stops"

    bot2 = telebot.TeleBot(api.token, threaded=False)
    bot2.message_handler(func=lambda m: True)(lambda m: bot2.send_message(m.chat.id, "plain"))
    fence2 = make_fence(bot2, db, journal_calls=False)
    assert fence2.stats()["calls"] is None
    fence2.start()
    api.push_message(6, "hi")
    try:
        assert eventually(lambda: fence2.stats()["settled"] == 2)
    finally:
        stop(fence2)
    assert [r.chat_id for r in _rows(db)] == [5]


def test_another_method_at_a_position_is_a_mismatch(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """A retry whose first call is another method raises CallMismatch and sends nothing."""
    raised: list[BaseException] = []

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        if not raised:
            bot.send_message(message.chat.id, "first")
            raised.append(RuntimeError())
            raise RuntimeError("retry me")
        try:
            bot.send_chat_action(message.chat.id, "typing")
        except CallMismatch as exc:
            raised.append(exc)

    _run_until_settled(bot, db, lambda: api.push_message(5, "hi"), 1, retry=no_wait)
    assert isinstance(raised[-1], CallMismatch) and raised[-1].recorded == "sendMessage"
    assert not api.calls_to("sendChatAction")


def test_a_queued_reply_commits_with_the_settle_and_is_sent_once(api: FakeBotAPI, bot: telebot.TeleBot,
                                                                 db: str) -> None:
    """A reply queued inside ctx.transaction(complete=True) is journaled there and sent after the commit."""
    fence = make_fence(bot, db)

    @fence.attempt_handler
    def handler(update: telebot.types.Update, ctx: Any) -> None:
        with ctx.transaction(complete=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS notes(update_id INTEGER PRIMARY KEY)")
            conn.execute("INSERT INTO notes VALUES (?)", (update.update_id,))
            with queue_calls():
                assert bot.send_message(update.message.chat.id, "saved").message_id == 0  # a stand-in

    fence.start()
    api.push_message(5, "hi")
    try:
        assert api.wait_sent(1)
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert [s.text for s in api.sent] == ["saved"]
    assert [r.state for r in _rows(db)] == ["sent"]


def test_fence_restores_an_application_sender(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """An application's own CUSTOM_REQUEST_SENDER stays in the chain while the fence runs and is restored after."""
    seen: list[str] = []

    def own(method: str, url: str, **kw: Any) -> Any:
        seen.append(url.rpartition("/")[2])
        return telebot.apihelper._get_req_session().request(method, url, **kw)

    telebot.apihelper.CUSTOM_REQUEST_SENDER = own
    try:
        bot.message_handler(func=lambda m: True)(lambda m: bot.send_message(m.chat.id, "hello"))
        fence: Fence = make_fence(bot, db)
        fence.start()
        api.push_message(5, "hi")
        try:
            assert eventually(lambda: fence.stats()["settled"] == 1)
        finally:
            stop(fence)
        assert telebot.apihelper.CUSTOM_REQUEST_SENDER is own
    finally:
        telebot.apihelper.CUSTOM_REQUEST_SENDER = None
    assert "sendMessage" in seen and [r.state for r in _rows(db)] == ["sent"]


def test_a_stale_worker_whose_update_was_reclaimed_cannot_send(api: FakeBotAPI, bot: telebot.TeleBot,
                                                               db: str) -> None:
    """An attempt that lost its update (past handler_timeout, reclaimed and handled by another) sends nothing."""
    second_done = threading.Event()
    stale_error: list[BaseException] = []
    attempts: list[int] = []
    lock = threading.Lock()
    fence = make_fence(bot, db, handler_timeout=0.3, workers=2)

    @fence.attempt_handler
    def handler(update: telebot.types.Update, ctx: Any) -> None:
        with lock:
            attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            assert second_done.wait(10)
            try:
                bot.send_message(update.message.chat.id, "stale")
            except Exception as exc:
                stale_error.append(exc)
                raise
        else:
            bot.send_message(update.message.chat.id, "fresh")
            second_done.set()

    fence.start()
    api.push_message(5, "hi")
    try:
        assert eventually(lambda: bool(stale_error))
    finally:
        stop(fence)
    assert [s.text for s in api.sent] == ["fresh"]
    assert type(stale_error[0]).__name__ == "OwnershipLost"
    assert [(r.seq, r.attempt, r.state) for r in _rows(db)] == [(0, 2, "sent")]


def test_a_queued_reply_left_unsent_is_sent_by_the_next_start(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """A reply committed with its write whose send could not happen (the server unreachable right after the
    commit, as for a process dying there) stays queued and is sent, once, when the next fence starts."""
    real_url = telebot.apihelper.API_URL
    fence = make_fence(bot, db)

    @fence.attempt_handler
    def handler(update: telebot.types.Update, ctx: Any) -> None:
        telebot.apihelper.API_URL = "http://127.0.0.1:9/bot{0}/{1}"  # nothing listens: the send cannot leave
        try:
            with ctx.transaction(complete=True), queue_calls():
                bot.send_message(update.message.chat.id, "saved")
        finally:
            telebot.apihelper.API_URL = real_url

    fence.start()
    api.push_message(5, "hi")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert api.sent == []
    assert [r.state for r in _rows(db)] == ["queued"]
    again = make_fence(telebot.TeleBot(api.token, threaded=False), db)
    again.start()
    try:
        assert api.wait_sent(1)
    finally:
        stop(again)
    assert [s.text for s in api.sent] == ["saved"]
    assert [r.state for r in _rows(db)] == ["sent"]


def test_a_call_inside_a_transaction_is_sent_only_after_its_commit(api: FakeBotAPI, bot: telebot.TeleBot,
                                                                  db: str) -> None:
    """A reply made inside ctx.transaction() (no queue_calls) of a block that rolls back is never sent; the
    retry's committed block sends it once."""
    fence = make_fence(bot, db, retry=no_wait)
    results: list[Any] = []

    @fence.attempt_handler
    def handler(update: telebot.types.Update, ctx: Any) -> None:
        with ctx.transaction(complete=True):
            results.append(bot.send_message(update.message.chat.id, "inside"))
            if ctx.attempt == 1:
                raise RuntimeError("the block rolls back")

    fence.start()
    api.push_message(5, "hi")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
        assert api.wait_sent(1)
    finally:
        stop(fence)
    assert [(m.message_id, m.text) for m in results] == [(0, "inside"), (0, "inside")]  # stand-ins
    assert [s.text for s in api.sent] == ["inside"]
    assert [r.state for r in _rows(db)] == ["sent"]


def test_the_poller_keeps_its_own_connection_while_the_journal_is_installed(api: FakeBotAPI, bot: telebot.TeleBot,
                                                                         db: str) -> None:
    """The journal's request sender does not make the poller step aside to telebot's path (an application's
    own sender still does)."""
    from telegram_fence.telegram import direct_polling_allowed

    fence = make_fence(bot, db)
    fence.start()
    try:
        assert telebot.apihelper.CUSTOM_REQUEST_SENDER is not None
        assert direct_polling_allowed()
    finally:
        stop(fence)
    telebot.apihelper.CUSTOM_REQUEST_SENDER = lambda *a, **k: None
    try:
        assert not direct_polling_allowed()
    finally:
        telebot.apihelper.CUSTOM_REQUEST_SENDER = None


def test_a_refusal_without_json_is_replayed_as_telebot_raised_it(api: FakeBotAPI, bot: telebot.TeleBot,
                                                                 db: str) -> None:
    """A 404 HTML page (a proxy's refusal) is journaled refused and replayed as the same ApiHTTPException."""
    api.fail("sendMessage", 404, html=True, times=1)
    errors: list[str] = []

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        try:
            bot.send_message(message.chat.id, "x")
        except telebot.apihelper.ApiHTTPException as exc:
            errors.append(str(exc).splitlines()[0])
        if len(errors) == 1:
            raise RuntimeError("retry me")

    _run_until_settled(bot, db, lambda: api.push_message(5, "hi"), 1, retry=no_wait)
    assert len(errors) == 2 and errors[0] == errors[1] and "404" in errors[0]
    assert len(api.calls_to("sendMessage")) == 1
    assert [(r.state, r.status) for r in _rows(db)] == [("refused", 404)]


def test_a_call_queued_in_a_block_that_rolled_back_is_never_sent(api: FakeBotAPI, bot: telebot.TeleBot,
                                                                db: str) -> None:
    """A handler that catches the failure of its transaction block and goes on: the reply queued in the rolled-
    back block is dropped with it; the reply of the next, committed block is sent."""
    fence = make_fence(bot, db)

    @fence.attempt_handler
    def handler(update: telebot.types.Update, ctx: Any) -> None:
        try:
            with ctx.transaction():
                bot.send_message(update.message.chat.id, "rolled back")
                raise RuntimeError("the block fails")
        except RuntimeError:
            pass
        with ctx.transaction(complete=True):
            bot.send_message(update.message.chat.id, "committed")

    fence.start()
    api.push_message(5, "hi")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
        assert api.wait_sent(1)
    finally:
        stop(fence)
    assert [s.text for s in api.sent] == ["committed"]
    assert [(r.seq, r.state) for r in _rows(db)] == [(1, "sent")]
