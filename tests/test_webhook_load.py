"""Many concurrent deliveries into a real Fence's webhook app, handled by its workers."""

from __future__ import annotations

import json
import queue
import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import telebot
from helpers import eventually
from webhook_support import SECRET, TOKEN, post, update

from telegram_fence import Fence, SqliteUpdateStore
from telegram_fence.ingress.webhook import WsgiServer


def test_1000_deliveries_over_40_connections_with_duplicates_are_stored_and_handled_once(tmp_path: Path) -> None:
    """1,000 deliveries (10% duplicates) over 40 concurrent connections: each update stored once, handled once."""
    unique = list(range(1000, 1900))
    rng = random.Random(15)
    deliveries = unique + rng.sample(unique, 100)
    rng.shuffle(deliveries)
    handled: Counter[int] = Counter()
    lock = threading.Lock()
    fence = Fence(telebot.TeleBot(TOKEN, threaded=False), str(tmp_path / "bot.db"), workers=4, lease=5.0,
                  shutdown_timeout=5.0)

    @fence.handler
    def handle(u: Any) -> None:
        with lock:
            handled[u.update_id] += 1

    app = fence.webhook_app(SECRET)
    fence.start()
    server = WsgiServer(app, "127.0.0.1", 0)
    server.start()
    work: queue.Queue[int] = queue.Queue()
    for update_id in deliveries:
        work.put(update_id)
    statuses: Counter[int] = Counter()

    def client() -> None:
        while True:
            try:
                update_id = work.get_nowait()
            except queue.Empty:
                return
            status = post(server.port, json.dumps(update(update_id, chat=update_id % 37)))[0]
            with lock:
                statuses[status] += 1

    clients = [threading.Thread(target=client, name=f"client-{i}") for i in range(40)]
    try:
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(120)
        assert statuses == {200: 1000}
        assert eventually(lambda: sum(handled.values()) >= 900, timeout=60)
        assert eventually(lambda: fence.stats()["settled"] == 900, timeout=30)
        stats = fence.stats()
        assert stats["poller"] is None  # webhook mode: no getUpdates
        assert stats["webhook"]["intake"]["stored"] == 1000
    finally:
        server.stop()
        assert server.join(10)
        fence.stop()
        assert fence.join(15)
    assert set(handled) == set(unique)
    assert max(handled.values()) == 1
    with SqliteUpdateStore(tmp_path / "bot.db") as store:
        assert store.stats()["settled"] == 900
        assert store.next_offset() == 0
