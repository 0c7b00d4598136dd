"""The fenced runtime against the fake Bot API server over real HTTP, with real SQLite files and threads."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, rows, stop
from pg_support import DSN, drop_tables, new_table, requires_pg
from store_helpers import claim_one

from telegram_fence import OwnershipLost, SqliteUpdateStore
from telegram_fence.errors import StoreUnavailable
from telegram_fence.store import Identity
from telegram_fence.testing import FakeBotAPI


def test_existing_message_handlers_run_unchanged(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """Plain @bot.message_handler code runs once per update and every update is confirmed after recording."""

    @bot.message_handler(commands=["start"])
    def start(message: telebot.types.Message) -> None:
        bot.reply_to(message, "hello")

    @bot.message_handler(func=lambda m: True)
    def echo(message: telebot.types.Message) -> None:
        bot.send_message(message.chat.id, f"echo {message.text}")

    fence = make_fence(bot, db)
    fence.start()
    ids = [api.push_message(7, "/start"), *api.push_messages(50, chats=[1, 2, 3])]
    try:
        assert api.wait_sent(51, timeout=10)
        assert api.wait_confirmed(ids[-1] + 1, timeout=5)
        assert eventually(lambda: fence.stats()["settled"] == 51)
    finally:
        stop(fence)
    texts = sorted(s.text or "" for s in api.sent)
    assert texts.count("hello") == 1
    assert len([t for t in texts if t.startswith("echo")]) == 50


def test_fence_handler_gets_each_update(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """@fence.handler replaces telebot's dispatch and sees every update exactly once when nothing fails."""
    seen: list[int] = []
    lock = threading.Lock()
    fence = make_fence(bot, db)

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        with lock:
            seen.append(update.update_id)

    fence.start()
    ids = api.push_messages(30, chats=[1, 2])
    try:
        assert eventually(lambda: len(seen) == 30)
    finally:
        stop(fence)
    assert sorted(seen) == ids


class ChatLedger:
    """What handlers saw, per chat: the order updates ran in, and whether two ever ran at once."""

    def __init__(self) -> None:
        self.running: dict[int, int] = {}
        self.order: dict[int, list[int]] = {}
        self.overlap: list[int] = []
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def enter(self, update: telebot.types.Update) -> None:
        chat = update.message.chat.id
        with self._lock:
            self.running[chat] = self.running.get(chat, 0) + 1
            if self.running[chat] > 1:
                self.overlap.append(chat)
            self.order.setdefault(chat, []).append(update.update_id)
            self.threads.add(threading.current_thread().name)

    def leave(self, update: telebot.types.Update) -> None:
        with self._lock:
            self.running[update.message.chat.id] -= 1

    def total(self) -> int:
        with self._lock:
            return sum(len(ids) for ids in self.order.values())

    def assert_one_at_a_time_in_order(self) -> None:
        assert self.overlap == []
        for ids in self.order.values():
            assert ids == sorted(ids) and len(ids) == len(set(ids))


def test_per_chat_updates_never_run_at_once_and_keep_order(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """Two updates of one chat never run concurrently, and a chat's updates run in update_id order."""
    ledger = ChatLedger()
    fence = make_fence(bot, db, workers=4)

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        ledger.enter(update)
        time.sleep(0.002)  # a handler doing a little work, so overlaps would show
        ledger.leave(update)

    fence.start()
    api.push_messages(120, chats=[1, 2, 3])
    try:
        assert eventually(lambda: ledger.total() == 120)
    finally:
        stop(fence)
    ledger.assert_one_at_a_time_in_order()


def test_recording_failure_keeps_the_cursor_and_asks_the_same_offset(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """When recording a batch fails, the cursor stays, the same offset is polled again, and nothing is lost."""
    store = SqliteUpdateStore(db)
    real_record = store.record
    failures = [1]

    def flaky_record(*args: Any, **kwargs: Any) -> int:
        if args[0] and failures[0]:
            failures[0] -= 1
            raise StoreUnavailable("injected: disk full")
        return real_record(*args, **kwargs)

    store.record = flaky_record  # type: ignore[method-assign]
    handled: list[int] = []
    fence = make_fence(bot, store)
    fence.handler(lambda update: handled.append(update.update_id))
    fence.start()
    ids = api.push_messages(5)
    try:
        assert eventually(lambda: len(handled) == 5)
    finally:
        stop(fence)
        store.close()
    offsets = [int(c.params.get("offset", 0)) for c in api.calls if c.method == "getUpdates"]
    # the first batch was fetched twice with the same offset (nothing confirmed in between)
    first_fetch = [o for o in offsets if o <= ids[0]]
    assert len(first_fetch) >= 2
    assert sorted(handled) == ids


def test_retry_after_on_getupdates_is_honoured(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """A 429 on getUpdates makes the poller wait at least retry_after before the next call; nothing is lost."""
    handled: list[int] = []
    api.fail("getUpdates", 429, "Too Many Requests: retry after 1", retry_after=1)
    fence = make_fence(bot, db)
    fence.handler(lambda update: handled.append(update.update_id))
    fence.start()
    ids = api.push_messages(3)
    try:
        assert eventually(lambda: len(handled) == 3)
    finally:
        stop(fence)
    times = [c.time for c in api.calls if c.method == "getUpdates"]
    assert times[1] - times[0] >= 1.0
    assert sorted(handled) == ids


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_pg)])
def either_store(request: pytest.FixtureRequest, db: str) -> Iterator[Any]:
    """The store a fault drill runs its fence on: a SQLite file, or a PostgreSQL table (dropped after)."""
    if request.param == "sqlite":
        yield db
        return
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = new_table("tf_faults")
    store = PostgresUpdateStore(DSN, table=table)
    try:
        yield store
    finally:
        store.close()
        drop_tables(table)


@pytest.mark.parametrize("fault", ["500", "drop", "malformed"])
def test_transient_getupdates_faults_lose_nothing(
    api: FakeBotAPI, bot: telebot.TeleBot, either_store: Any, fault: str
) -> None:
    """5xx answers, dropped connections and malformed bodies on getUpdates are retried without losing an update,
    on SQLite and PostgreSQL."""
    if fault == "500":
        api.fail("getUpdates", 500, "Internal Server Error", times=3)
    elif fault == "drop":
        api.drop("getUpdates", times=2)
    else:
        api.malformed("getUpdates", times=2)
    handled: list[int] = []
    fence = make_fence(bot, either_store)
    fence.handler(lambda update: handled.append(update.update_id))
    ids = api.push_messages(10, chats=[1, 2])
    fence.start()
    try:
        assert eventually(lambda: len(handled) == 10)
        assert api.wait_confirmed(ids[-1] + 1, timeout=5)
    finally:
        stop(fence)
    assert sorted(handled) == ids


def test_conflict_is_retried_then_ends_the_run(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """A 409 that persists past conflict_grace ends the poller once; run() returns non-zero."""
    api.fail("getUpdates", 409, "Conflict: terminated by other getUpdates request", times=None)
    reasons: list[str] = []
    fence = make_fence(bot, db, conflict_grace=0.5, on_ended=reasons.append)
    code = fence.run()
    assert code == 1
    assert len(reasons) == 1 and "409" in reasons[0]
    assert len([c for c in api.calls if c.method == "getUpdates"]) >= 2


def test_short_conflict_during_rolling_restart_recovers(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 409 that clears within conflict_grace is retried and the updates are handled; each retry's warning says
    what is going on and how long the poller goes on before it ends."""
    caplog.set_level(logging.WARNING, logger="telegram_fence")
    api.fail("getUpdates", 409, "Conflict: terminated by other getUpdates request", times=2)
    handled: list[int] = []
    fence = make_fence(bot, db, conflict_grace=30)
    fence.handler(lambda update: handled.append(update.update_id))
    api.push_messages(3)
    fence.start()
    try:
        assert eventually(lambda: len(handled) == 3)
    finally:
        stop(fence)
    assert fence.ended_reason is None
    lines = [r.getMessage() for r in caplog.records if "conflict" in r.getMessage()]
    assert len(lines) == 2, lines
    wanted = (r"getUpdates conflict \(409\): another instance is polling with this bot token; retrying, this poller "
              r"ends if it goes on for (30|29) s more")
    assert all(re.fullmatch(wanted, line) for line in lines), lines


def test_invalid_token_ends_at_once_naming_the_cause_not_the_token(api: FakeBotAPI, db: str) -> None:
    """A 401 ends the run at once; the reason names the cause and never the token."""
    api.revoke_token()
    bot = telebot.TeleBot(api.token, threaded=False)
    reasons: list[str] = []
    fence = make_fence(bot, db, on_ended=reasons.append)
    started = time.monotonic()
    assert fence.run() == 1
    assert time.monotonic() - started < 10
    assert "401" in reasons[0] and "token" in reasons[0]
    assert api.token.split(":")[1] not in reasons[0]


def test_watchdog_ends_a_stalled_poller(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """A getUpdates that does not return within long_poll_timeout + margin ends the run through the watchdog."""
    api.delay("getUpdates", 5.0, times=None)
    reasons: list[str] = []
    fence = make_fence(bot, db, lease=0.3, watchdog_margin=0.5, on_ended=reasons.append)
    fence.start()
    try:
        assert eventually(lambda: reasons, timeout=5)
    finally:
        fence.stop()
        fence.join(1)  # the stalled poller is abandoned: that is the point
    assert "watchdog" in reasons[0]
    assert fence.ended_reason == reasons[0]


def test_failing_handler_is_exhausted_after_max_attempts_and_reported_once(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """A handler failing every time is exhausted after max_attempts; on_exhausted sees it once; it is acknowledged."""
    attempts: list[int] = []
    told: list[Any] = []
    fence = make_fence(bot, db, max_attempts=3, retry=lambda error, attempt: 0.0, on_exhausted=told.append)

    @fence.attempt_handler
    def handle(update: telebot.types.Update, ctx: Any) -> None:
        attempts.append(ctx.attempt)
        raise RuntimeError("the database of record is down")

    fence.start()
    (update_id,) = [api.push_message(5, "doomed")]
    try:
        assert eventually(lambda: len(told) == 1)
        assert eventually(lambda: fence.stats()["acknowledged"] == 1)
    finally:
        stop(fence)
    assert attempts == [1, 2, 3]
    exhaustion = told[0]
    assert exhaustion.identity.update_id == update_id and exhaustion.identity.attempt == 3
    assert "the database of record is down" in exhaustion.error


def test_refused_message_is_exhausted_without_retry(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """A handler whose reply Telegram refuses (message too long) is exhausted at once by the default policy."""
    attempts: list[int] = []
    fence = make_fence(bot, db, max_attempts=5)

    @fence.attempt_handler
    def handle(update: telebot.types.Update, ctx: Any) -> None:
        attempts.append(ctx.attempt)
        bot.send_message(update.message.chat.id, "x" * 5000)

    fence.start()
    api.push_message(5, "hi")
    try:
        assert eventually(lambda: fence.stats()["exhausted"] == 1)
    finally:
        stop(fence)
    assert attempts == [1]


def test_raising_on_exhausted_is_delivered_again_after_restart(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """An on_exhausted that raises does not acknowledge; the next run delivers the exhaustion again."""
    calls: list[Identity] = []

    def broken(exhaustion: Any) -> None:
        calls.append(exhaustion.identity)
        raise RuntimeError("pager is down")

    fence = make_fence(bot, db, max_attempts=1, on_exhausted=broken)
    fence.handler(lambda update: (_ for _ in ()).throw(ValueError("bad")))
    fence.start()
    api.push_message(5, "doomed")
    try:
        assert eventually(lambda: len(calls) >= 1)
    finally:
        stop(fence)
    assert SqliteUpdateStore(db).stats()["exhausted"] == 1

    delivered: list[Identity] = []
    again = make_fence(bot, db, on_exhausted=lambda e: delivered.append(e.identity))
    again.handler(lambda update: None)
    again.start()
    try:
        assert eventually(lambda: len(delivered) == 1)
        assert eventually(lambda: again.stats()["exhausted"] == 0)
    finally:
        stop(again)
    assert delivered[0] == calls[0]


def test_stale_worker_cannot_commit_and_was_told(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """A handler held past handler_timeout loses its update to another worker: its owner_lost is set and its
    fenced write is refused, while the new attempt's write commits on another thread."""
    store = SqliteUpdateStore(db)
    with store.write() as conn:
        conn.execute("CREATE TABLE domain(update_id INTEGER PRIMARY KEY, attempt INTEGER)")
    second_done = threading.Event()
    stale: dict[str, Any] = {}
    fence = make_fence(bot, store, workers=2, lease=0.6, handler_timeout=0.4)

    @fence.attempt_handler
    def handle(update: telebot.types.Update, ctx: Any) -> None:
        if ctx.attempt == 1:
            second_done.wait(10)  # "paused" well past the handler timeout and the lease
            stale["owner_lost"] = ctx.owner_lost.is_set()
            try:
                with ctx.transaction(complete=True) as conn:
                    conn.execute("INSERT INTO domain VALUES (?, ?)", (update.update_id, ctx.attempt))
            except OwnershipLost as exc:
                stale["refused"] = exc
            return
        with ctx.transaction(complete=True) as conn:
            conn.execute("INSERT INTO domain VALUES (?, ?)", (update.update_id, ctx.attempt))
        second_done.set()

    fence.start()
    api.push_message(3, "slow")
    try:
        assert eventually(lambda: "refused" in stale or "owner_lost" in stale, timeout=15)
    finally:
        stop(fence)
    rows = SqliteUpdateStore(db).write().__enter__().execute("SELECT update_id, attempt FROM domain").fetchall()
    assert stale["owner_lost"] is True
    assert isinstance(stale.get("refused"), OwnershipLost)
    assert [attempt for _, attempt in rows] == [2]
    store.close()


def test_a_hanging_handler_holds_only_its_own_chat(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """While one chat's handler hangs, other chats' updates are handled."""
    release = threading.Event()
    handled: list[int] = []
    fence = make_fence(bot, db, workers=2)

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        if update.message.chat.id == 1:
            release.wait(10)
        handled.append(update.message.chat.id)

    fence.start()
    api.push_message(1, "hang")
    api.push_messages(20, chats=[2, 3])
    try:
        assert eventually(lambda: handled.count(2) + handled.count(3) == 20)
        assert 1 not in handled
    finally:
        release.set()
        stop(fence)


def test_unparseable_update_is_exhausted_and_does_not_block_its_chat(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """An update telebot cannot parse is exhausted with the parse error and its raw JSON; the chat goes on."""
    handled: list[int] = []
    fence = make_fence(bot, db)
    fence.handler(lambda update: handled.append(update.update_id))
    bad = api.push_update({"message": {"message_id": 1, "chat": {"id": 9, "type": "private"}}})
    good = api.push_message(9, "after the bad one")
    fence.start()
    try:
        assert eventually(lambda: handled == [good])
        assert eventually(lambda: fence.stats()["exhausted"] == 1)
    finally:
        stop(fence)
    store = SqliteUpdateStore(db)
    (exhaustion,) = store.due_exhaustions()
    store.close()
    assert exhaustion.identity.update_id == bad
    assert "could not be parsed" in exhaustion.error and "KeyError" in exhaustion.error
    assert exhaustion.update["message"]["chat"]["id"] == 9


def test_unauthorized_updates_are_skipped_but_confirmed(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """authorize() returning False records the update as skipped: the cursor advances and no handler runs."""
    handled: list[int] = []
    fence = make_fence(bot, db, authorize=lambda raw: raw["message"]["chat"]["id"] != 666)
    fence.handler(lambda update: handled.append(update.message.chat.id))
    ids = [api.push_message(666, "intruder"), api.push_message(1, "friend")]
    fence.start()
    try:
        assert eventually(lambda: handled == [1])
        assert api.wait_confirmed(ids[-1] + 1)
    finally:
        stop(fence)
    assert SqliteUpdateStore(db).stats()["skipped"] == 1


def test_paused_fence_does_not_poll_until_resumed(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """start(paused=True) sends no getUpdates until resume(); then the waiting updates are handled."""
    handled: list[int] = []
    fence = make_fence(bot, db)
    fence.handler(lambda update: handled.append(update.update_id))
    api.push_messages(3)
    fence.start(paused=True)
    try:
        assert not eventually(lambda: api.calls_to("getUpdates"), timeout=0.5)
        fence.resume()
        assert eventually(lambda: len(handled) == 3)
    finally:
        stop(fence)


def test_stop_from_inside_a_handler_returns_zero(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """A handler may call fence.stop(); run() then returns 0 and the update was settled."""
    fence = make_fence(bot, db)
    fence.handler(lambda update: fence.stop())
    api.push_message(1, "/quit")
    assert fence.run() == 0
    assert SqliteUpdateStore(db).stats()["settled"] == 1


def test_generations_tell_runs_apart(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """Each run of the poller takes a new generation; progress is recorded under the current one."""
    for expected in (1, 2):
        fence = make_fence(bot, db)
        fence.handler(lambda update: None)
        fence.start()
        try:
            assert eventually(lambda f=fence: (f.stats()["generation"] or {}).get("progress_at") is not None)
            stats = fence.stats()
            assert stats["generation"]["generation"] == expected
            assert stats["poller"]["generation"] == expected
        finally:
            stop(fence)


def test_operator_chat_is_told_of_exhaustions_and_of_the_poller_ending(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """With operator=OperatorChannel, an exhaustion and the poller's end are posted to the operator chat."""
    from telegram_fence import OperatorChannel

    operator = OperatorChannel(bot, 999)
    fence = make_fence(bot, db, max_attempts=1, operator=operator, conflict_grace=0.5)
    fence.handler(lambda update: (_ for _ in ()).throw(RuntimeError("handler broke")))
    api.push_message(5, "doomed")
    fence.start()
    try:
        assert eventually(lambda: any("exhausted" in (s.text or "") for s in api.sent_to(999)))
        api.fail("getUpdates", 409, "Conflict: terminated by other getUpdates request", times=None)
        assert eventually(lambda: fence.ended_reason is not None)
        assert operator.drain(5)
    finally:
        stop(fence)
        operator.close(5)
    texts = [s.text or "" for s in api.sent_to(999)]
    assert any("handler broke" in t for t in texts)
    assert any("poller ended" in t and "409" in t for t in texts)
    assert all(api.token.split(":")[1] not in t for t in texts)


def test_settled_rows_are_pruned_after_retention_and_open_rows_are_kept(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """The heartbeat prunes settled rows older than `retention`; an unacknowledged exhaustion stays."""
    fence = make_fence(bot, db, lease=0.3, retention=0.2, max_attempts=1)
    fence.handler(lambda update: None if update.message.text != "fail" else 1 / 0)
    api.push_messages(5, chats=[1, 2])
    api.push_message(3, "fail")
    fence.start()
    try:
        assert eventually(lambda: fence.stats()["settled"] == 5 or fence.stats()["workers"]["handled"] >= 5)
        assert eventually(lambda: fence.stats()["settled"] == 0 and fence.stats()["workers"]["handled"] == 5,
                          timeout=10)
        assert fence.stats()["exhausted"] == 1
    finally:
        stop(fence)


# --- chat order ---------------------------------------------------------------------------------


def test_fast_handlers_run_in_order_and_never_side_by_side(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """Microsecond handlers on many threads: every chat still runs in update_id order, one update at a time, and
    every update is handled exactly once."""
    ledger = ChatLedger()
    fence = make_fence(bot, db)

    @fence.handler
    def handle(update: telebot.types.Update) -> None:
        ledger.enter(update)
        ledger.leave(update)

    fence.start()
    api.push_messages(3000, chats=list(range(1, 8)))
    try:
        assert eventually(lambda: ledger.total() == 3000, timeout=30)
    finally:
        stop(fence)
    ledger.assert_one_at_a_time_in_order()
    with SqliteUpdateStore(db) as store:
        stats = store.stats()
    assert (stats["settled"], stats["pending"], stats["claimed"]) == (3000, 0, 0)


def test_an_answer_with_an_unusable_item_is_recorded_without_it(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """An item without an integer update_id is dropped (logged); the others of the same answer are
    stored, decoded as they came, and handled, and the answer's bytes are not used for them."""
    good = {"update_id": 41, "message": {"message_id": 1, "date": 0, "chat": {"id": 5, "type": "private"},
                                         "text": "é"}}
    body = json.dumps({"ok": True, "result": [{"update_id": "x"}, good]}, ensure_ascii=True).encode()
    api.malformed("getUpdates", body=body)
    seen: list[int] = []
    fence = make_fence(bot, db)
    fence.handler(lambda update: seen.append(update.update_id))
    fence.start()
    try:
        assert eventually(lambda: seen == [41])
    finally:
        stop(fence)
    with SqliteUpdateStore(db) as store:
        (payload,) = rows(store, "SELECT payload FROM fence_updates WHERE update_id = 41")[0]
    assert json.loads(payload) == good
    assert "\\u00e9" not in payload  # encoded from the dicts, not cut out of an answer that held more


# --- background threads outlive store errors -----------------------------------


class AcknowledgeFailsOnce(SqliteUpdateStore):
    """A real store whose first acknowledge_exhaustion raises StoreUnavailable, as when another process
    holds the write lock past the busy timeout."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused = threading.Event()

    def acknowledge_exhaustion(self, identity: Any) -> Any:
        if not self.refused.is_set():
            self.refused.set()
            raise StoreUnavailable("database is locked (injected: another process holds the write lock)")
        return super().acknowledge_exhaustion(identity)


def test_the_exhaustions_thread_outlives_a_store_error_and_delivers_later_exhaustions(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """A StoreUnavailable from acknowledge_exhaustion is logged and retried; the fence-exhaustions thread lives on
    and later exhaustions still reach on_exhausted, without a restart."""
    store = AcknowledgeFailsOnce(db)
    told: list[int] = []
    fence = make_fence(bot, store, max_attempts=1, on_exhausted=lambda e: told.append(e.identity.update_id))
    fence.handler(lambda update: 1 / 0)
    fence.start()
    try:
        first = api.push_message(5, "first")
        assert eventually(lambda: store.refused.is_set())
        assert eventually(lambda: told.count(first) == 2)  # delivered again: it was not acknowledged
        second = api.push_message(6, "second")
        assert eventually(lambda: second in told)
        assert eventually(lambda: fence.stats()["exhausted"] == 0 and fence.stats()["acknowledged"] == 2)
        assert [t.name for t in threading.enumerate()].count("fence-exhaustions") == 1
        assert fence.ended_reason is None
    finally:
        stop(fence)
        store.close()


def test_an_exhaustion_found_at_claim_time_reaches_on_exhausted_at_once(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """An update whose attempts another process spent (its lease lapsed) is exhausted at claim time and reaches
    on_exhausted within seconds, not at the exhaustions thread's next 60 s round.
    """
    told: list[int] = []
    fence = make_fence(bot, db, max_attempts=1, on_exhausted=lambda e: told.append(e.identity.update_id))
    fence.handler(lambda update: None)
    fence.start()
    other = SqliteUpdateStore(db)  # another process: claims an update, then dies without settling it
    try:
        assert eventually(lambda: fence.stats()["poller"]["polls"] >= 1)
        orphan = {"update_id": 10**6, "message": {"message_id": 1, "date": 0, "chat": {"id": 3, "type": "private"},
                                                   "text": "orphan"}}
        with other.write(durable=True):  # recorded and claimed in one transaction: the fence never sees it unclaimed
            other.record([orphan], 10**6 + 1)
            claim = claim_one(other, 1.0)
        assert claim is not None and claim.update_id == orphan["update_id"]
        assert eventually(lambda: told == [claim.update_id], timeout=15)
        assert fence.ended_reason is None
    finally:
        stop(fence)
        other.close()


def test_a_finished_attempt_keeps_no_payload(api: FakeBotAPI, bot: telebot.TeleBot, either_store: Any) -> None:
    """An attempt's ``ctx.raw`` is its update while the handler runs and an empty mapping once the handler returned
    (the pool keeps a finished attempt until its settle, without the update's dicts), on SQLite and PostgreSQL."""
    during: list[int] = []
    kept: list[Any] = []
    lock = threading.Lock()
    fence = make_fence(bot, either_store)

    @fence.attempt_handler
    def handle(update: Any, ctx: Any) -> None:
        with lock:
            during.append(ctx.raw["update_id"])
            kept.append(ctx)

    ids = api.push_messages(40, chats=[1, 2, 3])
    fence.start()
    try:
        assert eventually(lambda: len(during) == 40)
        assert eventually(lambda: all(len(ctx.raw) == 0 for ctx in kept))
    finally:
        stop(fence)
    assert sorted(during) == ids
    assert all(dict(ctx.raw) == {} for ctx in kept)
    with pytest.raises(TypeError):
        kept[0].raw["update_id"] = 1  # read-only: nothing can be put back into a released attempt
