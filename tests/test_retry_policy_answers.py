"""A retry policy that answers no delay (NaN, an infinity, a bool, no number) through a running fence, on SQLite and
on PostgreSQL: the failure is retried after ``POLICY_FALLBACK_DELAY`` with an error line naming the answer. Before,
an infinite delay left the update pending and never due: never retried, never exhausted, nothing said; NaN and False
retried at once,
and an answer that is no number was logged as "recording the retry failed" and left to the lease."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually
from pg_support import BACKENDS, store_of

from telegram_fence import Fence
from telegram_fence.runtime import outcomes
from telegram_fence.testing import FakeBotAPI


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with store_of(request.param, tmp_path, "tf_policy") as opened:
        yield opened


@pytest.mark.parametrize("answer", [math.inf, math.nan, "soon"], ids=repr)
def test_a_policy_answer_that_is_no_delay_is_named_and_the_update_retried_after_the_fallback(
    store: Any, answer: object, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The first attempt of an update fails and the policy answers ``answer``: an error line names it and the update
    is retried (its second attempt handles it); the chat's next update runs once, after it (docs/guarantees.md,
    "Per-chat order")."""
    monkeypatch.setattr(outcomes, "POLICY_FALLBACK_DELAY", 0.3)
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()
    with FakeBotAPI(max_long_poll=0.3) as api:
        fence = Fence(telebot.TeleBot(api.token, threaded=False), store, long_poll_timeout=0.3, lease=10.0,
                      shutdown_timeout=3.0, max_attempts=3, retry=lambda exc, attempt: answer)

        @fence.attempt_handler
        def handle(update: Any, ctx: Any) -> None:
            with lock:
                seen.append((update.message.text, ctx.attempt))
            if update.message.text == "flaky" and ctx.attempt == 1:
                raise RuntimeError("first try fails")

        api.push_message(1, "flaky")
        api.push_message(1, "after")
        with caplog.at_level(logging.ERROR, logger="telegram_fence"):
            fence.start()
            try:
                assert eventually(lambda: ("flaky", 2) in seen and ("after", 1) in seen, timeout=20), seen
            finally:
                fence.stop()
                assert fence.join(15)
    assert seen == [("flaky", 1), ("flaky", 2), ("after", 1)]
    assert any(f"the retry policy answered {answer!r}" in r.getMessage() for r in caplog.records)
