"""The poller against a scripted hostile Bot API server: replayed ids are dropped, the cursor never goes back."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually
from hostile_api import TOKEN, HostileAPI, answer, message

from telegram_fence import Fence, SqliteUpdateStore, telegram


@pytest.fixture
def hostile() -> Iterator[HostileAPI]:
    with HostileAPI() as server, telegram.api_server(server.api_url):
        yield server


def make_fence(store: Any, **options: Any) -> Fence:
    options.setdefault("long_poll_timeout", 0.2)
    options.setdefault("lease", 2.0)
    options.setdefault("shutdown_timeout", 3.0)
    return Fence(telebot.TeleBot(TOKEN, threaded=False), store, **options)


def test_updates_below_the_offset_sent_are_dropped_with_a_warning(
    hostile: HostileAPI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Items of an answer below the offset just sent (a replaying proxy) are dropped and counted in a warning, so
    an update whose settled row was pruned is never handled again."""
    caplog.set_level(logging.WARNING, logger="telegram_fence.poller")
    handled: list[int] = []
    fence = make_fence(str(tmp_path / "bot.db"), retention=0.2)
    fence.handler(lambda update: handled.append(update.update_id))
    hostile.script(answer([message(10), message(11)]))
    fence.start()
    try:
        assert eventually(lambda: handled == [10, 11])
        # Wait until both rows were settled and pruned: only the offset remembers them now.
        assert eventually(lambda: fence.stats()["settled"] == 0 and fence.stats()["cursor"] == 12)
        hostile.script(lambda offset: answer([message(10), message(11), message(offset)]))
        assert eventually(lambda: 12 in handled)
        assert eventually(lambda: hostile.pending == 0 and fence.stats()["cursor"] == 13)
    finally:
        fence.stop()
        assert fence.join(10)
    assert handled == [10, 11, 12]
    [warning] = [r for r in caplog.records if "below the offset" in r.getMessage()]
    assert (warning.offset, warning.dropped) == (12, 2)  # type: ignore[attr-defined]


class ForgetfulCursorStore(SqliteUpdateStore):
    """A real store whose next_offset always answers 0, as a store that lost (or never kept) its cursor."""

    def next_offset(self) -> int:
        return 0


def test_the_poller_never_asks_below_an_offset_it_recorded(hostile: HostileAPI, tmp_path: Path) -> None:
    """Whatever the store answers, the offset sent to getUpdates never goes back below what was recorded: a store
    answering a lower cursor does not make the poller ask Telegram for (and confirm) less than it recorded."""
    handled: list[int] = []
    store = ForgetfulCursorStore(tmp_path / "bot.db")
    fence = make_fence(store)
    fence.handler(lambda update: handled.append(update.update_id))
    hostile.script(answer([message(10), message(11)]), answer([message(12)]))
    fence.start()
    try:
        assert eventually(lambda: handled == [10, 11, 12])
        assert eventually(lambda: len(hostile.offsets) >= 4)
    finally:
        fence.stop()
        assert fence.join(10)
        store.close()
    asked = list(hostile.offsets)
    assert asked == sorted(asked), asked
    assert asked[0] == 0 and asked[1] == 12 and asked[-1] == 13


@pytest.mark.parametrize("retry_after", ["1000000000", "Infinity"])
def test_a_hostile_retry_after_is_waited_out_only_up_to_the_cap(
    hostile: HostileAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, retry_after: str
) -> None:
    """A 429 with a retry_after of decades (or infinity) is waited at most MAX_RETRY_AFTER_WAIT, then asked again.

    Before, the poller slept for the whole retry_after (a 1e9 s one parked it silently for decades, an
    infinite one crashed it with OverflowError).
    """
    from telegram_fence import retry

    monkeypatch.setattr(retry, "MAX_RETRY_AFTER_WAIT", 0.3)
    handled: list[int] = []
    fence = make_fence(str(tmp_path / "bot.db"))
    fence.handler(lambda update: handled.append(update.update_id))
    limited = f'{{"ok":false,"error_code":429,"description":"Too Many","parameters":{{"retry_after":{retry_after}}}}}'
    hostile.script(limited.encode(), answer([message(7)]))
    fence.start()
    try:
        assert eventually(lambda: handled == [7], timeout=10)
        assert fence.ended_reason is None
    finally:
        fence.stop()
        assert fence.join(10)


def test_update_ids_beyond_sqlite_integers_are_dropped_not_retried_forever(
    hostile: HostileAPI, tmp_path: Path
) -> None:
    """An item whose update_id no SQLite integer can hold is dropped (logged); the rest of the answer is handled.

    Before, recording the batch raised OverflowError on every try and the poller asked the same offset forever.
    """
    handled: list[int] = []
    fence = make_fence(str(tmp_path / "bot.db"))
    fence.handler(lambda update: handled.append(update.update_id))
    hostile.script(answer([message(5), message(2**63)]), answer([message(6)]))
    fence.start()
    try:
        assert eventually(lambda: handled == [5, 6], timeout=10)
        assert fence.stats()["cursor"] == 7
    finally:
        fence.stop()
        assert fence.join(10)


def test_a_server_that_cannot_be_reached_is_named_in_the_retry_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Bot API server that refuses connections (a closed port: a wrong TELEGRAM_API_URL, a firewall) is retried,
    and each warning names the host and port it was looked for at, never the token."""
    import socket

    from telebot import apihelper

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    previous = apihelper.API_URL
    apihelper.API_URL = f"http://127.0.0.1:{port}/bot{{0}}/{{1}}"
    caplog.set_level(logging.WARNING, logger="telegram_fence")
    fence = Fence(telebot.TeleBot(TOKEN, threaded=False), str(tmp_path / "bot.db"))
    try:
        fence.handler(lambda update: None)
        fence.start()
        assert eventually(lambda: any("failed; retrying" in r.getMessage() for r in caplog.records), timeout=10)
    finally:
        fence.stop()
        assert fence.join(10)
        apihelper.API_URL = previous
    lines = [r.getMessage() for r in caplog.records if "failed; retrying" in r.getMessage()]
    assert lines[0] == f"getUpdates at 127.0.0.1:{port} failed; retrying", lines
    assert all(TOKEN not in r.getMessage() and TOKEN.split(":")[1] not in str(r.__dict__) for r in caplog.records)


def test_a_poller_begins_its_generation_and_marks_it_alive_in_one_write(tmp_path: Path) -> None:
    """start() takes the new generation and marks its progress (a start is progress) as ONE write of the writer (one
    dispatcher round, where the fence's start waited for two), and the generation is marked alive."""
    import threading

    from telegram_fence.ingress.poller import Admission, Poller

    store = SqliteUpdateStore(tmp_path / "bot.db")
    writes: list[object] = []

    def write(fn: Any) -> Any:
        writes.append(fn)
        return fn()

    stop = threading.Event()
    stop.set()  # the thread ends at once: only start()'s writes are looked at
    poller = Poller(token=TOKEN, store=store, admission=Admission(), stop=stop, on_end=lambda reason: None,
                    record=store.record, write=write)
    try:
        poller.start()
        assert poller.join(5)
        assert len(writes) == 1
        generation = store.stats()["generation"]
        assert generation["generation"] == poller.generation == 1
        assert generation["progress_at"] is not None
    finally:
        store.close()


def test_a_batch_with_nothing_storable_is_asked_again_after_a_backoff(hostile: HostileAPI, tmp_path: Path) -> None:
    """Answers whose items are all unusable (no update_id) make the poller back off as after a failed record,
    not ask again at once: a broken proxy does not make it spin."""
    handled: list[int] = []
    fence = make_fence(str(tmp_path / "bot.db"))
    fence.handler(lambda update: handled.append(update.update_id))
    hostile.script(*[answer([{"message": {}}])] * 50)
    fence.start()
    try:
        assert eventually(lambda: hostile.pending < 50)
        time.sleep(0.6)  # backoffs of 0.25-0.5 s, then 0.5-1 s: at most three asks in this time
        assert hostile.pending >= 47, hostile.pending
        assert fence.ended_reason is None
    finally:
        fence.stop()
        assert fence.join(10)
    assert handled == []
