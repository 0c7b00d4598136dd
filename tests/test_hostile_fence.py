"""What Telegram never sends, fed through either door on each backend: the same outcome on SQLite and PostgreSQL,
and never a batch asked for again forever."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually
from hostile_api import TOKEN, HostileAPI, message
from pg_support import DSN, drop_tables, new_table
from store_helpers import claim_up_to
from webhook_support import SECRET, post

from telegram_fence import Exhaustion, Fence, telegram
from telegram_fence.ingress.webhook import WebhookIntake, WsgiServer

BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.skipif(DSN is None, reason="TELEGRAM_FENCE_PG_DSN is not set")),
]


@pytest.fixture
def hostile() -> Iterator[HostileAPI]:
    with HostileAPI() as server, telegram.api_server(server.api_url):
        yield server


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """What the fence runs on: a SQLite path, or a PostgreSQL store on a table of its own."""
    if request.param == "sqlite":
        yield str(tmp_path / "bot.db")
        return
    yield from _postgres()


@pytest.fixture(params=BACKENDS)
def store_object(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A store object of each backend."""
    if request.param == "sqlite":
        from telegram_fence import SqliteUpdateStore

        with SqliteUpdateStore(tmp_path / "hook.db") as sqlite:
            yield sqlite
        return
    yield from _postgres()


def _postgres() -> Iterator[Any]:
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = new_table("tf_hostile_door")
    postgres = PostgresUpdateStore(DSN, table=table)
    try:
        yield postgres
    finally:
        postgres.close()
        drop_tables(table)


def test_hostile_updates_in_one_answer_are_handled_or_exhausted_and_the_cursor_moves(
    hostile: HostileAPI, store: Any
) -> None:
    """One answer holding a lone surrogate, a NaN, a chat id beyond 64 bits and an update too deep to read: the
    first three are handled, the fourth reaches on_exhausted, the update behind them is handled, and the next
    getUpdates confirms them all; the fence keeps running."""
    handled: dict[int, Any] = {}
    lock = threading.Lock()

    def handler(update: telebot.types.Update) -> None:
        with lock:
            handled[update.update_id] = update.message.text if update.message is not None else None

    told: list[Exhaustion] = []
    fence = Fence(telebot.TeleBot(TOKEN, threaded=False), store, long_poll_timeout=0.2, lease=2.0,
                  shutdown_timeout=3.0, on_exhausted=told.append)
    fence.handler(handler)
    surrogate = json.dumps(message(40, text="x")).replace('"x"', '"bad \\ud800 text"')
    nan = json.dumps({**message(41), "extra": float("nan")})  # Python writes NaN, as a broken proxy might
    huge_chat = json.dumps(message(42, chat_id=2**70))
    deep = '{"update_id":43,"deep":' + "[" * 5000 + "]" * 5000 + "}"
    hostile.hold(*[(i, text.encode()) for i, text in ((40, surrogate), (41, nan), (42, huge_chat), (43, deep))],
                 (44, json.dumps(message(44)).encode()))
    fence.start()
    try:
        assert eventually(lambda: len(handled) == 4 and len(told) == 1 and max(hostile.offsets) >= 45, timeout=20), (
            handled, told, hostile.offsets[-3:], fence.stats()
        )
        assert fence.ended_reason is None
    finally:
        fence.stop()
        assert fence.join(15)
    assert sorted(handled) == [40, 41, 42, 44] and handled[40] == "bad \ud800 text"
    assert told[0].identity.update_id == 43 and dict(told[0].update) == {"update_id": 43}


def test_an_answer_holding_an_update_id_twice_keeps_the_first_counts_and_warns(
    hostile: HostileAPI, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Behind the polling door, one getUpdates answer holding an update id twice with different payloads: the
    first is handled once, stats() counts the conflict and a warning names the id."""
    handled: list[tuple[int, str]] = []
    fence = Fence(telebot.TeleBot(TOKEN, threaded=False), store, long_poll_timeout=0.2, lease=2.0,
                  shutdown_timeout=3.0)
    fence.handler(lambda update: handled.append((update.update_id, update.message.text)))
    hostile.hold((60, json.dumps(message(60, text="first")).encode()),
                 (60, json.dumps(message(60, text="second")).encode()),
                 (61, json.dumps(message(61)).encode()))
    with caplog.at_level(logging.WARNING, logger="telegram_fence.store"):
        fence.start()
        try:
            assert eventually(lambda: len(handled) == 2 and max(hostile.offsets) >= 62, timeout=20), handled
            assert fence.stats()["payload_conflicts"] == 1
        finally:
            fence.stop()
            assert fence.join(15)
    assert sorted(handled)[0] == (60, "first")
    assert any("update 60 recorded again with a different payload" in r.getMessage() for r in caplog.records)


def test_a_webhook_redelivery_with_another_payload_keeps_the_first_counts_and_warns(
    store_object: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Behind the webhook door, an update id delivered again with another payload is answered 200, the first
    payload is kept, stats() counts the conflict and a warning names the id."""
    app = WebhookIntake(store_object, SECRET)
    server = WsgiServer(app, "127.0.0.1", 0)
    server.start()
    try:
        with caplog.at_level(logging.WARNING, logger="telegram_fence.store"):
            first = post(server.port, json.dumps(message(70, text="first")).encode())
            again = post(server.port, json.dumps(message(70, text="second")).encode())
    finally:
        server.stop()
        assert server.join(10)
        assert app.close(10)
    assert first[0] == 200 and again[0] == 200
    assert store_object.stats()["payload_conflicts"] == 1
    assert any("update 70 recorded again with a different payload" in r.getMessage() for r in caplog.records)
    (claim,) = claim_up_to(store_object, 30.0, 5)
    assert claim.update["message"]["text"] == "first"
