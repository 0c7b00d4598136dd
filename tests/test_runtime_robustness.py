"""The runtime's threads under store failures, and what they log: real fences, SQLite files, HTTP and threads."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import apsw
import pytest
import telebot
from helpers import eventually, make_fence, stop
from pg_support import DSN, drop_tables, new_table, requires_pg

from telegram_fence import Fence, SqliteUpdateStore
from telegram_fence.errors import StoreCorrupt, StoreUnavailable
from telegram_fence.store import Identity
from telegram_fence.testing import FakeBotAPI


class ReleaseFailsOnce(SqliteUpdateStore):
    """A real SQLite store whose first ``release`` of a timed-out attempt raises ``StoreUnavailable``."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.failed: list[Identity] = []

    def release(self, identity: Identity, *, attempt_counts: bool = True) -> bool:
        if attempt_counts and not self.failed:
            self.failed.append(identity)
            raise StoreUnavailable("injected: the database stayed locked past the busy timeout")
        return super().release(identity, attempt_counts=attempt_counts)


def test_failed_release_of_a_timed_out_handler_still_replaces_the_worker(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """When ending a timed-out handler's lease fails, a replacement worker still starts: with one worker, the
    other chats' updates are handled, and the stuck update itself again once its lease lapsed."""
    store = ReleaseFailsOnce(db)
    unblock = threading.Event()
    handled: list[tuple[int, int]] = []
    fence = make_fence(bot, store, workers=1, lease=1.0, handler_timeout=0.3)

    @fence.attempt_handler
    def handle(update: telebot.types.Update, ctx: Any) -> None:
        if update.message.text == "stuck" and ctx.attempt == 1:
            unblock.wait(20)
            return
        handled.append((update.update_id, ctx.attempt))

    fence.start()
    stuck = api.push_message(1, "stuck")
    try:
        assert eventually(lambda: fence.stats()["workers"]["timeouts"] == 1, timeout=10)
        others = [api.push_message(chat, "hello") for chat in (2, 3)]
        assert eventually(lambda: {u for u, _ in handled} >= set(others), timeout=10), handled
        assert eventually(lambda: (stuck, 2) in handled, timeout=10), handled
        assert fence.stats()["workers"]["alive"] == 1
        assert store.failed and store.failed[0].update_id == stuck
    finally:
        unblock.set()
        stop(fence)


def test_a_failing_handler_logs_update_attempt_and_error_in_the_message(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failure logs one line naming the update, the attempt and ``ValueError: ...`` in the message text
    itself (the extra fields kept); the exhaustion's line carries the traceback."""
    caplog.set_level(logging.WARNING, logger="telegram_fence.workers")
    fence = make_fence(bot, db, max_attempts=2, retry=lambda error, attempt: 0.0)

    @bot.message_handler(func=lambda m: True)
    def fail(message: telebot.types.Message) -> None:
        raise ValueError(f"no notes table for chat {message.chat.id}")

    fence.start()
    update_id = api.push_message(5, "hi")
    try:
        assert eventually(lambda: fence.stats()["workers"]["exhausted"] == 1, timeout=15)
    finally:
        stop(fence)
    records = [r for r in caplog.records if r.name == "telegram_fence.workers"]
    [retry] = [r for r in records if "will retry" in r.getMessage()]
    assert f"update {update_id}" in retry.getMessage()
    assert "attempt 1" in retry.getMessage()
    assert "ValueError: no notes table for chat 5" in retry.getMessage()
    assert (retry.update_id, retry.attempt) == (update_id, 1)  # type: ignore[attr-defined]
    [exhausted] = [r for r in records if "exhausted" in r.getMessage()]
    assert exhausted.levelno == logging.ERROR
    assert f"update {update_id} exhausted after attempt 2" in exhausted.getMessage()
    assert "ValueError: no notes table for chat 5" in exhausted.getMessage()
    assert exhausted.exc_info is not None and exhausted.exc_info[0] is ValueError
    assert "Traceback" in logging.Formatter().format(exhausted)


_RUNTIME_THREADS = ("fence-dispatcher", "fence-worker-", "fence-heartbeat")


class _Chaos:
    """Fails, while ``chaos`` is set, a share of the store calls made on the pool's threads (dispatcher, workers,
    heartbeat) with ``StoreUnavailable`` or the driver's own error (``raw``), before doing anything."""

    raw: Callable[[str], BaseException] = apsw.BusyError

    def _chaos_setup(self, share: float, seed: int) -> None:
        self.chaos = threading.Event()
        self.injected: dict[str, int] = {}
        self._chaos_share = share
        self._chaos_random = random.Random(seed)
        self._chaos_lock = threading.Lock()

    def _maybe_fail(self, method: str) -> None:
        if not self.chaos.is_set() or not threading.current_thread().name.startswith(_RUNTIME_THREADS):
            return
        with self._chaos_lock:
            roll = self._chaos_random.random()
            if roll >= self._chaos_share:
                return
            self.injected[method] = self.injected.get(method, 0) + 1
        if roll < self._chaos_share / 2:
            raise StoreUnavailable(f"injected in {method}: the database stayed locked past the busy timeout")
        raise type(self).raw(f"injected in {method}: database is locked")

    def write(self, *, durable: bool = False) -> Any:
        self._maybe_fail("write")
        return super().write(durable=durable)  # type: ignore[misc]

    def record(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("record")
        return super().record(*args, **kwargs)  # type: ignore[misc]

    def exchange(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("exchange")
        return super().exchange(*args, **kwargs)  # type: ignore[misc]

    def settle_many(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("settle_many")
        return super().settle_many(*args, **kwargs)  # type: ignore[misc]

    def renew_many(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("renew_many")
        return super().renew_many(*args, **kwargs)  # type: ignore[misc]

    def release(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("release")
        return super().release(*args, **kwargs)  # type: ignore[misc]

    def retry_owned(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("retry_owned")
        return super().retry_owned(*args, **kwargs)  # type: ignore[misc]

    def exhaust(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("exhaust")
        return super().exhaust(*args, **kwargs)  # type: ignore[misc]

    def transaction(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("transaction")
        return super().transaction(*args, **kwargs)  # type: ignore[misc]

    def prune(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("prune")
        return super().prune(*args, **kwargs)  # type: ignore[misc]


class FlakyStore(_Chaos, SqliteUpdateStore):
    """A real SQLite store with :class:`_Chaos` (its raw error: ``apsw.BusyError``)."""

    def __init__(self, path: str, share: float, seed: int) -> None:
        SqliteUpdateStore.__init__(self, path)
        self._chaos_setup(share, seed)


def _flaky_postgres(table: str, share: float, seed: int) -> Any:
    """A real PostgreSQL store with :class:`_Chaos` (its raw error: ``psycopg.OperationalError``)."""
    import psycopg

    from telegram_fence.store.postgres import PostgresUpdateStore

    class FlakyPostgresStore(_Chaos, PostgresUpdateStore):
        raw = psycopg.OperationalError

    store = FlakyPostgresStore(DSN, table=table)
    store._chaos_setup(share, seed)
    return store


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_pg)])
def flaky_backend(request: pytest.FixtureRequest, db: str) -> Iterator[Callable[[float, int], tuple[Any, str]]]:
    """``make(share, seed)``: a flaky store of each backend, and its SQL placeholder."""
    made: list[Any] = []
    table = new_table("tf_chaos")

    def make(share: float, seed: int) -> tuple[Any, str]:
        store = FlakyStore(db, share, seed) if request.param == "sqlite" else _flaky_postgres(table, share, seed)
        made.append(store)
        return store, "?" if request.param == "sqlite" else "%s"

    yield make
    if request.param == "postgres":
        for store in made:
            store.close()
        drop_tables(table, f"{table}_effects")


def _runtime_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(_RUNTIME_THREADS))


def _push_bursts(api: FakeBotAPI, bursts: int) -> list[int]:
    pushed: list[int] = []
    pause = threading.Event()
    for burst in range(bursts):
        pushed += api.push_messages(12, chats=[1, 2, 3, 4, 5, 6], text=f"burst {burst} {{i}}")
        pause.wait(0.15)
    pause.wait(0.5)
    return pushed


def test_store_errors_at_random_calls_neither_kill_a_thread_nor_double_an_update(
    api: FakeBotAPI, bot: telebot.TeleBot, flaky_backend: Callable[[float, int], tuple[Any, str]]
) -> None:
    """With 30% of the pool's store calls failing (StoreUnavailable, the driver's own error) for a while,
    afterwards every update's fenced write committed exactly once, every update is settled, the pool's threads
    are alive and the fence did not end; on SQLite and on PostgreSQL."""
    store, mark = flaky_backend(0.3, 12)
    effects_table = "effects" if mark == "?" else f"{store.table}_effects"
    with store.write() as conn:
        conn.execute(f"CREATE TABLE {effects_table}(update_id bigint, attempt integer)")
    fence = make_fence(bot, store, workers=3, lease=0.6, max_attempts=1000, retry=lambda error, attempt: 0.02)

    @fence.attempt_handler
    def handle(update: telebot.types.Update, ctx: Any) -> None:
        threading.Event().wait(0.02)  # long enough for leases to be renewed meanwhile
        with ctx.transaction(complete=True) as conn:
            conn.execute(f"INSERT INTO {effects_table} VALUES ({mark}, {mark})", (update.update_id, ctx.attempt))

    def effects() -> list[int]:
        with store.write() as conn:
            cursor = conn.execute(f"SELECT update_id FROM {effects_table} ORDER BY update_id")
            return [row[0] for row in cursor.fetchall()]

    fence.start()
    try:
        store.chaos.set()
        pushed = _push_bursts(api, 10)
        store.chaos.clear()
        assert sum(store.injected.values()) >= 5, store.injected
        assert eventually(lambda: len(set(effects())) == len(pushed), timeout=60), (len(effects()), len(pushed))
        assert eventually(lambda: fence.stats()["settled"] == len(pushed), timeout=20), fence.stats()
        assert effects() == sorted(pushed)  # each exactly once
        assert fence.ended_reason is None
        assert {"fence-dispatcher", "fence-heartbeat"} <= set(_runtime_threads())
    finally:
        store.chaos.clear()
        stop(fence)


class CorruptOnExchange(SqliteUpdateStore):
    """A real SQLite store whose ``exchange`` reports a damaged database once ``broken`` is set."""

    broken = False

    def exchange(self, *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            raise StoreCorrupt("injected: database disk image is malformed")
        return super().exchange(*args, **kwargs)  # type: ignore[misc]


def test_a_dispatcher_that_cannot_go_on_ends_the_fence_with_its_reason(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """A store error retrying cannot fix (StoreCorrupt) in the dispatcher's round ends the fence: ``ended_reason``
    and ``on_ended`` name the thread and the error, and the fence stops instead of spinning."""
    store = CorruptOnExchange(db)
    reasons: list[str] = []
    fence = make_fence(bot, store, on_ended=reasons.append)
    fence.handler(lambda update: None)
    fence.start()
    try:
        api.push_message(1, "fine")
        assert eventually(lambda: fence.stats()["settled"] == 1)
        store.broken = True
        api.push_message(1, "breaks")
        assert eventually(lambda: fence.ended_reason is not None, timeout=10)
        assert fence.join(10)
    finally:
        fence.stop()
        fence.join(10)
    assert reasons == [fence.ended_reason]
    assert "fence-dispatcher" in reasons[0] and "StoreCorrupt: injected" in reasons[0]


def _wakeups(fence: Fence) -> int:
    workers = fence.stats()["workers"]
    return int(workers["heartbeat_wakeups"] + workers["dispatcher_wakeups"])


def test_an_idle_fence_does_not_tick(db: str) -> None:
    """With no update in flight (after some were handled, one of them slowly), the heartbeat and the
    dispatcher wake at most a few times a second: they wait for the next deadline, not a tick. (The long polls
    last 5 s here: each empty one's progress mark is a write the dispatcher makes, as in production once per
    long poll; the suite's usual 0.3 s polls would wake it three times a second for that alone.)"""
    slow = threading.Event()
    with FakeBotAPI(max_long_poll=30) as api:
        fence = make_fence(telebot.TeleBot(api.token, threaded=False), db, lease=30.0, long_poll_timeout=5.0)

        @fence.handler
        def handle(update: Any) -> None:
            if update.message.text == "slow":
                slow.wait(0.3)  # on a worker, with a lease renewed and a timeout armed

        fence.start()
        try:
            api.push_messages(60, chats=[1, 2, 3])
            assert eventually(lambda: fence.stats()["settled"] == 60)
            api.push_message(4, "slow")
            assert eventually(lambda: fence.stats()["settled"] == 61)
            pause = threading.Event()
            pause.wait(0.5)  # the last deadlines of the work just done pass
            before = _wakeups(fence)
            pause.wait(2.0)
            idle = _wakeups(fence) - before
            assert idle <= 6, f"{idle} wake-ups of the heartbeat and the dispatcher in 2 idle seconds"
        finally:
            stop(fence)


def test_an_idle_fence_runs_a_retry_when_it_is_due(api: FakeBotAPI, bot: telebot.TeleBot, db: str) -> None:
    """A retry this fence scheduled runs when it is due, though an idle fence scans the backlog only every few
    seconds (long lease): the dispatcher waits for the retry's time."""
    attempts: list[float] = []
    fence = make_fence(bot, db, lease=30.0, retry=lambda error, attempt: 0.2)

    @fence.handler
    def handle(update: Any) -> None:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise ValueError("first attempt fails")

    fence.start()
    try:
        api.push_message(1, "retry me")
        assert eventually(lambda: fence.stats()["settled"] == 1, timeout=10)
        assert fence.stats()["workers"]["retried"] == 1
        assert attempts[1] - attempts[0] < 2.5  # an idle scan comes every 5 s at this lease; the retry at 0.2 s
    finally:
        stop(fence)


def test_a_handler_error_with_a_lone_surrogate_is_stored_logged_and_told_to_the_operator(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler raising ValueError("\\ud800") is retried and exhausted with the text escaped in the store, the
    log lines, on_exhausted and the operator chat.
    """
    from telegram_fence import OperatorChannel
    from telegram_fence.runtime.attempt import error_line, error_text

    operator = OperatorChannel(bot, 999, backoff=0.01, max_backoff=0.05)
    told: list[Any] = []
    fence = make_fence(bot, db, max_attempts=2, retry=lambda error, attempt: 0.0, operator=operator,
                       on_exhausted=told.append)

    def handler(update: Any) -> None:
        raise ValueError("bad \ud800 text")

    fence.handler(handler)
    api.push_message(5, "doomed")
    caplog.set_level(logging.WARNING, logger="telegram_fence")
    fence.start()
    try:
        assert eventually(lambda: told, timeout=15)
        assert eventually(lambda: operator.delivered + operator.failed >= 1, timeout=10)
    finally:
        stop(fence)
        operator.close(5)
    escaped = "ValueError: bad \\ud800 text"
    assert told[0].error.rstrip().endswith(escaped)
    [(error,)] = list(apsw.Connection(db).execute("SELECT error FROM fence_updates"))
    assert error.rstrip().endswith(escaped)
    assert (operator.delivered, operator.failed) == (1, 0)
    assert any(escaped in (s.text or "") for s in api.sent_to(999))
    lines = [r.getMessage() for r in caplog.records if r.name == "telegram_fence.workers"]
    assert any("will retry" in line and escaped in line for line in lines)
    assert any("exhausted" in line and escaped in line for line in lines)
    for text in (error_text(ValueError("\udfff")), error_line(ValueError("\udfff"))):
        text.encode("utf-8")  # any store and any log can keep it


class RenewBlocks(SqliteUpdateStore):
    """A real SQLite store whose renew_many, once ``hold`` is set, waits at ``gate`` (the heartbeat is mid-step)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.hold = False
        self.inside = threading.Event()
        self.gate = threading.Event()

    def renew_many(self, identities: Any, lease: float) -> set[Identity]:
        if self.hold:
            self.inside.set()
            self.gate.wait(10)
        return super().renew_many(identities, lease)


def test_a_stop_arriving_while_the_heartbeat_is_mid_step_still_ends_it(
    api: FakeBotAPI, bot: telebot.TeleBot, db: str
) -> None:
    """The pool's stop signal set while the heartbeat is inside a step (a renewal) is not lost: join returns True."""
    store = RenewBlocks(db)
    running, release = threading.Event(), threading.Event()

    def handler(update: Any) -> None:
        running.set()
        release.wait(10)

    fence = make_fence(bot, store, lease=0.6, workers=1)
    fence.handler(handler)
    api.push_message(5, "slow")
    fence.start()
    joined: list[bool] = []
    joiner = threading.Thread(target=lambda: joined.append(fence.join(10)), name="test-joiner")
    try:
        assert running.wait(10)
        store.hold = True
        assert store.inside.wait(10)  # the heartbeat is inside a renewal
        fence.stop()
        joiner.start()
        release.set()
        pool = fence._pool
        assert pool is not None
        assert eventually(pool.state.alarm.stopped)  # the pool's join told the heartbeat to stop ...
        store.gate.set()  # ... and only then does the heartbeat's step end
        joiner.join(15)
        assert joined == [True]
    finally:
        release.set()
        store.gate.set()
        if not joiner.is_alive() and not joined:
            stop(fence)
        store.close()
