"""The dispatcher round's one question about conversations: which claimed chats (and replied-to messages) have
anything stored. An attempt of a chat found empty answers telebot's per-message asks without reading; an answer is
never older than the claim it serves, and a change committed since in this process voids it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_support import DSN, fresh_tables, new_table, requires_pg
from store_helpers import settle_one
from telebot import Handler

from telegram_fence import SqliteUpdateStore, StoreError
from telegram_fence.conversation import FenceHandlerBackend, FenceStateStorage
from telegram_fence.conversation.extension import LIMIT, Conversations, QuietRounds
from telegram_fence.runtime.attempt import AttemptContext, running


def module_level_step(message: Any, *args: Any, **kwargs: Any) -> None:
    """A next-step callback that can be found again by name."""


class Host:
    """One host of a bot: its own store object (its own connections) on the shared database, its conversations."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.conversations = Conversations(store)
        self.states = FenceStateStorage(self.conversations)
        self.steps = FenceHandlerBackend(self.conversations, "next_step")
        self.replies = FenceHandlerBackend(self.conversations, "reply")

    def claim(self, limit: int = 16, chats: list[int] | None = None) -> list[AttemptContext]:
        """One dispatcher round: claim (the next update of each of ``chats``), then tell the conversations what was
        claimed, as the dispatcher does."""
        _settled, claims, _more = self.store.exchange([], 30.0, limit, chats=chats)
        contexts = [AttemptContext(self.store, claim) for claim in claims]
        self.conversations.claimed(contexts)
        return contexts


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_pg)])
def hosts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Host, Host]]:
    """Two hosts of one bot on each backend (SQLite: two store objects on one file)."""
    if request.param == "sqlite":
        a, b = SqliteUpdateStore(tmp_path / "bot.db"), SqliteUpdateStore(tmp_path / "bot.db")
        yield Host(a), Host(b)
        a.close()
        b.close()
        return
    from telegram_fence.store.postgres import PostgresUpdateStore

    with fresh_tables() as made:
        made.append(new_table("tf_quiet"))
        a = PostgresUpdateStore(DSN, table=made[0], pool_size=2)
        b = PostgresUpdateStore(DSN, table=made[0], pool_size=2)
        yield Host(a), Host(b)
        a.close()
        b.close()


def _message(update_id: int, chat: int, user: int | None = None, reply_to: int | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"},
                               "from": {"id": user or chat, "is_bot": False, "first_name": "u"}, "text": "hi"}
    if reply_to is not None:
        message["reply_to_message"] = {"message_id": reply_to, "date": 0, "chat": {"id": chat, "type": "private"}}
    return {"update_id": update_id, "message": message}


def _record(host: Host, *updates: dict[str, Any]) -> None:
    host.store.record(list(updates), max(u["update_id"] for u in updates) + 1)


def _settle(host: Host, ctx: AttemptContext) -> None:
    """What the dispatcher does for an attempt that returned with nothing of its own to commit."""
    assert not ctx.completed and settle_one(host.store, ctx.identity)


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[Host, list[str]]]:
    """A SQLite host whose thread's connection reports every statement it runs."""
    store = SqliteUpdateStore(tmp_path / "traced.db")
    seen: list[str] = []
    with store.read() as conn:
        conn.exec_trace = lambda _cursor, sql, _bindings: seen.append(sql) or True
    yield Host(store), seen
    store.close()


def _dispatch(host: Host, ctx: AttemptContext, chat: int, user: int, replied: int | None = None) -> Any:
    """What telebot's dispatch of a message asks, inside the attempt."""
    with running(ctx, (host.conversations,)):
        steps = host.steps.get_handlers(chat)
        replies = host.replies.get_handlers(replied) if replied is not None else None
        state = host.states.get_state(chat, user)
        data = host.states.get_data(chat, user)
    return steps, replies, state, data


def test_a_quiet_chat_runs_no_statement_for_telebots_asks(traced: tuple[Host, list[str]]) -> None:
    """After the round found chat 5 (and message 3 it replies to) empty, telebot's asks (next-step handlers, reply
    handlers, the sender's state and data) run no statement; an attempt no round announced reads (the control)."""
    host, seen = traced
    _record(host, _message(10, 5, 9, reply_to=3))
    (ctx,) = host.claim()
    seen.clear()
    assert _dispatch(host, ctx, 5, 9, replied=3) == (None, None, None, {})
    assert seen == []
    _settle(host, ctx)
    _record(host, _message(11, 5, 9))
    _settled, claims, _more = host.store.exchange([], 30.0, 1)
    unannounced = AttemptContext(host.store, claims[0])  # never passed to claimed(): reads as before
    seen.clear()
    assert _dispatch(host, unannounced, 5, 9) == (None, None, None, {})
    assert seen != []


def test_the_round_asks_once_for_all_its_claims(traced: tuple[Host, list[str]]) -> None:
    """Claims of 20 chats cost the conversations one statement for the whole round."""
    host, seen = traced
    _record(host, *(_message(100 + i, 1000 + i) for i in range(20)))
    seen.clear()
    contexts = host.claim(limit=20)
    assert len(contexts) == 20
    assert sum("fence_states" in sql or "fence_steps" in sql for sql in seen) == 1


@pytest.mark.parametrize("b_first", ["ran", "handed back"])
def test_an_update_claimed_after_another_host_registered_a_step_finds_it(
    hosts: tuple[Host, Host], b_first: str
) -> None:
    """Host B found chat 7 empty for update 19 (and ran it, or handed it back unstarted, leaving its answer unused);
    host A then handled update 20 (or 19), registering a next-step handler and a state that committed with its
    settle; B's next claim of chat 7 finds both: B's earlier answer does not count for it."""
    a, b = hosts
    _record(a, _message(19, 7, 9), _message(20, 7, 9), _message(21, 7, 9))
    (first,) = b.claim()
    if b_first == "ran":
        assert _dispatch(b, first, 7, 9) == (None, None, None, {})
        _settle(b, first)
    else:
        assert b.store.release(first.identity, attempt_counts=False)
    (second,) = a.claim()
    with running(second, (a.conversations,)):
        assert a.steps.get_handlers(7) is None
        a.steps.register_handler(7, Handler(module_level_step, "age"))
        a.states.set_state(7, 9, "asked")
    assert second.completed  # committed with the settle
    (third,) = b.claim()
    assert third.update_id == second.update_id + 1
    steps, _replies, state, _data = _dispatch(b, third, 7, 9)
    assert steps is not None and [h["args"] for h in steps] == [("age",)]
    assert state == "asked"


def test_a_change_made_for_another_chat_in_this_process_voids_its_answer(hosts: tuple[Host, Host]) -> None:
    """Updates of chats 40 and 41 claimed in one round, both empty: the handler of 40 sets a state in chat 41 and
    registers a reply handler for message 77; then 41's update, replying to 77, sees both."""
    host, _other = hosts
    _record(host, _message(50, 40, 9), _message(51, 41, 9, reply_to=77))
    first, second = host.claim()
    with running(first, (host.conversations,)):
        host.states.set_state(41, 9, "told-from-40")
        host.replies.register_handler(77, Handler(module_level_step, "reply"))
    steps, replies, state, _data = _dispatch(host, second, 41, 9, replied=77)
    assert steps is None and state == "told-from-40"
    assert replies is not None and [h["args"] for h in replies] == [("reply",)]


def test_a_busy_chat_reads_as_before(hosts: tuple[Host, Host]) -> None:
    """A chat with a state stored (set outside any attempt) is found busy: its update reads its state and data, and
    a chat replying to a message with a reply handler waiting takes it."""
    host, _other = hosts
    host.states.set_state(60, 9, "known")
    host.states.set_data(60, 9, "name", "Ann")
    host.replies.register_handler(88, Handler(module_level_step, "r"))
    _record(host, _message(70, 60, 9), _message(71, 61, 9, reply_to=88))
    first, second = host.claim()
    assert _dispatch(host, first, 60, 9) == (None, None, "known", {"name": "Ann"})
    _steps, replies, state, _data = _dispatch(host, second, 61, 9, replied=88)
    assert state is None and replies is not None and [h["args"] for h in replies] == [("r",)]


def test_a_failed_round_question_leaves_no_answer_behind(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """When the round's statement fails, an earlier answer for the chat no longer counts (the attempt reads, and
    here fails too, as the table is gone), and the failure is said once at WARNING."""
    store = SqliteUpdateStore(tmp_path / "bot.db")
    host = Host(store)
    _record(host, _message(80, 5), _message(81, 5))
    (first,) = host.claim()
    _settle(host, first)
    with store.write() as conn:
        conn.execute("ALTER TABLE fence_steps RENAME TO fence_steps_gone")
    with caplog.at_level(logging.WARNING, logger="telegram_fence.conversation"):
        (second,) = host.claim()
        host.claim()  # nothing to claim: nothing asked, nothing said
    assert [r.levelno for r in caplog.records if "claimed chats" in r.getMessage()] == [logging.WARNING]
    with pytest.raises(StoreError):
        _dispatch(host, second, 5, 5)
    store.close()


def test_quiet_rounds_answers_table() -> None:
    """The bookkeeping as plain values: the round's claim of a chat takes its answer once; an answer holds until a
    change is noted in or after its round; a later round's answer replaces it, a failed round forgets it, and too
    many noted changes void every answer."""
    quiet = QuietRounds()
    assert not quiet.take_chat(1)
    one = quiet.open_round()
    quiet.touched([1], [])  # committed while round one's read was under way: round one may not have seen it
    quiet.answered(one, {1, 2, 3}, {3}, {50}, set())
    assert [quiet.take_chat(chat) for chat in (1, 2, 3)] == [False, True, False]
    assert not quiet.take_chat(2)  # taken: a claim no round announced reads
    assert quiet.reply_is_empty(50) and not quiet.reply_is_empty(51)
    two = quiet.open_round()
    quiet.answered(two, {1, 2}, set(), set(), set())
    quiet.touched([2], [50])
    assert quiet.take_chat(1)  # round two's read came after the change noted in round one
    assert not quiet.take_chat(2) and not quiet.reply_is_empty(50)
    three = quiet.open_round()
    quiet.answered(three, {4, 5}, set(), set(), set())
    quiet.failed([4], [])
    assert not quiet.take_chat(4)
    quiet.touched(range(10_000, 10_001 + LIMIT), [])  # more than LIMIT noted: dropped, every answer void
    assert not quiet.take_chat(5)
    four = quiet.open_round()
    quiet.answered(four, {5}, set(), set(), set())
    assert quiet.take_chat(5)


def test_a_callback_query_answers_from_its_messages_chat(traced: tuple[Host, list[str]]) -> None:
    """A callback query belongs to its message's chat: in chat 90 (a state stored) it reads the sender's state; in
    chat 91 (nothing stored) a state= filter's ask runs no statement."""
    host, seen = traced
    host.states.set_state(90, 9, "picking")

    def query(update_id: int, chat: int) -> dict[str, Any]:
        message = {"message_id": 1, "date": 0, "chat": {"id": chat, "type": "private"}, "text": "pick"}
        return {"update_id": update_id, "callback_query": {"id": str(update_id), "chat_instance": "x", "data": "a",
                                                           "from": {"id": 9, "is_bot": False, "first_name": "u"},
                                                           "message": message}}

    _record(host, query(200, 90), query(201, 91))
    busy, quiet = host.claim()
    with running(busy, (host.conversations,)):
        assert host.states.get_state(90, 9) == "picking"
    seen.clear()
    with running(quiet, (host.conversations,)):
        assert host.states.get_state(91, 9) is None and host.states.get_data(91, 9) == {}
    assert seen == []
