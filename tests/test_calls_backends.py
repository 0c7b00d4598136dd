"""The call journal on both backends and behind both doors: replay, uncertain, pruning with the update, shared
429 pauses. SQLite files in tmp dirs and the PostgreSQL server of TELEGRAM_FENCE_PG_DSN (skipped without it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, stop
from pg_support import BACKENDS, DSN, no_wait, store_of
from webhook_support import SECRET, post, update

from telegram_fence import SqliteUpdateStore
from telegram_fence.calls.journal import Journal, list_calls
from telegram_fence.calls.limits import Limits
from telegram_fence.ingress.webhook import WsgiServer
from telegram_fence.testing import FakeBotAPI


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh store of each backend (the PostgreSQL tables are dropped afterwards)."""
    with store_of(request.param, tmp_path, "tf_calls") as store:
        yield store


def _rows(store: Any) -> list[Any]:
    with store.write() as conn:
        return list(list_calls(conn))


def _two_replies_failing_once(bot: telebot.TeleBot) -> list[tuple[int, int]]:
    attempts: list[tuple[int, int]] = []

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        key = (message.chat.id, message.message_id)
        attempts.append(key)
        bot.reply_to(message, f"first {message.text}")
        if attempts.count(key) == 1:
            raise RuntimeError("fails between its replies")
        bot.send_message(message.chat.id, f"second {message.text}")

    return attempts


def test_polling_replays_on_either_backend(api: FakeBotAPI, store: Any) -> None:
    """Polling door: three updates failing between their replies once each; every reply reaches the fake once."""
    bot = telebot.TeleBot(api.token, threaded=False)
    attempts = _two_replies_failing_once(bot)
    fence = make_fence(bot, store, retry=no_wait)
    fence.start()
    api.push_messages(3, chats=[1, 2, 3])
    try:
        assert eventually(lambda: fence.stats()["settled"] == 3)
    finally:
        stop(fence)
    texts = sorted(s.text or "" for s in api.sent)
    assert len(texts) == 6 and len(set(texts)) == 6, texts
    assert len(attempts) == 6
    assert sorted(r.state for r in _rows(store)) == ["sent"] * 6


def test_webhook_replays_on_either_backend(api: FakeBotAPI, store: Any) -> None:
    """Webhook door: the same handler behind fence.webhook_app; every reply reaches the fake once."""
    bot = telebot.TeleBot(api.token, threaded=False)
    attempts = _two_replies_failing_once(bot)
    fence = make_fence(bot, store, retry=no_wait)
    app = fence.webhook_app(SECRET)
    server = WsgiServer(app, "127.0.0.1", 0)
    server.start()
    fence.start()
    try:
        for i in range(3):
            status, _, _ = post(server.port, json.dumps(update(500 + i, chat=10 + i, text=f"m{i}")))
            assert status == 200
        assert eventually(lambda: fence.stats()["settled"] == 3)
    finally:
        server.stop()
        assert server.join(10)
        stop(fence)
    texts = sorted(s.text or "" for s in api.sent)
    assert texts == sorted([f"first m{i}" for i in range(3)] + [f"second m{i}" for i in range(3)])
    assert len(attempts) == 6


def test_uncertain_on_either_backend_and_pruned_with_its_update(api: FakeBotAPI, store: Any) -> None:
    """A dropped-after-executing call is uncertain, not resent on retry; pruning the update prunes its calls."""
    api.drop("sendMessage", executed=True)
    bot = telebot.TeleBot(api.token, threaded=False)
    runs: list[Any] = []

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        runs.append(bot.send_message(message.chat.id, "maybe"))
        if len(runs) == 1:
            raise RuntimeError("retry")

    fence = make_fence(bot, store, retry=no_wait)
    fence.start()
    api.push_message(4, "x")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert [(m.message_id, m.text) for m in runs] == [(0, "maybe"), (0, "maybe")]  # stand-ins
    assert len(api.calls_to("sendMessage")) == 1
    assert [(r.seq, r.state, r.chat_id) for r in _rows(store)] == [(0, "uncertain", 4)]
    assert store.prune(settled_before=4e9) == 1
    assert _rows(store) == []


def test_a_pause_one_process_records_holds_another(store: Any) -> None:
    """A 429 pause shared through the store is seen by a second Limits (another process) before its time ends."""
    now = [1000.0]
    first = Limits(share=Journal(store), clock=lambda: now[0])
    second = Limits(share=Journal(store), clock=lambda: now[0])
    first.pause(77, 5.0)
    assert Journal(store).paused_until("chat:77", 1000.0) == 1005.0
    assert Journal(store).paused_until("chat:78", 1000.0) == 0.0  # neither another chat nor the bot
    assert second.ready(77) is False, "the pause recorded by the other holds this chat"
    assert second.ready(78) is True, "another chat is not held"
    first.pause(None, 2.0)
    assert second.ready(78) is False, "a pause of the whole bot holds every chat"
    assert Journal(store).paused_until("chat:78", 1000.0) == 1002.0
    now[0] = 1005.5
    assert second.ready(77) is True


def _journal_some_calls(api: FakeBotAPI, store: Any) -> None:
    """Run a fence until update 1000's reply was sent and update 1001's reply is uncertain."""
    bot = telebot.TeleBot(api.token, threaded=False)
    bot.message_handler(func=lambda m: True)(lambda m: bot.send_message(m.chat.id, f"re {m.text}"))
    fence = make_fence(bot, store)
    fence.start()
    try:
        api.push_message(3, "one")
        assert eventually(lambda: fence.stats()["settled"] == 1)
        api.drop("sendMessage", executed=True)
        api.push_message(4, "two")
        assert eventually(lambda: fence.stats()["settled"] == 2)
    finally:
        stop(fence)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from telegram_fence.cli.main import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_calls_command_lists_the_journal_read_only(api: FakeBotAPI, store: Any,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`telegram-fence calls DB [--update] [--uncertain] [--json]` lists rows with update_id, seq, method, state,
    chat_id, on a SQLite file and a PostgreSQL DSN alike."""
    _journal_some_calls(api, store)
    if isinstance(store, SqliteUpdateStore):
        db, extra = str(store.path), []
    else:
        db, extra = str(DSN), ["--table", store.table]
    code, out, _ = _cli(["calls", db, "--json", *extra], capsys)
    assert code == 0
    rows = json.loads(out)
    assert [(r["update_id"], r["seq"], r["method"], r["state"], r["chat_id"]) for r in rows] == [
        (1000, 0, "sendMessage", "sent", 3), (1001, 0, "sendMessage", "uncertain", 4)]
    code, out, _ = _cli(["calls", db, "--uncertain", "--json", *extra], capsys)
    assert [r["update_id"] for r in json.loads(out)] == [1001]
    code, out, _ = _cli(["calls", db, "--update", "1000", *extra], capsys)
    assert code == 0 and "sendMessage" in out and "1 sent" in out and "uncertain" not in out


def test_calls_command_refuses_what_is_not_a_fence_database(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A missing file is one line on stderr and exit 2; nothing is created."""
    missing = tmp_path / "nope.db"
    code, _out, err = _cli(["calls", str(missing)], capsys)
    assert code == 2 and err.startswith("telegram-fence: ") and len(err.strip().splitlines()) == 1
    assert not missing.exists()


def test_proactive_buckets_are_shared_through_the_store(store: Any) -> None:
    """Two Limits on one store (two processes, or two hosts on PostgreSQL) spend one bot-wide bucket."""
    from telegram_fence import Rates

    now = [2000.0]
    rates = Rates(per_bot=1.0, bot_burst=2, per_chat=100.0, chat_burst=100)
    first = Limits(rates, share=Journal(store), clock=lambda: now[0])
    second = Limits(rates, share=Journal(store), clock=lambda: now[0])
    assert first.ready(1) and second.ready(2)
    assert not first.ready(3) and not second.ready(4), "the burst of 2 is spent by both"
    now[0] += 1.0
    assert second.ready(5) and not first.ready(6)


def test_a_stale_worker_cannot_send_on_either_backend(api: FakeBotAPI, store: Any) -> None:
    """An attempt past handler_timeout whose update another attempt took and handled cannot send: its call
    raises OwnershipLost and nothing of it reaches the fake."""
    import threading

    bot = telebot.TeleBot(api.token, threaded=False)
    second_done = threading.Event()
    stale: list[BaseException] = []
    fence = make_fence(bot, store, handler_timeout=0.3, workers=2)

    @fence.attempt_handler
    def handler(upd: telebot.types.Update, ctx: Any) -> None:
        if ctx.attempt == 1:
            assert second_done.wait(10)
            try:
                bot.send_message(upd.message.chat.id, "stale")
            except Exception as exc:
                stale.append(exc)
                raise
        else:
            bot.send_message(upd.message.chat.id, "fresh")
            second_done.set()

    fence.start()
    api.push_message(6, "hi")
    try:
        assert eventually(lambda: bool(stale))
    finally:
        stop(fence)
    assert [s.text for s in api.sent] == ["fresh"]
    assert type(stale[0]).__name__ == "OwnershipLost"


def test_stats_read_the_journal_while_another_connection_holds_the_write_lock(api: FakeBotAPI, store: Any) -> None:
    """fence.stats()["calls"]["journal"] is a read: it gives the committed counts while a second, real connection
    holds the write lock with an uncommitted journal row (SQLite: BEGIN IMMEDIATE on the same file; PostgreSQL:
    an EXCLUSIVE lock on the journal table), instead of waiting out the busy timeout and giving None."""
    _journal_some_calls(api, store)
    fence = make_fence(telebot.TeleBot(api.token, threaded=False), store)
    row = ("INSERT INTO {t}(update_id, seq, method, chat_id, fingerprint, state, attempt, claim_id, created_at, "
           "changed_at) VALUES (9, 0, 'sendMessage', 1, 'x', 'sent', 1, 'c', 0, 0)")
    if isinstance(store, SqliteUpdateStore):
        import apsw

        other = apsw.Connection(str(store.path))
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute(row.format(t="fence_calls"))
            assert fence.stats()["calls"]["journal"] == {"sent": 1, "uncertain": 1}
            other.execute("ROLLBACK")
        finally:
            other.close()
    else:
        import psycopg

        with psycopg.connect(str(DSN)) as other:
            other.execute(f"LOCK TABLE {store.table}_calls IN EXCLUSIVE MODE")
            other.execute(row.format(t=f"{store.table}_calls"))
            assert fence.stats()["calls"]["journal"] == {"sent": 1, "uncertain": 1}
            other.rollback()


@pytest.mark.parametrize("door", ["poll", "webhook"])
def test_a_queued_call_refused_after_its_commit_is_sent_once_when_the_server_is_back(
        api: FakeBotAPI, store: Any, door: str) -> None:
    """A reply queued in ctx.transaction(complete=True) whose send after the commit meets a server that refuses
    connections (the fake stopped) is tried again by the running fence's resend thread, with backoff, while the
    server stays down; once the fake listens again on its port the reply reaches it exactly once."""
    from telegram_fence import queue_calls

    bot = telebot.TeleBot(api.token, threaded=False)
    fence = make_fence(bot, store, workers=1)

    @fence.attempt_handler
    def handler(upd: telebot.types.Update, ctx: Any) -> None:
        api.stop()  # from here on every connection to the fake is refused
        with ctx.transaction(complete=True), queue_calls():
            bot.send_message(upd.message.chat.id, "saved")

    server = None
    if door == "webhook":
        server = WsgiServer(fence.webhook_app(SECRET), "127.0.0.1", 0)
        server.start()
    fence.start()
    try:
        if server is None:
            api.push_message(5, "hi")
        else:
            assert post(server.port, json.dumps(update(700, chat=5, text="hi")))[0] == 200
        assert eventually(lambda: fence.stats()["settled"] == 1)
        assert eventually(lambda: fence.stats()["calls"]["resend_tries"] >= 2), "tried again while refused"
        assert api.sent == [] and [r.state for r in _rows(store)] in (["queued"], ["intent"]), "intent: in a try"
        assert fence.stats()["calls"]["resending"] == 1
        api.start()  # the same port again
        assert api.wait_sent(1, timeout=20)
        assert eventually(lambda: fence.stats()["calls"]["resending"] == 0)
    finally:
        if server is not None:
            server.stop()
            assert server.join(10)
        stop(fence)
    assert [s.text for s in api.sent] == ["saved"]
    assert [(r.state, r.chat_id) for r in _rows(store)] == [("sent", 5)]


def test_queued_calls_of_one_update_keep_their_order_through_the_resend_thread(api: FakeBotAPI, store: Any) -> None:
    """A handler's first transaction queues "first", whose send is refused (the fake stopped); the fake is back
    before its second transaction queues "second": "second" waits behind "first" on the resend thread instead of
    overtaking it, and each reaches the fake once."""
    from telegram_fence import queue_calls

    bot = telebot.TeleBot(api.token, threaded=False)
    fence = make_fence(bot, store, workers=1)

    @fence.attempt_handler
    def handler(upd: telebot.types.Update, ctx: Any) -> None:
        api.stop()
        with ctx.transaction(), queue_calls():
            bot.send_message(upd.message.chat.id, "first")
        api.start()
        with ctx.transaction(complete=True), queue_calls():
            bot.send_message(upd.message.chat.id, "second")

    fence.start()
    try:
        api.push_message(5, "hi")
        assert eventually(lambda: fence.stats()["settled"] == 1)
        assert api.wait_sent(2, timeout=20)
    finally:
        stop(fence)
    assert [s.text for s in api.sent] == ["first", "second"]
    assert [(r.seq, r.state) for r in _rows(store)] == [(0, "sent"), (1, "sent")]


def test_a_call_to_a_chat_id_beyond_64_bits_is_journaled_without_a_chat_and_telegram_answers(
    api: FakeBotAPI, store: Any,
) -> None:
    """A handler's call to a chat id that fits no 64 bits (say, parsed from a user's text), made directly and queued
    in ``ctx.transaction()``, is journaled without a chat and sent: Telegram's answer decides, the same on both
    backends (before: the journal bound the id into its row, an OverflowError on SQLite and a StoreError on
    PostgreSQL, and the update failed until exhausted without the call ever leaving)."""
    import telebot.apihelper

    bot = telebot.TeleBot(api.token, threaded=False)
    outcomes: list[str] = []
    fence = make_fence(bot, store, retry=no_wait, max_attempts=1)

    @fence.attempt_handler
    def handle(update: Any, ctx: Any) -> None:
        far = 2**70 if update.message.text == "int" else "99999999999999999999999"
        try:
            bot.send_message(far, "direct")
            outcomes.append("sent")
        except telebot.apihelper.ApiTelegramException as exc:
            outcomes.append(f"refused {exc.error_code}")
        with ctx.transaction(complete=True):
            bot.send_message(far, "queued")

    fence.start()
    api.push_message(4, "int")
    api.push_message(5, "text")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 2)
        assert eventually(lambda: len(api.calls_to("sendMessage")) == 4)
    finally:
        stop(fence)
    assert len(outcomes) == 2 and store.stats()["exhausted"] == 0
    rows = _rows(store)
    assert len(rows) == 4 and all(r.chat_id is None for r in rows)
    assert {r.state for r in rows} <= {"sent", "refused"}
