"""A real Fence against hostile answers and a failing store: what an attacker or an unlucky operator can do.

Hostile bodies come from a scripted server (``hostile_api.HostileAPI``: replayed and out-of-order ids,
duplicate keys, lone surrogates, huge batches), on SQLite and, with ``TELEGRAM_FENCE_PG_DSN`` set, on
PostgreSQL; TLS from a front with a private CA made by ``openssl``; store errors from a real store (SQLite,
and PostgreSQL when configured) whose calls fail at random for a bounded time. Every test ends with the same promise:
each update handled exactly once, and the fence alive or ended with a reason.
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
import telebot
from helpers import eventually
from hostile_api import TOKEN, HostileAPI, answer, message
from pg_support import DSN, drop_tables, new_table, requires_pg
from tls_helpers import TlsFront, make_ca

from telegram_fence import Fence, SqliteUpdateStore, telegram
from telegram_fence.errors import StoreUnavailable
from telegram_fence.testing import FakeBotAPI


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_pg)])
def inbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The store a hostile-answer test runs its fence on: a SQLite file, or a PostgreSQL table (dropped after)."""
    if request.param == "sqlite":
        yield str(tmp_path / "bot.db")
        return
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = new_table("tf_adv")
    store = PostgresUpdateStore(DSN, table=table)
    try:
        yield store
    finally:
        store.close()
        drop_tables(table)


@pytest.fixture
def hostile() -> Iterator[HostileAPI]:
    with HostileAPI() as server, telegram.api_server(server.api_url):
        yield server


def make_fence(store: Any, token: str = TOKEN, **options: Any) -> Fence:
    options.setdefault("long_poll_timeout", 0.2)
    options.setdefault("lease", 2.0)
    options.setdefault("shutdown_timeout", 3.0)
    return Fence(telebot.TeleBot(token, threaded=False), store, **options)


class Ledger:
    """What the handler saw: update ids in the order handled, and per chat. Safe to share between threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: list[int] = []
        self.by_chat: dict[int, list[int]] = {}
        self.texts: dict[int, str | None] = {}

    def __call__(self, update: telebot.types.Update) -> None:
        with self.lock:
            self.ids.append(update.update_id)
            if update.message is not None:
                self.by_chat.setdefault(update.message.chat.id, []).append(update.update_id)
                self.texts[update.update_id] = update.message.text

    def count(self) -> int:
        with self.lock:
            return len(self.ids)


def run_until(fence: Fence, done: Any, timeout: float = 20.0) -> None:
    """Start ``fence``, wait for ``done()``, stop and join it; the fence must not have ended on its own."""
    fence.start()
    try:
        assert eventually(done, timeout=timeout), fence.stats()
        assert fence.ended_reason is None, fence.ended_reason
    finally:
        fence.stop()
        assert fence.join(15), "the fence did not shut down within its bound"


# --- hostile answers ------------------------------------------------------------------------------


def test_out_of_order_ids_are_each_handled_once_and_in_update_id_order_per_chat(
    hostile: HostileAPI, inbox: Any
) -> None:
    """An answer listing ids out of order: every update handled once, each chat's updates in update_id order."""
    ledger = Ledger()
    fence = make_fence(inbox)
    fence.handler(ledger)
    warm = list(range(1, 61))
    hostile.script(answer([message(i, chat_id=1 + i % 5) for i in warm]))
    fence.start()
    try:
        assert eventually(lambda: ledger.count() == len(warm))
        ids = [117, 111, 115, 112, 116, 113, 114, 110]
        hostile.script(answer([message(i, chat_id=1 + i % 2) for i in ids]))
        assert eventually(lambda: ledger.count() >= len(warm) + len(ids)), (ledger.count(), fence.stats())
        assert fence.ended_reason is None
    finally:
        fence.stop()
        assert fence.join(15)
    assert sorted(ledger.ids) == sorted(warm + ids)
    for chat, seen in ledger.by_chat.items():
        assert seen == sorted(seen), f"chat {chat} handled out of update_id order: {seen}"


def test_replayed_old_ids_are_never_handled_again(hostile: HostileAPI, inbox: Any) -> None:
    """A proxy replaying updates below the offset (after their rows were pruned) gets them dropped, not handled."""
    ledger = Ledger()
    fence = make_fence(inbox, retention=0.2)
    fence.handler(ledger)
    hostile.script(answer([message(1), message(2), message(3)]))
    fence.start()
    try:
        assert eventually(lambda: ledger.count() == 3)
        assert eventually(lambda: fence.stats()["settled"] == 0)  # pruned: only the cursor remembers them
        hostile.script(lambda offset: answer([message(1), message(2), message(3), message(offset)]),
                       lambda offset: answer([message(offset - 1), message(offset)]))
        # the cursor moves when 5 is recorded, before it is handled: wait for the handling too (a stop would hand
        # 5 back unhandled; this flaked once on a loaded machine)
        assert eventually(lambda: hostile.pending == 0 and fence.stats()["cursor"] == 6 and ledger.count() >= 5)
    finally:
        fence.stop()
        assert fence.join(15)
    assert ledger.ids == [1, 2, 3, 4, 5]


def test_an_answer_with_two_result_keys_never_moves_the_cursor_past_an_unstored_update(
    hostile: HostileAPI, tmp_path: Path
) -> None:
    """Duplicate "result" keys: whichever list is taken, the cursor passes only ids that were stored and handled.

    Python's json keeps the last "result" ([22, 23]), SQLite's reader the first ([20, 21]); the server then
    serves, as Telegram would, what is at or above the offset asked (22 and 30). Storing one list while
    moving the cursor past the other loses 22 for good.
    """
    ledger = Ledger()
    db = str(tmp_path / "bot.db")
    fence = make_fence(db)
    fence.handler(ledger)
    first = json.dumps([message(20), message(21, chat_id=2)])
    second = json.dumps([message(22), message(23, chat_id=2)])
    hostile.script(f'{{"ok":true,"result":{first},"result":{second}}}'.encode())
    hostile.hold((22, json.dumps(message(22)).encode()), (30, json.dumps(message(30)).encode()))
    run_until(fence, lambda: 30 in ledger.ids)
    with SqliteUpdateStore(db) as store:
        cursor = store.next_offset()
        with store.write() as conn:
            stored = {row[0] for row in conn.execute("SELECT update_id FROM fence_updates")}
    assert cursor == 31
    assert 22 in ledger.ids, f"the cursor passed update 22 but it was never stored: handled {ledger.ids}"
    assert Counter(ledger.ids).most_common(1)[0][1] == 1
    assert stored == set(ledger.ids)


def test_lone_surrogates_in_an_answer_do_not_stall_the_inbox(hostile: HostileAPI, inbox: Any) -> None:
    """A valid JSON answer with a lone surrogate escape is stored and handled; updates behind it are not blocked."""
    ledger = Ledger()
    fence = make_fence(inbox)
    fence.handler(ledger)
    poison = json.dumps(message(40, text="x")).replace('"x"', '"bad \\ud800 text"').encode()
    hostile.hold((40, poison), (41, json.dumps(message(41)).encode()), (42, json.dumps(message(42)).encode()))
    run_until(fence, lambda: 42 in ledger.ids)
    assert sorted(ledger.ids) == [40, 41, 42]
    assert ledger.texts[40] == "bad \ud800 text"


def test_lone_surrogates_are_stored_and_captured_through_telebots_path(
    hostile: HostileAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through telebot's request path (a proxy is configured) the dicts are encoded again: still no stall."""
    from telegram_fence.delivery.outbox import CaptureRule

    monkeypatch.setattr(telegram, "direct_polling_allowed", lambda: False)
    ledger = Ledger()
    db = str(tmp_path / "bot.db")
    fence = make_fence(db, capture=CaptureRule(chats={1}))
    fence.handler(ledger)
    poison = json.dumps(message(50, text="x")).replace('"x"', '"bad \\udfff"').encode()
    hostile.hold((50, poison), (51, json.dumps(message(51)).encode()))  # served again until confirmed
    run_until(fence, lambda: 51 in ledger.ids)
    assert sorted(ledger.ids) == [50, 51]
    with SqliteUpdateStore(db) as store, store.write() as conn:
        payloads = [json.loads(row[0]) for row in conn.execute("SELECT payload FROM fence_outbox ORDER BY update_id")]
    assert [p["text"] for p in payloads] == ["bad \udfff", "hi"]


@pytest.mark.parametrize("path", ["direct", "telebot"])
def test_an_update_nesting_too_deep_is_exhausted_and_the_updates_behind_it_are_handled(
    hostile: HostileAPI, inbox: Any, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """An update nesting 100000 levels deep (no JSON reader takes it whole) becomes an exhaustion holding only its
    update_id, told to on_exhausted; the updates behind it are handled once; the fence keeps running.
    """
    if path == "telebot":
        monkeypatch.setattr(telegram, "direct_polling_allowed", lambda: False)
    ledger = Ledger()
    told: list[Any] = []
    fence = make_fence(inbox, on_exhausted=told.append)
    fence.handler(ledger)
    depth = 100_000
    poison = b'{"update_id":60,"message":' + b"[" * depth + b"]" * depth + b"}"
    hostile.hold((60, poison), (61, json.dumps(message(61)).encode()), (62, json.dumps(message(62, 2)).encode()))
    # done once all three are settled and the next getUpdates confirmed them (it may follow the handlers a moment)
    run_until(fence, lambda: len(ledger.ids) >= 2 and told and max(hostile.offsets, default=0) >= 63)
    assert sorted(ledger.ids) == [61, 62]
    [exhaustion] = told
    assert exhaustion.identity.update_id == 60 and dict(exhaustion.update) == {"update_id": 60}
    assert "nests too deep" in exhaustion.error
    assert max(hostile.offsets) == 63  # confirmed: Telegram stops sending the poison


def test_a_huge_batch_is_handled_exactly_once(hostile: HostileAPI, inbox: Any) -> None:
    """100 updates of 100 KB each in one answer (10 MB) are stored and handled once each."""
    ledger = Ledger()
    fence = make_fence(inbox, lease=10.0)  # rounds of 10 MB on a loaded host: no lease lapses while they commit
    fence.handler(ledger)
    big = "é" * 50_000  # 100 KB of UTF-8 per update
    hostile.script(answer([message(100 + i, chat_id=1 + i % 7, text=big) for i in range(100)]))
    run_until(fence, lambda: ledger.count() >= 100 and hostile.pending == 0, timeout=60)
    assert sorted(ledger.ids) == list(range(100, 200))
    assert all(len(ledger.texts[i] or "") == len(big) for i in ledger.ids)


def test_a_tls_server_with_a_private_ca_and_a_broken_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a private CA (trusted through REQUESTS_CA_BUNDLE) with two getUpdates answers broken mid-TLS,
    every update is handled exactly once and the fence keeps running."""
    authority = make_ca(tmp_path / "ca")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(authority.ca))
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    ledger = Ledger()
    with FakeBotAPI(max_long_poll=0.2) as api, TlsFront(
        authority, api.port, break_after=("getUpdates",), times=2
    ) as front, telegram.api_server(front.api_url):
        ids = api.push_messages(30, chats=[1, 2, 3])
        fence = make_fence(str(tmp_path / "bot.db"), token=api.token)
        fence.handler(ledger)
        run_until(fence, lambda: ledger.count() >= 30 and len(front.broken) == 2)
    assert sorted(ledger.ids) == ids


# --- chaos: store errors from every background thread ----------------------------------------------

#: Store methods the fence's threads call (poller, dispatcher, workers, heartbeat, exhaustions, pruning).
CHAOS_METHODS = (
    "record", "next_offset", "mark_progress", "exchange", "settle_many", "retry_owned", "release", "renew_many",
    "owns", "transaction", "exhaust", "due_exhaustions",
    "acknowledge_exhaustion", "prune", "stats",
)


class Chaos:
    """A real store whose calls fail at random (StoreUnavailable, or on SQLite also apsw.BusyError, before any
    work is done) during a bounded window. Records which thread got which error. Mixed in before a backend's
    store class (see :func:`chaos_store`).

    :meth:`start_chaos` opens the window: at least ``least`` seconds, longer (never past ``most``) until
    each of ``required`` got at least one error: a thread name, or ``"method@thread"``.
    """

    def __init__(self, *args: Any, seed: int = 12, rate: float = 0.25, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rate = rate
        self.injected: Counter[tuple[str, str]] = Counter()
        self._least = self._most = 0.0
        self._threads: frozenset[str] = frozenset()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()

    def start_chaos(self, least: float, most: float, required: tuple[str, ...]) -> None:
        now = time.monotonic()
        self._least, self._most, self._threads = now + least, now + most, frozenset(required)

    def hit(self) -> set[str]:
        """Threads and ``method@thread`` pairs that got an error so far."""
        return {thread for _, thread in self.injected} | {f"{name}@{thread}" for name, thread in self.injected}

    def chaotic(self) -> bool:
        """Whether the window is still open."""
        now = time.monotonic()
        if now < self._least:
            return True
        return now < self._most and not self._threads <= self.hit()

    def chaos(self, name: str) -> None:
        if not self.chaotic():
            return
        with self._rng_lock:
            roll, kind = self._rng.random(), self._rng.random()
        if roll >= self.rate:
            return
        self.injected[(name, threading.current_thread().name)] += 1
        if kind < 0.5 or not isinstance(self, SqliteUpdateStore):
            raise StoreUnavailable(f"chaos: {name} found the database locked")
        raise apsw.BusyError(f"chaos: {name}: database is locked")


def _chaotic(base: type, name: str) -> Any:
    original = getattr(base, name)

    @functools.wraps(original)
    def method(self: Chaos, *args: Any, **kwargs: Any) -> Any:
        self.chaos(name)
        return original(self, *args, **kwargs)

    return method


def chaos_store(base: type) -> type:
    """``base`` (a store class) with every method of :data:`CHAOS_METHODS` it has failing at random."""
    cls = type(f"Chaos{base.__name__}", (Chaos, base), {})
    for name in CHAOS_METHODS:
        if hasattr(base, name):
            setattr(cls, name, _chaotic(base, name))
    return cls


def _fence_threads() -> dict[str, bool]:
    return {t.name: t.is_alive() for t in threading.enumerate() if t.name.startswith("fence-")}


class Doomed(Exception):
    """The handler's verdict on an update it can never handle: exhausted at once by the retry policy."""


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=requires_pg)])
def test_store_errors_at_random_in_every_thread_lose_nothing_and_double_nothing(tmp_path: Path, backend: str) -> None:
    """For 2 s or more (until the poller and acknowledge_exhaustion got theirs, at most 30 s) a quarter of all
    store calls fail with StoreUnavailable or BusyError, in every fence thread.

    Afterwards every update is handled exactly once (one domain row written with complete=True), every
    doomed update reached on_exhausted and was acknowledged, and the fence is still running with every
    thread alive: a store error is something each thread outlives.
    """
    if backend == "sqlite":
        store: Any = chaos_store(SqliteUpdateStore)(tmp_path / "bot.db")
        domain_table, mark, table = "domain", "?", None
    else:
        from telegram_fence.store.postgres import PostgresUpdateStore

        table = new_table("tf_chaos")
        store = chaos_store(PostgresUpdateStore)(DSN, table=table)
        domain_table, mark = f"{table}_domain", "%s"
    with store.write() as conn:
        conn.execute(f"CREATE TABLE {domain_table}(update_id INTEGER NOT NULL)")  # no UNIQUE: a double write shows
    told: set[int] = set()
    doomed: list[int] = []
    with FakeBotAPI(max_long_poll=0.2) as api, telegram.api_server(api.api_url):
        fence = make_fence(
            store, token=api.token, lease=1.0, max_attempts=1000, workers=3, retention=0.5,
            retry=lambda error, attempt: None if isinstance(error, Doomed) else 0.05,
            on_exhausted=lambda exhaustion: told.add(exhaustion.identity.update_id),
        )

        @fence.attempt_handler
        def handle(update: telebot.types.Update, ctx: Any) -> None:
            if update.message.text == "doomed":
                raise Doomed("this one can never be handled")
            with ctx.transaction(complete=True) as conn:
                conn.execute(f"INSERT INTO {domain_table}(update_id) VALUES ({mark})", (update.update_id,))

        ids = api.push_messages(60, chats=[1, 2, 3, 4, 5])
        doomed += [api.push_message(9 + i % 3, "doomed") for i in range(10)]
        fence.start()
        # at most 30 s: the exhaustion thread backs off after each failed read, so it acknowledges rarely (on the
        # dispatcher: the one writer does the acknowledgement)
        store.start_chaos(2.0, 30.0, ("fence-poller", "acknowledge_exhaustion@fence-dispatcher"))
        while store.chaotic():
            ids += api.push_messages(5, chats=[1, 2, 3, 4, 5, 6])
            doomed.append(api.push_message(9, "doomed"))
            threading.Event().wait(0.1)
        ids += api.push_messages(20, chats=[7, 8])
        doomed.append(api.push_message(9, "doomed"))

        def domain() -> Counter[int]:
            with store.write() as conn:
                return Counter(row[0] for row in conn.execute(f"SELECT update_id FROM {domain_table}"))

        def finished() -> bool:
            return (set(domain()) == set(ids) and told == set(doomed) and fence.stats()["exhausted"] == 0) or (
                fence.ended_reason is not None
            )

        try:
            eventually(finished, timeout=60)
            threads = _fence_threads()
            reason = fence.ended_reason
            stats = fence.stats()
            injected = store.hit()
        finally:
            fence.stop()
            assert fence.join(15)
        counts = domain()
    store.close()
    if table is not None:
        drop_tables(table)
    assert reason is None, f"the fence ended over errors it can outlive: {reason}"
    assert all(threads.values()) and {"fence-poller", "fence-heartbeat", "fence-exhaustions"} <= set(threads), threads
    assert set(counts) == set(ids), f"handled {len(counts)} of {len(ids)}: {stats}"
    assert [i for i, n in counts.items() if n != 1] == [], "an update was handled more than once"
    assert told == set(doomed), f"exhaustions never delivered: {sorted(set(doomed) - told)}"
    assert stats["exhausted"] == 0, "an exhaustion was never acknowledged"
    assert {"fence-poller", "acknowledge_exhaustion@fence-dispatcher"} <= injected, injected
    assert any(t.startswith("fence-worker") or t == "fence-dispatcher" for t in injected), injected
