"""What users sent, printed by the command line: a lone surrogate (half an emoji, as Telegram can deliver it in a
JSON escape) is printed escaped, in text and in ``--json``, on both backends, and every row after it is listed.

Run as real subprocesses (``python -m telegram_fence``, stdout a pipe) on real SQLite files and real PostgreSQL
tables."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_support import DSN, requires_pg, store_of
from store_helpers import claim_one

from telegram_fence.calls.journal import Journal
from telegram_fence.conversation import FenceStateStorage
from telegram_fence.conversation.extension import Conversations

#: Half an emoji: what ``"\\ud83d"`` in an update's JSON decodes to.
HALF = "\ud83d"
#: A server's answer quoting it, as the journal keeps the body (the JSON text, escape and all).
ANSWER = json.dumps({"ok": False, "description": f"A{HALF}nn"})


def message(update_id: int, text: str) -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "text": text,
                                                "chat": {"id": 42, "type": "private"}}}


def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "telegram_fence", *args], capture_output=True, timeout=120)


def _fill(store: Any) -> None:
    """Two updates (the first holding the surrogate), an exhaustion whose error quotes it, a conversation whose
    data holds it (then one after it), and a journaled call whose answer quotes it."""
    store.record([message(1, f"A{HALF}nn"), message(2, "after")], 3)
    claim = claim_one(store, 30)
    assert claim is not None and claim.identity.update_id == 1
    store.exhaust(claim.identity, f"ValueError: bad name 'A{HALF}nn'")
    storage = FenceStateStorage(Conversations(store))
    storage.set_state(42, 42, "asked")
    storage.set_data(42, 42, "name", f"A{HALF}nn")
    storage.set_state(43, 43, "later")
    journal = Journal(store)
    assert journal.open_call(claim.identity, 1, "sendMessage", 42, "digest", settled=True) == (None, 0.0)
    journal.record(claim.identity, 1, "refused", 400, ANSWER)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_pg)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """The command-line arguments naming a filled database of each backend."""
    with store_of(request.param, tmp_path, "tf_cli_text") as store:
        _fill(store)
        if request.param == "sqlite":
            yield [str(tmp_path / "bot.db")]
        else:
            assert DSN is not None
            yield [DSN, "--table", store.table]


def _escaped(out: bytes) -> str:
    """The output, which must be valid UTF-8, with the surrogate shown as its escape."""
    text = out.decode("utf-8")
    assert "\\ud83d" in text
    return text


@pytest.mark.parametrize("command", [["states"], ["calls"], ["exhaustions"]])
def test_a_listing_prints_a_lone_surrogate_escaped_and_every_row_after_it(
    database: list[str], command: list[str]
) -> None:
    """states, calls and exhaustions print valid UTF-8 (the surrogate as ``\\ud83d``) and go on to the end."""
    result = cli(*command, *database)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    if command == ["states"]:
        text = _escaped(result.stdout)
        assert "chat 43 user 43: 'later'" in text and "handlers: 0" in text
    elif command == ["exhaustions"]:
        assert "1 unacknowledged exhaustion(s)" in _escaped(result.stdout)
    else:  # the text listing shows no answer: one row, each field of it
        assert result.stdout.decode("utf-8").splitlines()[-1] == "1 refused"


@pytest.mark.parametrize("command", [["states"], ["calls"], ["exhaustions"]])
def test_a_json_listing_gives_back_the_lone_surrogate(database: list[str], command: list[str]) -> None:
    """--json prints valid UTF-8 JSON from which the surrogate decodes back exactly as the user sent it."""
    result = cli(*command, *database, "--json")
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    shown = json.loads(_escaped(result.stdout))
    if command == ["states"]:
        assert [s["data"] for s in shown["states"]] == [{"name": f"A{HALF}nn"}, {}]
    elif command == ["calls"]:
        assert [json.loads(row["answer"])["description"] for row in shown] == [f"A{HALF}nn"]
    else:
        assert [row["update"]["message"]["text"] for row in shown] == [f"A{HALF}nn"]


def test_updates_and_show_print_a_lone_surrogate_escaped(database: list[str]) -> None:
    """updates lists both updates; show prints the update holding the surrogate, as text and as JSON."""
    where, options = database[0], database[1:]
    listed = cli("updates", where, *options)
    assert listed.returncode == 0 and "2 update(s) shown" in listed.stdout.decode("utf-8")
    shown = cli("show", where, "1", *options)
    assert shown.returncode == 0, shown.stderr.decode(errors="replace")
    assert "bad name 'A\\ud83dnn'" in _escaped(shown.stdout)
    as_json = cli("show", where, "1", *options, "--json")
    assert as_json.returncode == 0
    assert json.loads(_escaped(as_json.stdout))["update"]["message"]["text"] == f"A{HALF}nn"
