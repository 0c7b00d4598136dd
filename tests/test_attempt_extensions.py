"""The attempt seam: extensions see every attempt begin and end, and write inside its fenced transactions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from store_helpers import claim_one

from telegram_fence import SqliteUpdateStore
from telegram_fence.runtime.attempt import AttemptContext, current_attempt, running


class Recorder:
    """An extension that records each hook and writes a row of its own inside each fenced transaction."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name = name
        self.log = log

    def begin(self, ctx: AttemptContext) -> None:
        self.log.append((self.name, f"begin {ctx.update_id} current={current_attempt() is ctx}"))

    def before_commit(self, ctx: AttemptContext, conn: Any, complete: bool) -> None:
        conn.execute("INSERT INTO ext_rows(name, update_id) VALUES (?, ?)", (self.name, ctx.update_id))
        self.log.append((self.name, f"before_commit complete={complete}"))

    def after_commit(self, ctx: AttemptContext, complete: bool) -> None:
        self.log.append((self.name, f"after_commit complete={complete}"))

    def end(self, ctx: AttemptContext, ok: bool) -> None:
        self.log.append((self.name, f"end ok={ok}"))


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SqliteUpdateStore(tmp_path / "bot.db")
    with s.write() as conn:
        conn.execute("CREATE TABLE ext_rows(name TEXT, update_id INTEGER)")
    yield s
    s.close()


def _claimed(store: Any, update_id: int) -> AttemptContext:
    store.record([{"update_id": update_id, "message": {"chat": {"id": update_id}, "text": "hi"}}], update_id + 1)
    claim = claim_one(store, 30.0)
    assert claim is not None and claim.identity.update_id == update_id
    return AttemptContext(store, claim)


def _rows(store: Any) -> list[tuple[str, int]]:
    with store.write() as conn:
        return [tuple(r) for r in conn.execute("SELECT name, update_id FROM ext_rows ORDER BY rowid")]


def test_hooks_run_in_order_and_writes_commit_with_the_transaction(store: Any) -> None:
    """begin, before_commit (inside the fenced transaction), after_commit and end run in the extensions' order."""
    log: list[tuple[str, str]] = []
    ctx = _claimed(store, 5)
    with running(ctx, (Recorder("a", log), Recorder("b", log))):
        assert current_attempt() is ctx
        with ctx.transaction(complete=True):
            pass
    assert current_attempt() is None
    assert log == [
        ("a", "begin 5 current=True"), ("b", "begin 5 current=True"),
        ("a", "before_commit complete=True"), ("b", "before_commit complete=True"),
        ("a", "after_commit complete=True"), ("b", "after_commit complete=True"),
        ("a", "end ok=True"), ("b", "end ok=True"),
    ]
    assert _rows(store) == [("a", 5), ("b", 5)]
    assert ctx.completed


def test_a_failed_block_ends_every_extension_with_ok_false_and_reraises(store: Any) -> None:
    """The handler's own error is re-raised after each extension was told the attempt failed."""
    log: list[tuple[str, str]] = []
    ctx = _claimed(store, 6)
    with pytest.raises(ValueError, match="boom"), running(ctx, (Recorder("a", log),)):
        raise ValueError("boom")
    assert log[-1] == ("a", "end ok=False")
    assert current_attempt() is None


def test_a_transaction_whose_body_raises_commits_nothing_of_the_extension(store: Any) -> None:
    """An extension's before_commit writes are undone with the caller's when the body raises."""
    log: list[tuple[str, str]] = []
    ctx = _claimed(store, 7)
    with running(ctx, (Recorder("a", log),)), pytest.raises(RuntimeError), ctx.transaction():
        raise RuntimeError("undo")
    assert _rows(store) == []
    assert ("a", "after_commit complete=False") not in log


def test_a_context_outside_running_has_no_extensions(store: Any) -> None:
    """A transaction of an attempt that is not the current one runs no extension hook."""
    log: list[tuple[str, str]] = []
    ctx = _claimed(store, 8)
    other = _claimed(store, 9)
    with running(other, (Recorder("a", log),)), ctx.transaction():
        pass
    assert [entry for entry in log if "commit" in entry[1]] == []
