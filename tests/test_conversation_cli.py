"""``telegram-fence states``: the conversations of a bot's database, read-only."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from pg_support import DSN, fresh_tables, new_table, requires_pg
from telebot import Handler

from telegram_fence import SqliteUpdateStore
from telegram_fence.cli.main import main
from telegram_fence.conversation import FenceHandlerBackend, FenceStateStorage
from telegram_fence.conversation.extension import Conversations


def ask_age(message: object, name: str) -> None:
    """A next-step callback kept by name."""


def _bot_db(tmp_path: Path) -> str:
    db = str(tmp_path / "bot.db")
    with SqliteUpdateStore(db) as store:
        conversations = Conversations(store)
        storage = FenceStateStorage(conversations)
        storage.set_state(42, 42, "MyStates:age", bot_id=7)
        storage.set_data(42, 42, "name", "Ann", bot_id=7)
        storage.set_state(-100, 5, "other")
        FenceHandlerBackend(conversations, "next_step").register_handler(42, Handler(ask_age, "Ann"))
    return db


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_states_lists_states_and_handlers_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Text output names each state with its data and each handler by its callback; the file is unchanged."""
    db = _bot_db(tmp_path)
    before = _digest(db)
    assert main(["states", db]) == 0
    out = capsys.readouterr().out
    assert "states: 2" in out and "chat 42 user 42 bot_id=7: 'MyStates:age' {\"name\": \"Ann\"}" in out
    assert f"next_step chat 42 #1: {__name__}:ask_age" in out
    assert _digest(db) == before and not os.path.exists(db + "-wal")


def test_states_json_and_one_chat(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints one object; --chat keeps only that chat's states and next-step handlers."""
    db = _bot_db(tmp_path)
    assert main(["states", db, "--chat", "-100", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(s["chat_id"], s["user_id"], s["state"]) for s in shown["states"]] == [(-100, 5, "other")]
    assert shown["handlers"] == []
    assert main(["states", db, "--chat", "42", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["states"][0]["data"] == {"name": "Ann"} and shown["states"][0]["bot_id"] == 7
    assert [h["callback"] for h in shown["handlers"]] == [f"{__name__}:ask_age"]


def test_states_refuses_what_is_not_a_fence_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing file or a foreign file: one line, exit 2, nothing created."""
    missing = str(tmp_path / "nope.db")
    assert main(["states", missing]) == 2
    assert "no database file there" in capsys.readouterr().err
    assert not os.path.exists(missing)
    foreign = tmp_path / "notes.txt"
    foreign.write_text("hello")
    assert main(["states", str(foreign)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("telegram-fence: ") and len(err.strip().splitlines()) == 1


@requires_pg
def test_states_reads_a_postgresql_database(capsys: pytest.CaptureFixture[str]) -> None:
    """With a connection string and --table, the same listing comes from the PostgreSQL tables (nothing created)."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    with fresh_tables() as made:
        made.append(new_table("tf_states_cli"))
        store = PostgresUpdateStore(DSN, table=made[0], pool_size=1)
        try:
            conversations = Conversations(store)
            FenceStateStorage(conversations).set_state(42, 42, "asked")
            FenceHandlerBackend(conversations, "reply").register_handler(99, Handler(ask_age, "Ann"))
        finally:
            store.close()
        assert main(["states", str(DSN), "--table", made[0], "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert [(s["chat_id"], s["state"]) for s in shown["states"]] == [(42, "asked")]
        assert [(h["kind"], h["group"]) for h in shown["handlers"]] == [("reply", "99")]
        assert main(["states", str(DSN), "--table", made[0] + "_absent"]) == 2
        assert capsys.readouterr().err.startswith("telegram-fence: ")
