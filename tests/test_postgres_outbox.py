"""The capture outbox and the operator channel with a Fence on PostgresUpdateStore."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import telebot
from helpers import eventually
from outbox_child import Collector, Reply, update
from pg_support import DSN, drop_tables, new_table, requires_pg

from telegram_fence import Fence, OperatorChannel
from telegram_fence.delivery.outbox import CaptureRule, Outbox
from telegram_fence.errors import CaptureConflict
from telegram_fence.testing import FakeBotAPI
from telegram_fence.testing.conformance import ManualClock

pytestmark = requires_pg


@pytest.fixture
def table() -> Iterator[str]:
    name = new_table("tf_outbox")
    yield name
    drop_tables(name)


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    yield server
    server.close()


def _store(table: str, **options: Any) -> Any:
    from telegram_fence.store.postgres import PostgresUpdateStore

    return PostgresUpdateStore(DSN, table=table, **options)


def _captures(store: Any) -> dict[str, tuple[str, int]]:
    with store.write() as conn:
        rows = conn.execute(f"SELECT key, state, attempts FROM {store.table}_outbox").fetchall()
    return {key: (state, attempts) for key, state, attempts in rows}


def test_outbox_on_postgres_captures_in_the_record_and_delivers(table: str, collector: Collector) -> None:
    """Captures are written in the record transaction, delivered, retried, failed and re-queued on PostgreSQL."""
    clock = ManualClock()
    store = _store(table, clock=clock)
    outbox = Outbox(store, collector.url, rule=CaptureRule(chats={1}), max_attempts=2, backoff=(1.0, 1.0))
    try:
        assert outbox.store.record([update(1, 1, "note"), update(2, 2)], 3, on_record=outbox.record_hook) == 2
        key = "telegram:1:1:10"
        assert _captures(store) == {key: ("pending", 0)}
        collector.answer(Reply(201, body='{"id":"c-1"}'))
        assert outbox.deliver_once() is True
        assert collector.received[0].headers["Idempotency-Key"] == key
        assert collector.received[0].json()["text"] == "note"
        assert _captures(store)[key] == ("delivered", 1)
        other = outbox.enqueue(update(3, 1))
        collector.default = Reply(503)
        for _ in range(2):
            assert outbox.deliver_once() is True
            clock.advance(1.0)
        assert _captures(store)[other] == ("failed", 2)
        assert outbox.requeue_failed([other]) == 1
        assert _captures(store)[other] == ("pending", 0)
        assert outbox.stats()["pending"] == 1
        with pytest.raises(CaptureConflict):
            outbox.store.record([update(4, 1), update(3, 1, "another text")], 5, on_record=outbox.record_hook)
        assert store.next_offset() == 3, "a refused capture moved the cursor"
        assert set(_captures(store)) == {key, other}
        clock.advance(10)
        assert outbox.prune(clock()) == 1
    finally:
        outbox.stop()
        store.close()


def test_fence_on_postgres_with_capture_outbox_and_operator_channel(table: str, collector: Collector) -> None:
    """A Fence on PostgreSQL captures and delivers every message of the captured chat, and tells the
    operator chat of an exhaustion."""
    store = _store(table)
    with FakeBotAPI(max_long_poll=0.3) as api:
        bot = telebot.TeleBot(api.token, threaded=False)
        outbox = Outbox(store, collector.url, rule=CaptureRule(chats={1}), recheck=0.2)
        operator = OperatorChannel(bot, 999)
        fence = Fence(bot, store, long_poll_timeout=0.3, lease=2.0, shutdown_timeout=3.0, max_attempts=1,
                      capture=outbox, operator=operator)
        fence.handler(lambda u: (_ for _ in ()).throw(RuntimeError("handler broke")) if u.message.text == "x"
                      else None)
        fence.start()
        try:
            ids = api.push_messages(20, chats=[1, 2])
            api.push_message(3, "x")
            assert collector.wait_for(10, timeout=30)
            assert eventually(lambda: any("exhausted" in (s.text or "") for s in api.sent_to(999)), timeout=20)
            assert eventually(lambda: outbox.stats()["delivered"] == 10, timeout=20)
            assert api.wait_confirmed(ids[-1] + 2, timeout=10)
        finally:
            fence.stop()
            assert fence.join(15)
            operator.close(5)
            store.close()
    delivered = sorted(json.loads(r.body)["update"]["update_id"] for r in collector.received)
    assert sorted(set(delivered)) == [i for i in ids if (i - ids[0]) % 2 == 0]
