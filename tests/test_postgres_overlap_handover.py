"""A dispatcher demoted while a round of its overlap is in flight (59c77d2) on a real PostgreSQL server: the round
is read by the new dispatcher's ``reclaim()``, never by the demoted thread, even when that thread comes back from its
stalled handler before the new dispatcher reaches its loop. The interleaving is made deterministic with events in
wrappers of ``Overlap.run`` and ``Overlap.reclaim`` (no sleeps decide who goes first)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pg_support import DSN, drop_tables, new_table, requires_pg, watch_rounds

pytestmark = requires_pg


def test_a_demoted_dispatcher_back_first_leaves_its_round_in_flight_to_the_new_dispatcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An inline handler stalls while a round its thread began is in flight; the new dispatcher is held at its first
    ``reclaim()`` until the demoted thread came back from the handler and left ``Overlap.run``: that round is still
    read once, on the new dispatcher's thread (its claims handed back), nothing of it on the demoted thread after the
    hand-over, and every update runs exactly once, each chat's in order."""
    import telebot
    from helpers import assert_each_once_in_chat_order, fence_through

    from telegram_fence.runtime import decisions
    from telegram_fence.runtime.exchange import Exchanger
    from telegram_fence.runtime.overlap import Overlap
    from telegram_fence.store.postgres import PostgresUpdateStore
    from telegram_fence.testing import FakeBotAPI

    monkeypatch.setattr(decisions, "BATCH_WAIT", 0.2)  # the next round is sent before a run begins, when it can be
    lock = threading.Lock()
    open_rounds: dict[threading.Thread, int] = {}  # rounds begun by a thread and not read yet
    reads: list[tuple[threading.Thread, threading.Thread, bool]] = []  # (began it, read it, after the stall)
    stalled = threading.Event()  # a handler stalls with a round of its thread in flight
    new_waits = threading.Event()  # the new dispatcher is at its first reclaim()
    old_left = threading.Event()  # the demoted thread came back from its handler and left Overlap.run
    demoted: list[threading.Thread] = []
    successor: list[threading.Thread] = []
    late_exchanges: list[str] = []  # exchanger calls on the demoted thread once it came back

    table = new_table("tf_overlap_handover")
    store = PostgresUpdateStore(str(DSN), table=table)

    def begun(began: threading.Thread) -> None:
        with lock:
            open_rounds[began] = open_rounds.get(began, 0) + 1

    def read(began: threading.Thread) -> None:
        with lock:
            open_rounds[began] -= 1
            reads.append((began, threading.current_thread(), stalled.is_set()))

    watch_rounds(store, read=read, begun=begun)

    real_run, real_reclaim = Overlap.run, Overlap.reclaim

    def run(self: Overlap, contexts: list[Any]) -> bool:
        seated = real_run(self, contexts)
        if demoted and threading.current_thread() is demoted[0]:
            old_left.set()
        return seated

    def reclaim(self: Overlap) -> None:
        if stalled.is_set() and threading.current_thread() is not demoted[0] and not new_waits.is_set():
            successor.append(threading.current_thread())
            new_waits.set()
            assert old_left.wait(20), "the demoted thread never left Overlap.run"
        real_reclaim(self)

    def spy(name: str) -> Any:
        real = getattr(Exchanger, name)

        def spied(self: Exchanger, *args: Any, **kwargs: Any) -> Any:
            if demoted and threading.current_thread() is demoted[0] and new_waits.is_set():
                late_exchanges.append(name)
            return real(self, *args, **kwargs)

        return spied

    monkeypatch.setattr(Overlap, "run", run)
    monkeypatch.setattr(Overlap, "reclaim", reclaim)
    for name in ("settled", "recorded", "offer", "exchange", "settle"):
        monkeypatch.setattr(Exchanger, name, spy(name))

    seen: dict[int, list[int]] = {}
    try:
        with FakeBotAPI(max_long_poll=0.3) as api:
            bot = telebot.TeleBot(api.token, threaded=False)

            @bot.message_handler(func=lambda m: True)
            def handle(message: Any) -> None:
                me = threading.current_thread()
                with lock:
                    stall = not stalled.is_set() and open_rounds.get(me, 0) > 0
                    if stall:
                        demoted.append(me)
                        stalled.set()
                if stall:  # held past INLINE_STALL until the new dispatcher waits at its reclaim()
                    assert new_waits.wait(20), "no new dispatcher took over"
                with lock:
                    seen.setdefault(message.chat.id, []).append(int(message.text.split()[-1]))

            with fence_through(api, bot, store, 2000, chats=10, lease=10.0) as fence:
                assert stalled.is_set(), "no handler ran with a round of its thread in flight"
                assert fence.stats()["workers"]["handovers"] >= 1
        assert old_left.is_set()
        old, new = demoted[0], successor[0]
        # the round the demoted thread had in flight was read once, by the new dispatcher; none on the demoted thread
        assert [(began, reader) for began, reader, late in reads if late and began is old] == [(old, new)]
        assert not [reader for _began, reader, late in reads if late and reader is old]
        assert open_rounds.get(old, 0) == 0
        assert late_exchanges == []
        assert_each_once_in_chat_order(seen, 2000)
    finally:
        store.close()
        drop_tables(table)
