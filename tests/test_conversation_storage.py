"""Durable conversation state: telebot's state storage and handler backends in the store, fenced by attempts."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_support import DSN, fresh_tables, new_table, requires_pg
from store_helpers import claim_one
from telebot import Handler
from telebot.states import State, StatesGroup

from telegram_fence import OwnershipLost, SqliteUpdateStore
from telegram_fence.conversation import FenceHandlerBackend, FenceStateStorage
from telegram_fence.conversation.backends import prune_steps
from telegram_fence.conversation.extension import Conversations
from telegram_fence.conversation.sql import list_states, list_steps
from telegram_fence.errors import StateMissing, StateNotStorable
from telegram_fence.runtime.attempt import AttemptContext, running


class Steps(StatesGroup):
    name = State()
    age = State()


def module_level_step(message: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """A next-step callback that can be found again by name."""
    return (message, args, kwargs)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_pg)])
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Any]:
    """The store on each backend (PostgreSQL with tables of its own, dropped afterwards)."""
    if request.param == "sqlite":
        s = SqliteUpdateStore(tmp_path / "bot.db", clock=clock)
        yield s
        s.close()
        return
    from telegram_fence.store.postgres import PostgresUpdateStore

    with fresh_tables() as made:
        made.append(new_table("tf_states"))
        p = PostgresUpdateStore(DSN, table=made[0], clock=clock, pool_size=2)
        yield p
        p.close()


@pytest.fixture
def conversations(store: Any) -> Conversations:
    return Conversations(store)


@pytest.fixture
def storage(conversations: Conversations) -> FenceStateStorage:
    return FenceStateStorage(conversations)


@pytest.fixture
def steps(conversations: Conversations) -> FenceHandlerBackend:
    return FenceHandlerBackend(conversations, "next_step")


def _claimed(store: Any, update_id: int, chat_id: int = 5) -> AttemptContext:
    store.record([{"update_id": update_id, "message": {"chat": {"id": chat_id}, "text": "hi"}}], update_id + 1)
    claim = claim_one(store, 30.0)
    assert claim is not None and claim.identity.update_id == update_id
    return AttemptContext(store, claim)


def _stored(store: Any) -> list[tuple[Any, Any]]:
    with store.write() as conn:
        return [(row["state"], row["data"]) for row in list_states(conn)]


def test_outside_an_attempt_every_call_is_written_at_once(store: Any, storage: FenceStateStorage) -> None:
    """Without an attempt, set_state/set_data/save/reset_data/delete_state each commit on their own, as telebot's."""
    assert storage.get_state(1, 2) is None and storage.get_data(1, 2) == {}
    assert storage.set_state(1, 2, Steps.name) is True
    assert storage.get_state(1, 2) == "Steps:name"
    storage.set_data(1, 2, "name", "Ann")
    with storage.get_interactive_data(1, 2) as data:
        data["age"] = 30
    assert _stored(store) == [("Steps:name", {"name": "Ann", "age": 30})]
    assert storage.reset_data(1, 2) is True and storage.get_data(1, 2) == {}
    assert storage.delete_state(1, 2) is True and storage.delete_state(1, 2) is False
    assert _stored(store) == [] and storage.reset_data(1, 2) is False and storage.save(1, 2, {}) is False


def test_keys_are_telebots_parts(storage: FenceStateStorage) -> None:
    """Bot, business connection and message thread each make a different state; an absent part is left out."""
    storage.set_state(1, 2, "a")
    storage.set_state(1, 2, "b", bot_id=9)
    storage.set_state(1, 2, "c", message_thread_id=4, bot_id=9)
    storage.set_state(1, 2, "d", business_connection_id="bc", bot_id=9)
    assert [storage.get_state(1, 2), storage.get_state(1, 2, bot_id=9), storage.get_state(1, 2, None, 4, 9),
            storage.get_state(1, 2, "bc", None, 9), storage.get_state(1, 2, "", 0, 0)] == ["a", "b", "c", "d", "a"]
    storage.set_state(1, 3, 7)
    assert storage.get_state(1, 3) == 7  # an integer state comes back as an integer, so filters still match


def test_data_that_json_cannot_keep_is_refused_and_nothing_changes(storage: FenceStateStorage) -> None:
    """A value JSON would not give back unchanged raises StateNotStorable naming it; set_data without a state raises."""
    with pytest.raises(StateMissing, match="no state"):
        storage.set_data(1, 2, "k", "v")
    storage.set_state(1, 2, "s")
    storage.set_data(1, 2, "ok", [1, "two", None, {"x": 1.5}])
    for bad, what in (((1, 2), "tuple"), ({1, 2}, "set"), (float("nan"), "NaN"), ({3: "x"}, "key 3")):
        with pytest.raises(StateNotStorable, match=what):
            storage.set_data(1, 2, "bad", bad)
    with pytest.raises(StateNotStorable, match="chat_id"):
        storage.set_state("@channel", 2, "s")
    with pytest.raises(StateNotStorable, match="64-bit"):
        storage.set_state(2**70, 2, "s")
    assert storage.get_state(2**70, 2) is None and storage.get_data(2**70, 2) == {}  # a hostile id has no state
    assert storage.get_data(1, 2) == {"ok": [1, "two", None, {"x": 1.5}]}


def test_changes_inside_an_attempt_commit_with_its_settle(
    store: Any, conversations: Conversations, storage: FenceStateStorage
) -> None:
    """Inside an attempt reads see its own changes; nothing is in the database until the settle commits them."""
    ctx = _claimed(store, 10)
    with running(ctx, (conversations,)):
        storage.set_state(5, 5, Steps.name)
        storage.set_data(5, 5, "name", "Ann")
        assert storage.get_state(5, 5) == "Steps:name" and storage.get_data(5, 5) == {"name": "Ann"}
        assert _stored(store) == []
    assert ctx.completed  # committed with the settle
    assert _stored(store) == [("Steps:name", {"name": "Ann"})]
    assert claim_one(store, 30.0) is None  # settled: nothing left to claim


def test_a_handler_that_raises_leaves_the_old_state_for_its_retry(
    store: Any, conversations: Conversations, storage: FenceStateStorage
) -> None:
    """A state change made before the handler raised is dropped: the retry of the update sees the old state."""
    storage.set_state(5, 5, Steps.name)
    ctx = _claimed(store, 11)
    with pytest.raises(RuntimeError, match="boom"), running(ctx, (conversations,)):
        storage.set_state(5, 5, Steps.age)
        storage.set_data(5, 5, "name", "Ann")
        raise RuntimeError("boom")
    assert not ctx.completed
    assert store.retry_owned(ctx.identity, 0.0, "boom")
    retry = claim_one(store, 30.0)
    assert retry is not None and retry.attempt == 2
    ctx2 = AttemptContext(store, retry)
    with running(ctx2, (conversations,)):
        assert storage.get_state(5, 5) == "Steps:name" and storage.get_data(5, 5) == {}
    assert _stored(store) == [("Steps:name", {})]


def test_a_stale_attempts_state_change_never_lands(
    store: Any, clock: Clock, conversations: Conversations, storage: FenceStateStorage
) -> None:
    """An attempt whose lease lapsed and whose update was claimed again cannot commit its state change."""
    ctx = _claimed(store, 12)
    with pytest.raises(OwnershipLost), running(ctx, (conversations,)):
        storage.set_state(5, 5, "stale")
        clock.now += 31.0  # the lease lapsed ...
        again = claim_one(store, 30.0)  # ... and another worker took the update
        assert again is not None and again.attempt == 2
    assert _stored(store) == []
    ctx2 = AttemptContext(store, again)
    with running(ctx2, (conversations,)):
        storage.set_state(5, 5, "fresh")
    assert _stored(store) == [("fresh", {})]


def test_changes_join_the_handlers_own_fenced_transaction(
    store: Any, conversations: Conversations, storage: FenceStateStorage
) -> None:
    """A change made before ctx.transaction() commits with it; a transaction that raises keeps it pending."""
    ctx = _claimed(store, 13)
    with running(ctx, (conversations,)):
        storage.set_state(5, 5, "one")
        with ctx.transaction():
            assert storage.get_state(5, 5) == "one"
        assert _stored(store) == [("one", {})]
        storage.set_state(5, 5, "two")
        with pytest.raises(ValueError), ctx.transaction():
            raise ValueError("undo")
        assert _stored(store) == [("one", {})]
    assert _stored(store) == [("two", {})]


def test_after_the_update_was_settled_a_change_is_written_at_once(
    store: Any, conversations: Conversations, storage: FenceStateStorage
) -> None:
    """Once ctx.transaction(complete=True) settled the update, a later change is written through (no settle left)."""
    ctx = _claimed(store, 14)
    with running(ctx, (conversations,)):
        with ctx.transaction(complete=True):
            storage.set_state(5, 5, "with-settle")
        storage.set_state(5, 5, "after")
        assert _stored(store) == [("after", {})]


def test_next_step_handlers_are_kept_by_reference_and_taken_once(
    store: Any, conversations: Conversations, steps: FenceHandlerBackend
) -> None:
    """A module-level callback is stored by name with its pickled arguments; a new backend finds it again."""
    steps.register_handler(5, Handler(module_level_step, "Ann", age=30))
    with store.write() as conn:
        assert [s["callback"] for s in list_steps(conn)] == [f"{__name__}:module_level_step"]
    fresh = FenceHandlerBackend(Conversations(store), "next_step")  # as after a restart
    handlers = fresh.get_handlers(5)
    assert handlers is not None and len(handlers) == 1
    assert handlers[0]["callback"] is module_level_step
    assert handlers[0]["args"] == ("Ann",) and handlers[0]["kwargs"] == {"age": 30}
    assert fresh.get_handlers(5) is None


def test_a_taken_handler_comes_back_when_the_attempt_fails(
    store: Any, conversations: Conversations, steps: FenceHandlerBackend
) -> None:
    """Taking a chat's handlers inside an attempt that raises is undone: the retry takes them again."""
    steps.register_handler(5, Handler(module_level_step))
    ctx = _claimed(store, 15)
    with pytest.raises(RuntimeError), running(ctx, (conversations,)):
        assert steps.get_handlers(5) is not None
        assert steps.get_handlers(5) is None  # taken within the attempt
        raise RuntimeError("the step failed")
    assert steps.get_handlers(5) is not None


def test_a_lambda_is_kept_in_memory_and_said_once(
    store: Any, steps: FenceHandlerBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """A callback that has no name to find it by works in this process, is logged at INFO, and is gone after a
    restart with a WARNING."""
    callback = lambda message: message  # noqa: E731 - the case under test
    with caplog.at_level(logging.INFO, logger="telegram_fence.conversation"):
        steps.register_handler(5, Handler(callback))
        steps.register_handler(6, Handler(callback))
    assert sum("kept in this process only" in r.getMessage() for r in caplog.records) == 1
    handlers = steps.get_handlers(5)
    assert handlers is not None and handlers[0]["callback"] is callback
    fresh = FenceHandlerBackend(Conversations(store), "next_step")
    with caplog.at_level(logging.WARNING, logger="telegram_fence.conversation"):
        assert fresh.get_handlers(6) is None
    assert any("process that ended" in r.getMessage() for r in caplog.records)


def test_clear_handlers_and_pruning_old_registrations(store: Any, steps: FenceHandlerBackend) -> None:
    """clear_handlers removes a chat's handlers; prune_steps removes registrations older than its bound only."""
    steps.register_handler(5, Handler(module_level_step))
    steps.register_handler(6, Handler(module_level_step))
    steps.clear_handlers(5)
    assert steps.get_handlers(5) is None
    with store.write() as conn:
        (registered,) = [s["registered_at"] for s in list_steps(conn)]
    assert prune_steps(store, registered - 1) == 0
    assert prune_steps(store, registered + 1) == 1
    assert steps.get_handlers(6) is None


def test_a_message_reads_its_state_and_handlers_ahead_in_one_statement(store: Any) -> None:
    """At the start of a message's attempt the sender's state, the chat's next-step handlers and the reply handlers
    of the replied-to message are read at once; the attempt then answers from that read (a change another
    process commits meanwhile is not mixed in)."""
    conversations = Conversations(store, bot_id=77)
    storage = FenceStateStorage(conversations)
    steps = FenceHandlerBackend(conversations, "next_step")
    replies = FenceHandlerBackend(conversations, "reply")
    storage.set_state(5, 9, "asked", bot_id=77)
    steps.register_handler(5, Handler(module_level_step, "x"))
    steps.register_handler(5, Handler(module_level_step, "x2"))
    replies.register_handler(31, Handler(module_level_step, "y"))
    message = {"message_id": 32, "chat": {"id": 5}, "from": {"id": 9}, "text": "hi",
               "reply_to_message": {"message_id": 31, "chat": {"id": 5}}}
    store.record([{"update_id": 40, "message": message}], 41)
    claim = claim_one(store, 30.0)
    assert claim is not None
    ctx = AttemptContext(store, claim)
    other = FenceStateStorage(Conversations(store))  # another writer, outside any attempt
    with running(ctx, (conversations,)):
        other.set_state(5, 9, "changed-elsewhere", bot_id=77)
        assert storage.get_state(5, 9, bot_id=77) == "asked"
        taken = steps.get_handlers(5)
        assert taken is not None and [h["args"] for h in taken] == [("x",), ("x2",)]  # in registration order
        answered = replies.get_handlers(31)
        assert answered is not None and answered[0]["args"] == ("y",)
        storage.set_state(5, 9, "next", bot_id=77)
    assert storage.get_state(5, 9, bot_id=77) == "next"
    assert steps.get_handlers(5) is None and replies.get_handlers(31) is None


def test_the_fences_pruning_removes_only_registrations_past_their_bound(store: Any) -> None:
    """Housekeeping with conversations prunes handler registrations older than STEP_RETENTION, keeps newer ones,
    and never prunes states."""
    from telegram_fence.conversation.backends import STEP_RETENTION
    from telegram_fence.conversation.sql import rows
    from telegram_fence.runtime.heartbeat import Housekeeping

    conversations = Conversations(store)
    storage = FenceStateStorage(conversations)
    steps = FenceHandlerBackend(conversations, "next_step")
    storage.set_state(5, 5, "waits forever")
    steps.register_handler(5, Handler(module_level_step))
    steps.register_handler(6, Handler(module_level_step))
    with store.write() as conn:  # make chat 5's registration older than the bound
        rows(conn, f"UPDATE fence_steps SET registered_at = registered_at - {STEP_RETENTION + 60} "
                   "WHERE group_id = ?", ("5",))
    housekeeping = Housekeeping(store, retention=86400.0, long_poll=1.0, watchdog_margin=1.0,
                                captures=False, conversations=True, poller=lambda: None, stopping=lambda: False,
                                tell=lambda text: None, on_stuck=lambda reason: None,
                                log=logging.getLogger("test"))
    housekeeping.prune()
    with store.write() as conn:
        assert [s["group"] for s in list_steps(conn)] == ["6"]
    assert storage.get_state(5, 5) == "waits forever"


def test_a_failing_statement_is_a_store_error_on_every_backend(store: Any, storage: FenceStateStorage) -> None:
    """With the states table gone, a read and a write of a state raise the store's StoreError (never the driver's
    own exception), outside an attempt and inside one; nothing else is harmed once the table is back."""
    from telegram_fence import StoreError
    from telegram_fence.conversation.sql import rows

    ctx = _claimed(store, 16)
    table = "fence_states" if isinstance(store, SqliteUpdateStore) else f"{store.table}_states"
    with store.write() as conn:
        rows(conn, f"ALTER TABLE fence_states RENAME TO {table}_gone")
    with pytest.raises(StoreError):
        storage.get_state(5, 5)
    with pytest.raises(StoreError):
        storage.set_state(5, 5, "x")
    with pytest.raises(StoreError), running(ctx, (Conversations(store),)):
        FenceStateStorage(Conversations(store)).get_state(5, 5)
    with store.write() as conn:
        rows(conn, f"ALTER TABLE {table}_gone RENAME TO {table}")
    assert storage.set_state(5, 5, "back") and storage.get_state(5, 5) == "back"
