"""The streaming example of docs/steps.md, run as written against the fake Bot API with failures injected: a retry
sends no second placeholder and replays no streamed edit.

The block's code is executed (its last line, which runs the fence, left out); the test runs the fence itself.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import eventually, make_fence, stop
from telebot import apihelper

from telegram_fence import OwnershipLost, SqliteUpdateStore
from telegram_fence.calls.journal import list_calls
from telegram_fence.testing import FakeBotAPI

DOC = Path(__file__).resolve().parent.parent / "docs" / "steps.md"
FINAL = "You asked about hi. Here is a long answer, word by word."


def _example() -> str:
    """The streaming block of docs/steps.md without its last line (``sys.exit(Fence(...).run())``)."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    [block] = [b for b in blocks if "stream_answer" in b]
    lines = block.rstrip("\n").splitlines()
    assert lines[-1].startswith("sys.exit(Fence(bot,"), lines[-1]
    return "\n".join(lines[:-1]) + "\n"


@pytest.fixture
def example(api: FakeBotAPI, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The example's namespace, its bot pointed at ``api``; ``model_calls`` counts the model's streams."""
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", api.token)
    monkeypatch.setattr(apihelper, "API_URL", api.api_url)
    namespace: dict[str, Any] = {"__name__": "streaming_example"}
    exec(compile(_example(), str(DOC), "exec"), namespace)
    namespace["model_calls"] = []
    yield namespace


def _kinds(api: FakeBotAPI) -> list[tuple[str, str | None]]:
    return [(m.method, m.text) for m in api.sent]


def test_a_retry_after_the_answer_sends_nothing_again(api: FakeBotAPI, example: dict[str, Any], db: str) -> None:
    """The handler fails after its final edit: the retry replays the placeholder and the final edit from the
    journal, gets the text from the step, and the fake sees no call of it at all."""
    bot = example["bot"]
    entry = bot.message_handlers[0]
    original = entry["function"]
    failures: list[int] = []
    model = example["model_stream"]

    def counted_model(prompt: str) -> Iterator[str]:
        example["model_calls"].append(prompt)
        yield from model(prompt)

    def fails_once(message: Any) -> None:
        original(message)
        if not failures:
            failures.append(1)
            raise RuntimeError("the handler fails after its answer")

    example["model_stream"] = counted_model
    entry["function"] = fails_once
    fence = make_fence(bot, db, retry=lambda error, attempt: 0.0)
    fence.start()
    api.push_message(7, "hi")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
        calls = fence.stats()["calls"]
    finally:
        stop(fence)
    assert failures == [1] and example["model_calls"] == ["hi"]
    sent = _kinds(api)
    assert sent[0] == ("sendMessage", "…") and sent[-1] == ("editMessageText", FINAL)
    assert [kind for kind, _ in sent].count("sendMessage") == 1
    assert len(sent) == 1 + 3 + 1, sent  # the placeholder, three streamed edits, the final text: each once
    with SqliteUpdateStore(db) as store, store.read() as conn:
        journaled = [(row.method, row.state) for row in list_calls(conn)]
    assert journaled == [("sendMessage", "sent"), ("editMessageText", "sent")], "streamed edits are not journaled"
    assert calls["replayed"] == 2 and calls["sent"] == 2


def test_a_stream_cut_off_runs_again_into_the_same_placeholder(
    api: FakeBotAPI, example: dict[str, Any], db: str
) -> None:
    """The first attempt loses its update mid-stream: the next one finds the step uncertain and, as the example
    declares it safe to repeat, streams a new answer into the same placeholder; the final text is sent once, and
    the cut-off stream, resumed, sends nothing more (its next edit raises OwnershipLost unsent)."""
    bot = example["bot"]
    model = example["model_stream"]
    show = example["show"]
    cut = threading.Event()
    refused: list[BaseException] = []

    def stalling_model(prompt: str) -> Iterator[str]:
        example["model_calls"].append(prompt)
        first = len(example["model_calls"]) == 1
        for i, chunk in enumerate(model(prompt)):
            if first and i == 6:
                cut.wait(20)  # the stream stalls until the next attempt has answered
            yield chunk

    def watched_show(text: str, chat_id: int, message_id: int) -> None:
        try:
            show(text, chat_id, message_id)
        except OwnershipLost as exc:
            refused.append(exc)
            raise

    example["model_stream"] = stalling_model
    example["show"] = watched_show
    fence = make_fence(bot, db, handler_timeout=0.5, lease=1.0, workers=2)
    fence.start()
    api.push_message(7, "hi")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
        cut.set()
        assert eventually(lambda: bool(refused)), "the cut-off stream's next edit was not refused"
    finally:
        cut.set()
        stop(fence)
    assert example["model_calls"] == ["hi", "hi"]
    sent = _kinds(api)
    assert [kind for kind, _ in sent].count("sendMessage") == 1
    assert sent.count(("editMessageText", FINAL)) == 1 and sent[-1] == ("editMessageText", FINAL)
    assert len({m.message_id for m in api.sent}) == 1, "every edit went to the one placeholder"
