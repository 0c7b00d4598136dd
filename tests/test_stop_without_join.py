"""A fence that is stopped but never joined still ends every thread it started, once no handler runs: the pool
(its workers, the heartbeat, then the dispatcher's last round) and the threads the join would end (the call
journal's resend thread, the capture outbox, the webhook intake's committer and watch); only the ``metrics=``
server answers until the join (``/livez`` says why a fence ended).

Real fences on real SQLite files against the fake Bot API over HTTP; the threads are the process's own
(``threading.enumerate``), waited for within a bound.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import telebot
from helpers import eventually, make_fence, webhook_deliverer

from telegram_fence import CaptureRule, Outbox, SqliteUpdateStore
from telegram_fence.testing import FakeBotAPI


def fence_threads() -> list[str]:
    """The names of the fence threads alive in this process."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("fence-") and t.is_alive())


def stored_states(path: Path) -> dict[str, int]:
    """The update counts by state, read through a store of its own (what another process would see)."""
    with SqliteUpdateStore(path) as store:
        stats = store.stats()
    return {state: int(stats[state]) for state in ("pending", "claimed", "settled")}


def test_a_polling_fence_stopped_but_never_joined_ends_every_thread_after_its_last_handler(
    tmp_path: Path,
) -> None:
    """Stopped while a handler runs (metrics served, captures on, calls journaled), without ``join()``: the
    threads stay while that handler runs (its lease kept), then every ``fence-`` thread but ``fence-metrics``
    ends within a bound and the handler's update is settled by the dispatcher's last round; ``/livez`` still
    answers (503: not live), and a later ``join()`` returns ``True`` and ends the metrics server too."""
    db = tmp_path / "bot.db"
    store = SqliteUpdateStore(db)
    started, release = threading.Event(), threading.Event()
    with FakeBotAPI(max_long_poll=0.3) as api:
        bot = telebot.TeleBot(api.token, threaded=False)
        fence = make_fence(bot, store, workers=2, metrics=("127.0.0.1", 0),
                           capture=Outbox(store, "http://127.0.0.1:9/c", rule=CaptureRule(chats={2})))

        @fence.handler
        def handle(update: telebot.types.Update) -> None:
            if update.message.text == "slow":
                started.set()
                assert release.wait(10)

        fence.start()
        try:
            api.push_message(1, "hi")
            assert eventually(lambda: fence.stats()["settled"] == 1)
            api.push_message(3, "slow")
            assert started.wait(10)
            assert {"fence-dispatcher", "fence-heartbeat", "fence-metrics", "fence-outbox",
                    "fence-calls-resend"} <= set(fence_threads()), fence_threads()
            fence.stop()
            settle = threading.Event()
            settle.wait(0.3)
            assert "fence-heartbeat" in fence_threads()  # the handler still runs: its lease is still kept
            release.set()
            assert eventually(lambda: fence_threads() == ["fence-metrics"], timeout=10), fence_threads()
            assert stored_states(db) == {"pending": 0, "claimed": 0, "settled": 2}
            assert fence.metrics_url is not None
            with pytest.raises(urllib.error.HTTPError) as answer:  # answered: not live (its threads ended)
                urllib.request.urlopen(fence.metrics_url + "/livez", timeout=5)
            assert answer.value.code == 503, answer.value
        finally:
            release.set()
            fence.stop()
            assert fence.join(10)
        assert fence_threads() == []
    store.close()


def test_a_webhook_fence_stopped_but_never_joined_ends_its_threads_and_answers_503(
    tmp_path: Path,
) -> None:
    """A fence serving ``webhook_app``, stopped without ``join()``: its watch (and any committer) ends with the pool,
    and a later delivery is answered 503 (Telegram delivers it again), nothing stored of it."""
    db = tmp_path / "bot.db"
    secret = "stop-without-join-secret"
    with FakeBotAPI(max_long_poll=0.3) as api:
        fence = make_fence(telebot.TeleBot(api.token, threaded=False), str(db), workers=1)
        fence.handler(lambda update: None)
        app = fence.webhook_app(secret)

        deliver = webhook_deliverer(app, secret)
        fence.start()
        try:
            assert deliver(1).startswith("200")
            assert eventually(lambda: fence.stats()["settled"] == 1)
            assert {"fence-dispatcher", "fence-webhook-watch"} <= set(fence_threads()), fence_threads()
            fence.stop()
            assert eventually(lambda: not fence_threads(), timeout=10), fence_threads()
            assert deliver(2).startswith("503")
        finally:
            fence.stop()
            assert fence.join(10)
    assert stored_states(db)["settled"] == 1 and stored_states(db)["pending"] == 0
