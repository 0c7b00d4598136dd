"""Crash proof for conversations: telebot-style conversation bots under the fence, killed with SIGKILL between two
steps and restarted, go on exactly as an uninterrupted run does."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import apsw
import pytest
from helpers import eventually, signal_when_ready

from telegram_fence.cli.database import reader
from telegram_fence.store.schema import SETTLED
from telegram_fence.testing import FakeBotAPI, ReadinessSocket

pytestmark = pytest.mark.drill

CHILD = str(Path(__file__).with_name("states_child.py"))
SURVEY = ["/start", "Ann", "thirty", "30", "Blue", "Reading"]
STEPS = ["/start", "Ann", "old", "30", "Female"]


def _spawn(api: FakeBotAPI, kind: str, db: str, polling: bool = False, states: bool = True,
           ready: ReadinessSocket | None = None) -> subprocess.Popen[bytes]:
    extra = {"TELEGRAM_API_URL": api.api_url, "TELEGRAM_BOT_TOKEN": api.token,
             "CHILD_POLLING": "1" if polling else "0", "CHILD_STATES": "1" if states else "0", "CHILD_LEASE": "1",
             "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env = {**os.environ, **extra} if ready is None else ready.env(**extra)
    return subprocess.Popen([sys.executable, CHILD, kind, db], env=env)


@contextmanager
def _running(
    api: FakeBotAPI, kind: str, db: str, polling: bool = False, states: bool = True
) -> Iterator[tuple[list[subprocess.Popen[bytes]], ReadinessSocket]]:
    """The child bot; the list holds the current process (a drill replaces it); it is stopped at the end. The
    fenced bot says READY=1 on the socket once a SIGTERM stops it cleanly (``signal_when_ready``)."""
    with ReadinessSocket() as ready:
        children = [_spawn(api, kind, db, polling, states, ready)]
        try:
            # a drill's first kill must land while a step is handled, not while the bot still imports
            assert polling or ready.wait_ready(children[0], timeout=30), "the bot did not say READY=1"
            yield children, ready
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                child.wait(timeout=20)


def _settled(db: str, update_id: int) -> bool:
    if not os.path.exists(db):
        return False
    conn = reader(db)
    try:
        row = list(conn.execute("SELECT state FROM fence_updates WHERE update_id = ?", (update_id,)))
    except apsw.SQLError:  # the child created the file and has not written its schema yet
        return False
    finally:
        conn.close()
    return bool(row) and row[0][0] == SETTLED


def _answers(api: FakeBotAPI, chat: int) -> list[str]:
    return [sent.text or "" for sent in api.sent_to(chat)]


def _reference(kind: str, steps: Sequence[str], workdir: Path) -> list[list[str]]:
    """What telebot itself (plain polling, no fence) answers to each step, uninterrupted."""
    per_step: list[list[str]] = []
    with FakeBotAPI(max_long_poll=0.5) as api, _running(api, kind, str(workdir / "unused.db"), polling=True):
        for text in steps:
            before = len(_answers(api, 7))
            api.push_message(7, text)
            assert api.wait_for(lambda n=before: len(_answers(api, 7)) > n, timeout=20)
            # telebot answers each step of these bots with one message: a second would show up here
            assert not api.wait_for(lambda n=before: len(_answers(api, 7)) > n + 1, timeout=0.3)
            per_step.append(_answers(api, 7)[before:])
    return per_step


def _drill(
    kind: str, steps: Sequence[str], workdir: Path, kill_after: set[int], jitter: bool, states: bool = True
) -> list[list[str]]:
    """Run the conversation under the fence, SIGKILL it after each step in ``kill_after`` (once that step was
    settled; with ``jitter`` at a random moment up to 50 ms later) and restart it; return each step's answers."""
    db = str(workdir / f"{kind}.db")
    per_step: list[list[str]] = []
    rng = random.Random(23)
    with FakeBotAPI(max_long_poll=0.5) as api, _running(api, kind, db, states=states) as (children, ready):
        for index, text in enumerate(steps):
            before = len(_answers(api, 7))
            update_id = api.push_message(7, text)
            assert eventually(lambda u=update_id: _settled(db, u), timeout=30), f"step {text!r} was not settled"
            per_step.append(_answers(api, 7)[before:])
            if index in kill_after:
                if jitter:
                    threading.Event().wait(rng.uniform(0, 0.05))
                children[-1].send_signal(signal.SIGKILL)
                children[-1].wait(timeout=20)
                children.append(_spawn(api, kind, db, states=states, ready=ready))
        signal_when_ready(children[-1], ready)
        assert children[-1].wait(timeout=20) == 0
    return per_step


def test_custom_states_bot_killed_between_steps_answers_as_an_uninterrupted_run(tmp_path: Path) -> None:
    """The custom_states conversation, SIGKILLed after the name and after the age and restarted, answers every
    later step as plain telebot does, and its summary holds the answers given before the kills."""
    expected = _reference("states", SURVEY, tmp_path)
    assert expected[-1] == ["Summary: name=Ann age=30 color=Blue hobby=Reading"]
    got = _drill("states", SURVEY, tmp_path, kill_after={1, 3}, jitter=False)
    assert got == expected


def test_next_step_handlers_survive_a_sigkill_after_each_step(tmp_path: Path) -> None:
    """register_next_step_handler conversations: killed at a random moment after every settled step and
    restarted, each later step is answered by the handler registered before the kill, with its arguments."""
    expected = _reference("steps", STEPS, tmp_path)
    assert expected[-1] == ["Nice to meet you Ann, age 30, Female"]
    got = _drill("steps", STEPS, tmp_path, kill_after=set(range(len(STEPS) - 1)), jitter=True)
    assert got == expected


def test_the_drill_tells_telebots_memory_storage_apart(tmp_path: Path) -> None:
    """Negative control: with states=False (telebot's StateMemoryStorage) the same drill loses the conversation:
    after the kill the age is not answered as telebot answers it uninterrupted."""
    expected = _reference("states", SURVEY[:4], tmp_path)
    got = _drill("states", SURVEY[:4], tmp_path, kill_after={1}, jitter=False, states=False)
    assert got[:2] == expected[:2] and got[2:] != expected[2:]
    assert got[2:] == [[], []]  # no state: no handler matches "thirty" or "30"


def test_next_step_conversation_survives_kills_at_any_moment(tmp_path: Path) -> None:
    """SIGKILL at a random moment while each step is handled (before or after its settle): after the restart the
    step runs again in the state the last settled step left, so the conversation ends with the same summary and
    every answer is telebot's, in order."""
    expected = _reference("steps", STEPS, tmp_path)
    db = str(tmp_path / "anytime.db")
    rng = random.Random(2301)
    with FakeBotAPI(max_long_poll=0.5) as api, _running(api, "steps", db) as (children, ready):
        for text in STEPS:
            update_id = api.push_message(7, text)
            threading.Event().wait(rng.uniform(0, 0.15))  # the kill lands somewhere in this step's handling
            children[-1].send_signal(signal.SIGKILL)
            children[-1].wait(timeout=20)
            children.append(_spawn(api, "steps", db, ready=ready))
            assert eventually(lambda u=update_id: _settled(db, u), timeout=60), f"step {text!r} was not settled"
        answers = _answers(api, 7)
        signal_when_ready(children[-1], ready)
        assert children[-1].wait(timeout=20) == 0
    deduplicated = [text for index, text in enumerate(answers) if index == 0 or answers[index - 1] != text]
    wanted = [step[0] for step in expected]
    assert deduplicated[-1] == wanted[-1] == "Nice to meet you Ann, age 30, Female"
    # Each answer is telebot's, in order. One may be missing: a reply whose sendMessage the kill cut off may have
    # left, so the call journal records it as uncertain and the rerun does not send it again.
    remaining = iter(wanted)
    assert all(text in remaining for text in deduplicated), (deduplicated, wanted)
