"""The PostgreSQL store's split round (``begin_round`` → ``result``) on a real server: one transaction that settles,
records and claims; nothing visible before its answer is read; the chats of held claims counted as free and nothing
else; a failed round leaves nothing (the settles included); a lost leadership refuses the batch, not the settles;
the synchronous retries (payloads the server cannot read from the answer, prepared statements the session lost)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from pg_support import (
    DSN,
    drop_tables,
    fail_round_at_the_cursor_lock,
    new_table,
    pg_store,  # noqa: F401  (the store fixture)
    requires_pg,
    watch_rounds,
)

from telegram_fence.errors import LeadershipLost, StoreError
from telegram_fence.runtime import decisions
from telegram_fence.store import Identity, is_pipelined

pytestmark = requires_pg

LEASE = 30.0


def _keep_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep a trivial handler on the dispatcher's split round on a loaded host (CI runs four suites at once on two
    cores, where one preempted run of a trivial handler can take milliseconds): the tests that drop or refuse that
    round's answers need their updates to go through it, not through the workers, and no stall hand-over."""
    monkeypatch.setattr(decisions, "INLINE_MAX", 0.05)
    monkeypatch.setattr(decisions, "INLINE_CLIP", 0.1)
    monkeypatch.setattr(decisions, "INLINE_STALL", 5.0)

def _update(update_id: int, chat: int | None, text: str = "x") -> dict[str, Any]:
    message: dict[str, Any] = {"message_id": update_id, "date": 0, "text": text}
    if chat is not None:
        message["chat"] = {"id": chat, "type": "private"}
        return {"update_id": update_id, "message": message}
    return {"update_id": update_id, "poll": {"id": str(update_id)}}


def _answer(updates: list[dict[str, Any]]) -> bytes:
    return ('{"ok":true,"result":[' + ",".join(json.dumps(u) for u in updates) + "]}").encode()


def _states(store: Any) -> dict[int, int]:
    with store.read() as conn:
        return dict(conn.execute(f"SELECT update_id, state FROM {store.table}").fetchall())


def test_a_round_settles_records_and_claims_in_one_transaction_seen_only_once_read(store: Any) -> None:
    """The settles, the batch, the cursor and the claims at insert are one transaction, committed when ``result()``
    answers: another session sees none of it while the round may still be in flight."""
    assert is_pipelined(store)
    _new, (first,) = store.record_and_claim([_update(1, 7)], 2, lease=LEASE, limit=1)
    batch = [_update(2, 7), _update(3, 8), _update(4, None)]
    pending = store.begin_round([first.identity], batch, 5, lease=LEASE, limit=10, run=2, body=_answer(batch))
    assert pending is not None
    outcome = pending.result()
    assert (outcome.settled, outcome.new, outcome.refused) == (1, 3, None)
    assert [(c.update_id, c.attempt, c.update) for c in outcome.claims] == [(2, 1, batch[0]), (3, 1, batch[1]),
                                                                             (4, 1, batch[2])]
    assert _states(store) == {1: 2, 2: 1, 3: 1, 4: 1}
    assert store.next_offset() == 5
    assert store.owns(outcome.claims[0].identity)


def test_nothing_of_a_round_is_visible_before_its_commit(store: Any) -> None:
    """A round waiting for a lock (another session holds the cursor's row) has stored nothing for anyone else, and
    its answer comes once that lock is let go."""
    store.record([_update(1, 7)], 2)
    blocker = psycopg.connect(str(DSN))
    try:
        blocker.execute(f"SELECT * FROM {store.table}_meta WHERE key = 'cursor' FOR UPDATE")
        pending = store.begin_round([], [_update(2, 8)], 3, lease=LEASE, limit=5)
        assert pending is not None
        assert _states(store) == {1: 0}
        blocker.rollback()
        outcome = pending.result()
    finally:
        blocker.close()
    assert outcome.new == 1 and [c.update_id for c in outcome.claims] == [2]
    assert _states(store) == {1: 0, 2: 1}


def test_held_claims_free_their_chats_other_open_rows_do_not(store: Any) -> None:
    """A chat whose only open row is a held live claim yields its new update (claimed, to run after it); a chat with
    an open row not held (pending, or a claim not named) does not; a held claim that is no longer live (its lease
    lapsed) holds its chat again."""
    _new, claims = store.record_and_claim([_update(1, 7), _update(2, 8), _update(3, 9)], 4, lease=LEASE, limit=2)
    held_7, _held_8 = claims  # chat 8's claim is not named as held; chat 9's update 3 stays pending
    batch = [_update(10, 7), _update(11, 8), _update(12, 9), _update(13, 6)]
    pending = store.begin_round([], batch, 14, lease=LEASE, limit=10, run=4, held=[held_7.identity])
    assert pending is not None
    outcome = pending.result()
    assert [c.update_id for c in outcome.claims] == [10, 13]
    assert _states(store) == {1: 1, 2: 1, 3: 0, 10: 1, 11: 0, 12: 0, 13: 1}
    # the same hold, now that the held lease has lapsed: nothing of chat 7 is claimed
    with store.write() as conn:
        conn.execute(f"UPDATE {store.table} SET due_at = 1 WHERE update_id = 1")
    pending = store.begin_round([], [_update(20, 7)], 21, lease=LEASE, limit=10, run=4, held=[held_7.identity])
    assert pending is not None
    assert pending.result().claims == []


def test_a_failed_round_stores_nothing_not_even_its_settles(store: Any) -> None:
    """A round that fails on the server (here: its lock wait runs out) leaves the settles undone, the batch and the
    cursor unstored, and raises a StoreError; the store goes on working."""
    _new, (first,) = store.record_and_claim([_update(1, 7)], 2, lease=LEASE, limit=1)
    with store.write() as conn:  # a short lock_timeout for the pooled sessions
        conn.execute("SELECT 1")
    fail_round_at_the_cursor_lock(
        store, lambda: store.begin_round([first.identity], [_update(2, 8)], 3, lease=LEASE, limit=5))
    assert _states(store) == {1: 1}
    assert store.next_offset() == 2
    assert store.owns(first.identity)
    pending = store.begin_round([first.identity], [_update(2, 8)], 3, lease=LEASE, limit=5)
    assert pending is not None and pending.result().settled == 1


def test_a_lost_leadership_refuses_the_batch_but_keeps_the_settles(store: Any) -> None:
    """Once this store's poll leadership was taken by another epoch, the round's batch is not stored (``refused``
    says why) while its settles, fenced by their identities, are."""
    leadership = store.poll_leadership()
    assert leadership.acquire(5)
    try:
        _new, (first,) = store.record_and_claim([_update(1, 7)], 2, lease=LEASE, limit=1)
        pending = store.begin_round([], [_update(2, 8)], 3, lease=LEASE, limit=5)
        assert pending is not None and pending.result().new == 1
        with store.write() as conn:
            conn.execute(f"UPDATE {store.table}_leader SET epoch = epoch + 1")
        pending = store.begin_round([first.identity], [_update(3, 9)], 4, lease=LEASE, limit=5)
        assert pending is not None  # this process still believes it leads
        outcome = pending.result()
        assert isinstance(outcome.refused, LeadershipLost)
        assert (outcome.settled, outcome.new, outcome.claims) == (1, 0, [])
        assert _states(store) == {1: 2, 2: 1}
        assert store.next_offset() == 3
    finally:
        leadership.release()


def test_an_answer_the_server_cannot_read_is_recorded_from_the_encoded_payloads(store: Any) -> None:
    """A body the server refuses as JSON (an escaped lone surrogate) fails the script; the round is made again at
    once with the encoded payloads, in one transaction with its settles."""
    _new, (first,) = store.record_and_claim([_update(1, 7)], 2, lease=LEASE, limit=1)
    update = _update(2, 8, "\ud800")
    body = ('{"ok":true,"result":[' + json.dumps(update) + "]}").encode()
    pending = store.begin_round([first.identity], [update], 3, lease=LEASE, limit=5, body=body)
    assert pending is not None
    outcome = pending.result()
    assert (outcome.settled, outcome.new, [c.update_id for c in outcome.claims]) == (1, 1, [2])
    assert _states(store) == {1: 2, 2: 1}


def test_ids_stored_before_go_the_synchronous_way_and_keep_the_first_payload(store: Any) -> None:
    """A batch from the answer whose ids are stored already is refused by the one statement and recorded from the
    encoded payloads (the first payload kept, the conflict counted); its settles committed with the round."""
    _new, (first,) = store.record_and_claim([_update(1, 7, "a")], 2, lease=LEASE, limit=1)
    batch = [_update(1, 7, "b"), _update(2, 8)]
    pending = store.begin_round([first.identity], batch, 3, lease=LEASE, limit=5, body=_answer(batch))
    assert pending is not None
    outcome = pending.result()
    assert (outcome.settled, outcome.new, [c.update_id for c in outcome.claims]) == (1, 1, [2])
    assert store.stats()["payload_conflicts"] == 1


def test_a_session_that_lost_its_prepared_statements_runs_the_round_again(store: Any) -> None:
    """``DEALLOCATE ALL`` behind the store's back: the round fails on the server, learns what the session holds,
    and is made again (synchronously) with nothing doubled."""
    pending = store.begin_round([], [_update(1, 7)], 2, lease=LEASE, limit=5)
    assert pending is not None and pending.result().new == 1
    with store.read() as conn:  # the store's own pool of one session here? deallocate in every pooled session
        conn.execute("DEALLOCATE ALL")
    results = []
    for update_id in (2, 3, 4):
        pending = store.begin_round([], [_update(update_id, update_id)], update_id + 1, lease=LEASE, limit=5)
        assert pending is not None
        results.append(pending.result().new)
    assert results == [1, 1, 1]
    assert _states(store) == {1: 1, 2: 1, 3: 1, 4: 1}


def test_a_round_is_declined_where_it_cannot_run_alone(store: Any) -> None:
    """Inside a transaction of this thread, for an empty batch, or for an update that cannot be stored as it is,
    ``begin_round`` sends nothing and answers ``None`` (the caller makes the synchronous calls)."""
    with store.write():
        assert store.begin_round([], [_update(1, 7)], 2, lease=LEASE, limit=5) is None
    assert store.begin_round([], [], 2, lease=LEASE, limit=5) is None
    deep: dict[str, Any] = {"update_id": 3}
    inner = deep
    for _ in range(2000):
        inner["x"] = {}
        inner = inner["x"]
    assert store.begin_round([], [deep], 4, lease=LEASE, limit=5) is None
    assert _states(store) == {}
    pending = store.begin_round([Identity(9, 1, "x")], [_update(5, 7)], 6, lease=LEASE, limit=5)
    assert pending is not None
    assert pending.result().settled == 0  # (a stale identity settles nothing)
    with pytest.raises(RuntimeError):  # a result read twice is a caller's bug
        pending.result()


def test_a_fence_overlaps_its_rounds_with_inline_handlers_and_keeps_each_chats_order() -> None:
    """A fast handler on PostgreSQL: the rounds are begun while the inline handlers run (``begin_round`` is called
    with held claims and its rounds claim), every update is handled exactly once, and each chat's updates run in
    ``update_id`` order, never two of one chat at once; the poller fetches on the backlog and the cursor the rounds
    carried (it read the cursor from the store fewer times than it polled)."""
    import threading

    import telebot
    from helpers import assert_each_once_in_chat_order, fence_through

    from telegram_fence.store.postgres import PostgresUpdateStore
    from telegram_fence.testing import FakeBotAPI

    table = new_table("tf_overlap")
    store = PostgresUpdateStore(str(DSN), table=table)
    begun: list[tuple[int, int]] = []  # (held claims, claims the round took)
    begin = store.begin_round

    def counted(*args: Any, **kwargs: Any) -> Any:
        pending = begin(*args, **kwargs)
        if pending is None:
            return None
        held = len(kwargs.get("held", ()))

        class Counted:
            def result(self) -> Any:
                outcome = pending.result()
                begun.append((held, len(outcome.claims)))
                return outcome

        return Counted()

    store.begin_round = counted  # type: ignore[method-assign]
    reads: list[str] = []  # the poller's reads of the store's backlog and cursor

    def noting(name: str) -> Any:
        method = getattr(store, name)

        def read() -> Any:
            if threading.current_thread().name == "fence-poller":
                reads.append(name)
            return method()

        return read

    store.backlog = noting("backlog")  # type: ignore[method-assign]
    store.next_offset = noting("next_offset")  # type: ignore[method-assign]
    seen: dict[int, list[int]] = {}
    running: set[int] = set()
    overlapping: list[int] = []
    lock = threading.Lock()
    try:
        with FakeBotAPI(max_long_poll=0.3) as api:
            bot = telebot.TeleBot(api.token, threaded=False)

            @bot.message_handler(func=lambda m: True)
            def handle(message: Any) -> None:
                chat = message.chat.id
                with lock:
                    if chat in running:
                        overlapping.append(chat)
                    running.add(chat)
                    seen.setdefault(chat, []).append(int(message.text.split()[-1]))
                    running.discard(chat)

            with fence_through(api, bot, store, 3000, chats=20, lease=10.0) as fence:
                polls = fence.stats()["poller"]["polls"]
        assert_each_once_in_chat_order(seen, 3000)
        assert not overlapping
        assert any(held and took for held, took in begun), begun[:20]
        assert reads.count("next_offset") < polls, (reads.count("next_offset"), polls)
    finally:
        store.close()
        drop_tables(table)


def test_a_handler_stalling_while_a_round_is_in_flight_loses_nothing_and_keeps_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An inline handler stalls (the heartbeat hands the dispatcher's job to a new thread) while the next round is in
    flight: the new dispatcher reads that round, its claims are handed back, and every update still runs exactly
    once, each chat's in order."""
    import threading
    import time

    import telebot
    from helpers import assert_each_once_in_chat_order, fence_through

    from telegram_fence.runtime import decisions
    from telegram_fence.store.postgres import PostgresUpdateStore
    from telegram_fence.testing import FakeBotAPI

    # the next round is always sent before a run begins, also where the poller takes long to bring it (CI: four
    # suites on two cores)
    monkeypatch.setattr(decisions, "BATCH_WAIT", 2.0)
    # the handlers stay inline on a loaded host (CI runs four suites at once): the stall at 700 must meet a run of
    # the dispatcher's, with a round in flight, not a worker
    monkeypatch.setattr(decisions, "INLINE_MAX", 0.05)
    monkeypatch.setattr(decisions, "INLINE_CLIP", 0.1)
    table = new_table("tf_overlap")
    store = PostgresUpdateStore(str(DSN), table=table)
    moved: list[bool] = []  # per round read: whether another thread than the one that began it read it
    watch_rounds(store, read=lambda began: moved.append(threading.current_thread() is not began))
    seen: dict[int, list[int]] = {}
    lock = threading.Lock()
    try:
        with FakeBotAPI(max_long_poll=0.3) as api:
            bot = telebot.TeleBot(api.token, threaded=False)

            @bot.message_handler(func=lambda m: True)
            def handle(message: Any) -> None:
                number = int(message.text.split()[-1])
                if number in (700, 1400):
                    time.sleep(0.5)
                with lock:
                    seen.setdefault(message.chat.id, []).append(number)

            with fence_through(api, bot, store, 2000, chats=10, lease=10.0) as fence:
                assert fence.stats()["workers"]["handovers"] >= 1
        assert_each_once_in_chat_order(seen, 2000)
        assert any(moved), "no round was read by a new dispatcher"
    finally:
        store.close()
        drop_tables(table)


@pytest.mark.parametrize("pool_size", [1, 4])
def test_a_round_whose_connection_is_cut_in_flight_stores_nothing_and_the_store_goes_on(pool_size: int) -> None:
    """The server ends the round's session while the round waits for a lock (the connection is lost mid-round):
    ``result()`` raises a StoreError, nothing of the round stays (settles, batch, cursor), and the next round runs
    on a working session, also when the store's pool has only the one that was cut."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = new_table()
    store = PostgresUpdateStore(str(DSN), table=table, pool_size=pool_size)
    blocker = psycopg.connect(str(DSN))
    try:
        _new, (first,) = store.record_and_claim([_update(1, 7)], 2, lease=LEASE, limit=1)
        blocker.execute(f"SELECT * FROM {table}_meta WHERE key = 'cursor' FOR UPDATE")
        pending = store.begin_round([first.identity], [_update(2, 8)], 3, lease=LEASE, limit=5)
        assert pending is not None
        with psycopg.connect(str(DSN), autocommit=True) as killer:
            for _ in range(500):
                row = killer.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                     "WHERE wait_event_type = 'Lock' AND query LIKE %s",
                                     (f"%{table}%",)).fetchone()
                if row and row[0]:
                    break
                killer.execute("SELECT pg_sleep(0.01)")
            else:
                pytest.fail("the round never waited for the lock")
        with pytest.raises(StoreError):
            pending.result()
        blocker.rollback()
        assert _states(store) == {1: 1}
        assert store.next_offset() == 2
        assert store.owns(first.identity)
        again = store.begin_round([first.identity], [_update(2, 8)], 3, lease=LEASE, limit=5)
        assert again is not None
        outcome = again.result()
        assert (outcome.settled, outcome.new, [c.update_id for c in outcome.claims]) == (1, 1, [2])
        assert _states(store) == {1: 2, 2: 1} and store.next_offset() == 3
    finally:
        blocker.close()
        store.close()
        drop_tables(table)


def test_rounds_that_committed_but_whose_answers_were_lost_lose_nothing_and_run_nothing_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Some rounds commit on the server and their answer is lost (the connection fails as it is read): the fence
    takes such a round for failed (its batch fetched again, its settles made again), yet every update is handled
    exactly once and settled, each chat's in order: the batch is found stored, and the round's claims, never run
    here, are taken again after their lease."""
    import threading

    import telebot
    from helpers import assert_each_once_in_chat_order, fence_through

    from telegram_fence.errors import StoreUnavailable
    from telegram_fence.store.postgres import PostgresUpdateStore
    from telegram_fence.testing import FakeBotAPI

    _keep_inline(monkeypatch)
    table = new_table("tf_overlap")
    store = PostgresUpdateStore(str(DSN), table=table)
    begin = store.begin_round
    rounds: list[int] = []  # claims of each round whose answer was dropped
    lock = threading.Lock()

    def lossy(*args: Any, **kwargs: Any) -> Any:
        pending = begin(*args, **kwargs)
        if pending is None:
            return None

        class Lossy:
            def result(self) -> Any:
                outcome = pending.result()  # committed
                with lock:
                    if outcome.claims and len(rounds) < 3:
                        rounds.append(len(outcome.claims))
                        raise StoreUnavailable("round: the connection was lost (as the answer was read)")
                return outcome

        return Lossy()

    store.begin_round = lossy  # type: ignore[method-assign]
    seen: dict[int, list[int]] = {}
    try:
        with FakeBotAPI(max_long_poll=0.3) as api:
            bot = telebot.TeleBot(api.token, threaded=False)

            @bot.message_handler(func=lambda m: True)
            def handle(message: Any) -> None:
                with lock:
                    seen.setdefault(message.chat.id, []).append(int(message.text.split()[-1]))

            with fence_through(api, bot, store, 1500, chats=10, lease=6.0):
                pass
        # up to 3 are dropped; how many rounds still carry claims after the first drop depends on the host's speed
        # (that round's claims hold their chats until their lease ends), so one is the premise
        assert rounds, "no round's answer was dropped"
        assert_each_once_in_chat_order(seen, 1500)
    finally:
        store.close()
        drop_tables(table)


def test_a_stop_while_a_round_is_in_flight_ends_and_the_next_fence_finishes_the_work_once() -> None:
    """``fence.stop()`` while a split round waits on the server (a lock another session holds): the fence ends
    within its bound once the lock is let go, and a fence
    started afterwards on the same table handles every update not handled yet: each exactly once, in order per chat."""
    import threading

    import telebot
    from helpers import assert_each_once_in_chat_order, eventually

    from telegram_fence import Fence
    from telegram_fence.store.postgres import PostgresUpdateStore
    from telegram_fence.testing import FakeBotAPI

    table = new_table("tf_overlap")
    store = PostgresUpdateStore(str(DSN), table=table)
    blocker = psycopg.connect(str(DSN))
    begin = store.begin_round
    in_flight = threading.Event()

    def blocked(*args: Any, **kwargs: Any) -> Any:
        if not in_flight.is_set():  # the first round waits for the cursor's row, held by another session
            blocker.execute(f"SELECT * FROM {table}_meta WHERE key = 'cursor' FOR UPDATE")
        pending = begin(*args, **kwargs)
        if pending is not None:
            in_flight.set()
        return pending

    store.begin_round = blocked  # type: ignore[method-assign]
    seen: dict[int, list[int]] = {}
    lock = threading.Lock()

    def handle(message: Any) -> None:
        with lock:
            seen.setdefault(message.chat.id, []).append(int(message.text.split()[-1]))

    try:
        with FakeBotAPI(max_long_poll=0.3) as api:
            bot = telebot.TeleBot(api.token, threaded=False)
            bot.message_handler(func=lambda m: True)(handle)
            ids = api.push_messages(1500, chats=list(range(1, 11)))
            fence = Fence(bot, store, long_poll_timeout=0.3, lease=5.0, shutdown_timeout=3.0)
            fence.start()
            try:
                assert in_flight.wait(30), "no round was begun"
                stopping = threading.Thread(target=fence.stop, name="stopping")
                stopping.start()
                threading.Timer(1.0, blocker.rollback).start()
            finally:
                stopping.join(20)
                assert fence.join(20)
            store.close()
            store = PostgresUpdateStore(str(DSN), table=table)
            bot = telebot.TeleBot(api.token, threaded=False)
            bot.message_handler(func=lambda m: True)(handle)
            again = Fence(bot, store, long_poll_timeout=0.3, lease=5.0, shutdown_timeout=3.0)
            again.start()
            try:
                assert api.wait_confirmed(ids[-1] + 1, timeout=60)
                assert eventually(lambda: sum(len(v) for v in seen.values()) >= 1500, timeout=60)
            finally:
                again.stop()
                assert again.join(15)
        assert_each_once_in_chat_order(seen, 1500)
    finally:
        blocker.close()
        store.close()
        drop_tables(table)


def test_rounds_that_could_not_be_sent_lose_nothing_and_run_nothing_twice(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sending some rounds fails (``begin_round`` raises before anything reached the server): the fence answers
    the poller's request with the error (its batch is fetched again), keeps the finished attempts for a later
    round and logs the failure; every update is handled exactly once and settled, each chat's in order."""
    import logging
    import threading

    import telebot
    from helpers import assert_each_once_in_chat_order, fence_through

    from telegram_fence.errors import StoreUnavailable
    from telegram_fence.store.postgres import PostgresUpdateStore
    from telegram_fence.testing import FakeBotAPI

    _keep_inline(monkeypatch)
    table = new_table("tf_overlap")
    store = PostgresUpdateStore(str(DSN), table=table)
    begin = store.begin_round
    refused: list[int] = []  # settles each refused round carried
    lock = threading.Lock()

    def refusing(settle: Any, *args: Any, **kwargs: Any) -> Any:
        settle = list(settle)
        with lock:
            if settle and len(refused) < 3:
                refused.append(len(settle))
                raise StoreUnavailable("round: the server went away before the round was sent")
        return begin(settle, *args, **kwargs)

    store.begin_round = refusing  # type: ignore[method-assign]
    seen: dict[int, list[int]] = {}
    try:
        with caplog.at_level(logging.ERROR, logger="telegram_fence"), FakeBotAPI(max_long_poll=0.3) as api:
            bot = telebot.TeleBot(api.token, threaded=False)

            @bot.message_handler(func=lambda m: True)
            def handle(message: Any) -> None:
                with lock:
                    seen.setdefault(message.chat.id, []).append(int(message.text.split()[-1]))

            with fence_through(api, bot, store, 1500, chats=10, lease=10.0):
                pass
        assert len(refused) == 3, "no round was refused while it carried settles"
        assert_each_once_in_chat_order(seen, 1500)
        assert sum("could not begin a round" in r.getMessage() for r in caplog.records) == 3
    finally:
        store.close()
        drop_tables(table)
