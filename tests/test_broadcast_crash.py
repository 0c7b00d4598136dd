"""Broadcast crash tests: a child process is SIGKILLed at random moments and resumed; nobody gets the message twice.

The fake Bot API server runs in this process; the child (tests/broadcast_child.py) points telebot at it.
Short form by default (>= 10 kills over 3,000 recipients, no rate limit); TF_SOAK=1 raises both
(TF_SOAK_KILLS, TF_SOAK_RECIPIENTS override them).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from telegram_fence.delivery.broadcast import JOURNAL_FILE, Broadcast
from telegram_fence.delivery.broadcast_journal import FAILED, PENDING, SENT, UNCERTAIN, replay
from telegram_fence.errors import BroadcastLocked

pytestmark = pytest.mark.drill

CHILD = str(Path(__file__).with_name("broadcast_child.py"))
SOAK = os.environ.get("TF_SOAK") == "1"
RECIPIENTS = int(os.environ.get("TF_SOAK_RECIPIENTS", 20_000 if SOAK else 3_000))
KILLS = int(os.environ.get("TF_SOAK_KILLS", 60 if SOAK else 12))


def spawn(api: Any, directory: Path, name: str, rate: str = "inf") -> subprocess.Popen[str]:
    env = dict(os.environ, TELEGRAM_BOT_TOKEN=api.token, NO_PROXY="127.0.0.1,localhost")
    return subprocess.Popen(
        [sys.executable, CHILD, api.api_url, str(directory), name, rate],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )


def kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, dict[str, Any]]:
    out, err = proc.communicate(timeout=timeout)
    last = out.strip().splitlines()[-1] if out.strip() else "{}"
    assert proc.returncode in (0, 1), f"child failed ({proc.returncode}): {err[-2000:]}"
    return proc.returncode, json.loads(last)


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` passes (for files, which have no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def journal_text(directory: Path, name: str) -> str:
    return (directory / name / JOURNAL_FILE).read_text()


@pytest.mark.soak
def test_sigkill_at_random_moments_never_sends_twice(tmp_path: Path, fake_bot_api: Any) -> None:
    """Killed >= 10 times mid-run and resumed, the broadcast sends each chat at most once and decides everyone."""
    api = fake_bot_api
    seed = int(os.environ.get("TF_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    seed_note = f"(TF_SEED={seed}, audience {RECIPIENTS}, kills {KILLS}; kill timing is not fully reproducible)"
    audience = [(-1_000_000_000_000 - i) if i % 10 == 0 else 50_000 + i for i in range(RECIPIENTS)]
    for chat in rng.sample(audience, RECIPIENTS // 25):
        api.block(chat)
    for chat in rng.sample(audience, RECIPIENTS // 100):
        api.deactivate(chat)
    for chat in rng.sample(audience, RECIPIENTS // 100):
        api.forget_chat(chat)
    Broadcast(None, tmp_path, "soak").create(audience, "Big news: *everyone* gets this once.", parse_mode="Markdown")

    kills = 0
    step = max(2, RECIPIENTS // (KILLS + 2))
    while kills < KILLS:
        proc = spawn(api, tmp_path, "soak")
        if rng.random() < 0.25:
            # Kill during start-up, replay or recovery: a random moment within the child's first 0.35 s.
            time.sleep(rng.uniform(0, 0.35))
        else:
            target = len(api.calls) + rng.randint(1, step)
            api.wait_for(lambda target=target, proc=proc: len(api.calls) >= target or proc.poll() is not None, 60)
            time.sleep(rng.uniform(0, 0.002))  # the randomised kill moment, not a wait for an event
        finished = proc.poll() is not None
        kill(proc)
        assert not finished or proc.returncode in (0, 1), f"child crashed on its own {seed_note}"
        kills += 1
        if finished:
            break
    code, last = finish(spawn(api, tmp_path, "soak"), timeout=300)  # the rest of the audience; a hang guard only
    assert code == 0, f"final run halted: {last} {seed_note}"

    report = Broadcast(None, tmp_path, "soak").status()
    assert kills >= min(KILLS, 10), seed_note
    assert report.sent + report.failed_total + report.uncertain == RECIPIENTS, seed_note
    assert report.pending == report.in_flight == 0
    assert report.uncertain <= kills, seed_note
    assert report.failed_total > 0 and report.sent > 0

    delivered = Counter(s.chat_id for s in api.sent)
    attempted = Counter(int(c.params["chat_id"]) for c in api.calls_to("sendMessage"))
    assert max(delivered.values()) == 1, f"a chat got the message twice {seed_note}"
    assert max(attempted.values()) == 1, f"a chat was sent to twice {seed_note}"

    state = replay((tmp_path / "soak" / JOURNAL_FILE).read_bytes(), audience)
    for index, chat in enumerate(audience):
        status = state.states[index]
        assert status != PENDING
        if status == SENT:
            assert delivered[chat] == 1, (chat, seed_note)
        elif status == FAILED:
            assert delivered[chat] == 0, (chat, seed_note)
        else:
            assert status == UNCERTAIN and delivered[chat] <= 1
    assert sum(delivered.values()) >= report.sent


def test_kill_during_retry_after_wait_keeps_recipient_pending(tmp_path: Path, fake_bot_api: Any) -> None:
    """A child killed while waiting out a 429 leaves the recipient pending (not uncertain); the resume still waits."""
    api = fake_bot_api
    api.fail("sendMessage", 429, retry_after=2, times=1)
    Broadcast(None, tmp_path, "wait").create([11, 12, 13], "hello")
    proc = spawn(api, tmp_path, "wait")
    try:
        assert wait_until(lambda: '"not_sent"' in journal_text(tmp_path, "wait"), 30)
    finally:
        kill(proc)
    before = Broadcast(None, tmp_path, "wait").status()
    assert (before.pending, before.uncertain, before.in_flight) == (3, 0, 0)

    code, last = finish(spawn(api, tmp_path, "wait"))
    assert code == 0 and last["sent"] == 3 and last["uncertain"] == 0
    first, second = [c for c in api.calls_to("sendMessage") if c.params["chat_id"] == "11"]
    assert second.time - first.time >= 2.0  # retry_after survived the crash
    assert sorted(s.chat_id for s in api.sent) == [11, 12, 13]


def test_lock_of_a_killed_process_is_taken_over(tmp_path: Path, fake_bot_api: Any, fake_bot: Any) -> None:
    """A live child's run locks others out (naming its pid); once it is SIGKILLed the lock is free at once."""
    api = fake_bot_api
    api.delay("sendMessage", 60.0, times=1)  # the child hangs in its first send (until the server stops)
    Broadcast(None, tmp_path, "lock").create([21, 22, 23], "hello")
    proc = spawn(api, tmp_path, "lock")
    try:
        # Polled: the fake server notifies waiters when a request ends, and this one does not end.
        assert wait_until(lambda: len(api.calls) >= 1, 30)
        with pytest.raises(BroadcastLocked, match=f"pid {proc.pid}"):
            Broadcast(fake_bot, tmp_path, "lock").run()
    finally:
        kill(proc)
    report = Broadcast(fake_bot, tmp_path, "lock").run(rate=1000.0)
    assert (report.sent, report.uncertain, report.pending) == (2, 1, 0)
    assert Counter(s.chat_id for s in api.sent) == {22: 1, 23: 1}
    assert [c.params["chat_id"] for c in api.calls_to("sendMessage")].count("21") == 1  # never sent again
