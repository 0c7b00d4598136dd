"""The conversations' answer a split round carries (bc97f20), under a running fence on a real PostgreSQL server: the
dispatcher's overlap opens the round's stamp before it sends the round, so a change a held claim's handler commits
while that round is in flight voids the round's "this chat has no conversation" for the chat's next update.

``tests/test_conversation_quiet.py`` pins the stamp's rule with its own copy of the overlap's steps; this pins the
overlap's. The interleaving is made certain by a wrapper of ``begin_round``: the round carrying the chat's second
message is read on the server (its conversations' statement has run) before any handler runs, and its answer is
handed to the overlap later, after the held ``/start`` handler registered its next step."""

from __future__ import annotations

from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, stop
from pg_support import DSN, fresh_tables, new_table, requires_pg

from telegram_fence.runtime import decisions, overlap
from telegram_fence.testing import FakeBotAPI

pytestmark = requires_pg

#: What the next-step callback saw: (chat, text); module level, so the step is kept by name.
STEPPED: list[tuple[int, str]] = []


def took_name(message: telebot.types.Message) -> None:
    STEPPED.append((message.chat.id, message.text or ""))


def test_a_next_step_a_held_claim_registers_while_the_next_round_is_in_flight_takes_the_next_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chat's '/start' is claimed and held (about to run inline) while the round recording and claiming its next
    message 'Ann' is in flight, and that round's own read finds no conversation in the chat ('/start' has not run
    yet). '/start' then registers a next-step handler: 'Ann' must go to it, not to the plain handler (a round stamped
    after its answer was read would keep "nothing stored" for the chat). Tried on new chats until once the
    dispatcher caught the poller's batch in time (the premise); every chat's 'Ann' must reach its step."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    # the handlers run inline on the dispatcher, which waits for the poller to fetch and for its next batch (sending
    # its round) before every run, also on a loaded host
    monkeypatch.setattr(decisions, "INLINE_MAX", 0.1)
    monkeypatch.setattr(decisions, "INLINE_CLIP", 0.2)
    monkeypatch.setattr(decisions, "INLINE_STALL", 5.0)
    monkeypatch.setattr(decisions, "FETCH_WAIT", 2.0)
    monkeypatch.setattr(decisions, "BATCH_WAIT", 2.0)
    monkeypatch.setattr(overlap, "PROBE_EVERY", 1)
    STEPPED.clear()
    plain: list[tuple[int, str]] = []
    # the rounds recording an 'Ann': chat -> (the claims they held, whether they asked about conversations)
    asked: dict[int, tuple[list[Any], bool]] = {}
    with fresh_tables() as made, FakeBotAPI(max_long_poll=0.3) as api:
        made.append(new_table("tf_overlap_conv"))
        store = PostgresUpdateStore(DSN, table=made[0], pool_size=4)
        begin, record_and_claim = store.begin_round, store.record_and_claim

        def messages(updates: Any) -> list[tuple[int, str]]:
            return [(u["message"]["chat"]["id"], u["message"].get("text")) for u in updates if "message" in u]

        def then_push(updates: Any) -> None:
            for chat, text in messages(updates):
                if text == "/start":  # recorded: the poller's next fetch brings the chat's 'Ann' at once
                    api.push_message(chat, "Ann")

        def recording(updates: Any, *args: Any, **kwargs: Any) -> Any:
            done = record_and_claim(updates, *args, **kwargs)
            then_push(updates)
            return done

        def beginning(settle: Any, updates: Any, *args: Any, **kwargs: Any) -> Any:
            pending = begin(settle, updates, *args, **kwargs)
            if pending is None:
                return None
            then_push(updates)
            chats = [chat for chat, text in messages(updates) if text == "Ann"]
            if not chats:
                return pending
            asked[chats[0]] = (list(kwargs.get("held", ())), bool(kwargs.get("conversations")))
            outcome = pending.result()  # read on the server now, before the held '/start' runs

            class Answered:
                def result(self) -> Any:
                    return outcome

            return Answered()

        store.record_and_claim = recording  # type: ignore[method-assign]
        store.begin_round = beginning  # type: ignore[method-assign]
        bot = telebot.TeleBot(api.token, threaded=False)

        @bot.message_handler(commands=["start"])
        def start(message: telebot.types.Message) -> None:
            bot.register_next_step_handler(message, took_name)

        @bot.message_handler(func=lambda message: True)
        def other(message: telebot.types.Message) -> None:
            plain.append((message.chat.id, message.text or ""))

        def premise(chat: int) -> bool:
            held, asks = asked.get(chat, ([], False))
            return asks and any(identity.update_id == starts[chat] for identity in held)

        fence = make_fence(bot, store, lease=10.0)
        fence.start()
        tried: list[int] = []
        starts: dict[int, int] = {}  # chat -> the update_id of its '/start'
        try:
            for chat in range(1, 9):  # handled and measured: the handlers run inline from now on
                api.push_message(chat, "warm")
            assert eventually(lambda: fence.stats()["settled"] >= 8, timeout=30)
            for chat in range(42, 48):  # until once the premise held (a slow poller can miss the dispatcher's wait)
                tried.append(chat)
                starts[chat] = api.push_message(chat, "/start")
                settled = 8 + 2 * len(tried)  # the warm ones, and each tried chat's '/start' and 'Ann'
                assert eventually(lambda n=settled: fence.stats()["settled"] >= n, timeout=30)
                if premise(chat):
                    break
        finally:
            stop(fence)
            store.close()
    assert any(premise(chat) for chat in tried), (
        f"the premise never held: no 'Ann' was recorded by a split round asking about conversations with its "
        f"chat's '/start' held ({asked})")
    assert [(chat, "Ann") for chat in tried] == STEPPED, f"an 'Ann' went to the plain handler: {plain}"
