"""A really damaged SQLite file (pages overwritten on disk): every store method raises ``StoreCorrupt``, never a raw
``apsw`` error, and a fence running on it ends with that reason instead of retrying forever."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import apsw
import pytest
import telebot
from store_helpers import claim_one

from telegram_fence import Fence, SqliteUpdateStore
from telegram_fence.errors import StoreCorrupt
from telegram_fence.store import Identity
from telegram_fence.testing import FakeBotAPI


def message(update_id: int, chat: int) -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {"message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"}, "text": "x" * 200},
    }


def written_file(path: Path) -> tuple[dict[str, int], int]:
    """A file of 500 recorded updates, checkpointed into the main file and closed: its root pages by name, and
    its page count."""
    with SqliteUpdateStore(path) as store:
        for batch in range(5):
            store.record([message(batch * 100 + i + 1, i % 7) for i in range(100)], batch * 100 + 101)
    conn = apsw.Connection(str(path))
    try:
        conn.pragma("wal_checkpoint(TRUNCATE)")
        roots = {  # tables and indexes (views and triggers have no pages)
            str(name): int(page)
            for name, page in conn.execute("SELECT name, rootpage FROM sqlite_schema WHERE rootpage > 0")
        }
        pages = int(conn.pragma("page_count"))
        size = int(conn.pragma("page_size"))
    finally:
        conn.close()
    assert size == 4096
    return roots, pages


def overwrite(path: Path, pages: Iterable[int]) -> None:
    """Overwrite each of ``pages`` (1-based) of the file on disk with bytes no SQLite page holds."""
    with open(path, "r+b") as file:
        for page in pages:
            skip = 100 if page == 1 else 0  # page 1 starts with the file header
            file.seek((page - 1) * 4096 + skip)
            file.write(b"\xa5" * (4096 - skip))


CALLS: dict[str, Callable[[SqliteUpdateStore], object]] = {
    "stats": lambda store: store.stats(),
    "exchange_one": lambda store: claim_one(store, 30.0),
    "next_offset": lambda store: store.next_offset(),
    "due_exhaustions": lambda store: store.due_exhaustions(),
    "record": lambda store: store.record([message(9001, 1)], 9002),
    "exchange": lambda store: store.exchange([], 30.0, 10),
    "owns": lambda store: store.owns(Identity(1, 1, "x")),
    "prune": lambda store: store.prune(1e12),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_store_method_on_a_damaged_file_raises_store_corrupt(tmp_path: Path, call: str) -> None:
    """With the root page of every table and index overwritten, each store method raises StoreCorrupt naming the
    file and what to do (restore from a backup), with APSW's error only as its cause."""
    path = tmp_path / "bot.db"
    roots, _pages = written_file(path)
    overwrite(path, sorted(set(roots.values())))
    with SqliteUpdateStore(path) as store, pytest.raises(StoreCorrupt) as caught:
        CALLS[call](store)
    assert str(path) in str(caught.value) and "restore it from a backup" in str(caught.value)
    assert isinstance(caught.value.__cause__, apsw.Error)


def test_one_overwritten_page_of_the_inbox_is_store_corrupt(tmp_path: Path) -> None:
    """One overwritten page (the inbox table's root) makes claims, stats and recording raise StoreCorrupt; the
    cursor, on a page of its own, still reads."""
    path = tmp_path / "bot.db"
    roots, _pages = written_file(path)
    overwrite(path, [roots["fence_updates"]])
    with SqliteUpdateStore(path) as store:
        for call in ("exchange_one", "stats", "record", "exchange"):
            with pytest.raises(StoreCorrupt):
                CALLS[call](store)
        assert store.next_offset() == 501


def test_a_file_whose_schema_page_is_overwritten_is_refused_at_open(tmp_path: Path) -> None:
    """A file whose first page (the schema) is overwritten is refused by the constructor with StoreCorrupt."""
    path = tmp_path / "bot.db"
    written_file(path)
    overwrite(path, [1])
    with pytest.raises(StoreCorrupt, match="restore it from a backup"):
        SqliteUpdateStore(path)


def test_a_fence_on_a_damaged_file_ends_with_the_reason(api: FakeBotAPI, tmp_path: Path) -> None:
    """A fence whose file has an overwritten page ends (run() returns 1, ended_reason names StoreCorrupt and the
    file) instead of logging "retrying" forever."""
    path = tmp_path / "bot.db"
    roots, _pages = written_file(path)
    overwrite(path, [roots["fence_updates"]])
    fence = Fence(telebot.TeleBot(api.token, threaded=False), str(path))
    fence.handler(lambda update: None)
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(fence.run()), name="test-fence-run")
    runner.start()
    runner.join(30)
    if runner.is_alive():  # pragma: no cover - the failure this test exists for
        fence.stop()
        runner.join(10)
    assert result == [1]
    reason = fence.ended_reason or ""
    assert "StoreCorrupt" in reason and str(path) in reason


@pytest.mark.parametrize("page", ["fence_meta", "fence_generations"])
@pytest.mark.parametrize("given", ["path", "store"])
def test_a_fence_started_on_a_file_whose_cursor_page_is_damaged_ends_with_the_reason(
    api: FakeBotAPI, tmp_path: Path, page: str, given: str
) -> None:
    """A file whose cursor (meta) or generations page is overwritten makes the fence end at start (run() returns 1,
    ended_reason names StoreCorrupt and the file) instead of raising out of run() (before: StoreCorrupt from
    start's next_offset or begin_generation)."""
    path = tmp_path / "bot.db"
    roots, _pages = written_file(path)
    overwrite(path, [roots[page]])
    store: Any = str(path) if given == "path" else SqliteUpdateStore(path)
    fence = Fence(telebot.TeleBot(api.token, threaded=False), store)
    fence.handler(lambda update: None)
    result: list[object] = []

    def run() -> None:
        try:
            result.append(fence.run())
        except BaseException as exc:  # the failure this test exists for
            result.append(exc)

    runner = threading.Thread(target=run, name="test-fence-run")
    runner.start()
    runner.join(30)
    if runner.is_alive():  # pragma: no cover - the failure this test exists for
        fence.stop()
        runner.join(10)
    if given == "store":
        store.close()
    assert result == [1]
    reason = fence.ended_reason or ""
    assert "StoreCorrupt" in reason and str(path) in reason


class CorruptOnRecord(SqliteUpdateStore):
    """A real SQLite store whose ``record`` reports a damaged database (the runtime's reaction is under test here;
    the store's own is proved on real damaged files above)."""

    def record(self, *args: Any, **kwargs: Any) -> int:
        raise StoreCorrupt("injected: database disk image is malformed")


def test_a_webhook_fence_started_on_a_damaged_file_ends_with_the_reason(api: FakeBotAPI, tmp_path: Path) -> None:
    """Behind the webhook door (webhook_app, then start), a file whose generations page is overwritten ends the
    fence at start with StoreCorrupt as its reason (before: start() raised it)."""
    path = tmp_path / "bot.db"
    roots, _pages = written_file(path)
    overwrite(path, [roots["fence_generations"]])
    fence = Fence(telebot.TeleBot(api.token, threaded=False), str(path))
    fence.handler(lambda update: None)
    fence.webhook_app("s" * 32)
    fence.start()
    try:
        assert "StoreCorrupt" in (fence.ended_reason or "")
    finally:
        fence.stop()
        assert fence.join(10)


def test_a_poller_that_cannot_record_ends_the_fence_instead_of_asking_again(api: FakeBotAPI, tmp_path: Path) -> None:
    """StoreCorrupt from recording a batch ends the fence with the poller's reason (run() returns 1) instead of
    asking Telegram for the same offset forever."""
    store = CorruptOnRecord(tmp_path / "bot.db")
    fence = Fence(telebot.TeleBot(api.token, threaded=False), store)
    fence.handler(lambda update: None)
    api.push_message(1, "hi")
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(fence.run()), name="test-fence-run")
    runner.start()
    runner.join(30)
    if runner.is_alive():  # pragma: no cover - the failure this test exists for
        fence.stop()
        runner.join(10)
    store.close()
    assert result == [1]
    assert "cannot record: StoreCorrupt: injected" in (fence.ended_reason or "")
