"""Crash proof for conversations on PostgreSQL, across hosts: two fenced processes of one conversation bot on one
PostgreSQL store, one of them SIGKILLed (and restarted) between or during the steps, answer as plain telebot does
uninterrupted. Whichever host takes a step finds what the other registered: the per-round question of which chats
have a conversation stored is asked after each claim, on the database every host writes to (the rule itself, an
answer never older than its claim, is pinned deterministically by tests/test_conversation_quiet.py).

The short form runs in CI; ``TF_SOAK=1`` runs the long form (kills at any moment, both conversations, more rounds).
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from conftest import SOAK
from helpers import eventually, signal_when_ready
from pg_support import DSN, drop_tables, new_table, requires_pg
from test_conversation_crash import STEPS, SURVEY, _answers, _reference, _spawn

from telegram_fence.store.schema import SETTLED
from telegram_fence.testing import FakeBotAPI, ReadinessSocket

pytestmark = requires_pg


@pytest.fixture
def tables() -> Iterator[Callable[[], str]]:
    """Fresh store tables, one per run (each run's fake Telegram numbers its updates from 1); all dropped after."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    made: list[str] = []

    def fresh() -> str:
        made.append(new_table("tf_conv_hosts"))
        PostgresUpdateStore(DSN, table=made[-1]).close()
        return made[-1]

    yield fresh
    if made:
        drop_tables(*made)


class Hosts:
    """Two hosts of the bot; :meth:`kill` SIGKILLs one and starts it again (the other goes on meanwhile)."""

    def __init__(self, api: FakeBotAPI, kind: str, table: str, ready: ReadinessSocket) -> None:
        self._api, self._kind, self._db, self._ready = api, kind, f"postgres:{table}", ready
        self.all: list[subprocess.Popen[bytes]] = []
        self.current = [self._start(), self._start()]

    def _start(self) -> subprocess.Popen[bytes]:
        child = _spawn(self._api, self._kind, self._db, ready=self._ready)
        self.all.append(child)
        return child

    def kill(self, index: int) -> None:
        child = self.current[index]
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=20)
        self.current[index] = self._start()

    def stop(self) -> None:
        """SIGTERM both once they said READY=1; each exits 0."""
        for child in self.current:
            signal_when_ready(child, self._ready)
        for child in self.current:
            assert child.wait(timeout=30) == 0

    def reap(self) -> None:
        for child in self.all:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=20)


@contextmanager
def _hosts(api: FakeBotAPI, kind: str, table: str) -> Iterator[Hosts]:
    with ReadinessSocket() as ready:
        hosts = Hosts(api, kind, table, ready)
        try:
            for child in hosts.current:
                assert ready.wait_ready(child, timeout=30), "a host did not say READY=1"
            yield hosts
        finally:
            hosts.reap()


def _settled(conn: psycopg.Connection, table: str, update_id: int) -> bool:
    row = conn.execute(f"SELECT state FROM {table} WHERE update_id = %s", (update_id,)).fetchone()
    return row is not None and row[0] == SETTLED


def _left_over(conn: psycopg.Connection, table: str) -> int:
    (count,) = conn.execute(f"SELECT count(*) FROM {table}_steps").fetchone() or (0,)
    return int(count)


def _between_steps(kind: str, steps: Sequence[str], table: str, seed: int) -> list[list[str]]:
    """Each step settled, then one host (in turn) SIGKILLed a random moment up to 50 ms later and restarted."""
    rng = random.Random(seed)
    per_step: list[list[str]] = []
    with psycopg.connect(str(DSN), autocommit=True) as conn, FakeBotAPI(max_long_poll=0.5) as api, \
            _hosts(api, kind, table) as hosts:
        for index, text in enumerate(steps):
            before = len(_answers(api, 7))
            update_id = api.push_message(7, text)
            assert eventually(lambda u=update_id: _settled(conn, table, u), timeout=30), f"{text!r} not settled"
            per_step.append(_answers(api, 7)[before:])
            if index < len(steps) - 1:
                threading.Event().wait(rng.uniform(0, 0.05))
                hosts.kill(index % 2)
        hosts.stop()
        assert _left_over(conn, table) == 0
    return per_step


def test_next_step_handlers_survive_sigkills_between_steps_across_two_hosts(
    tables: Callable[[], str], tmp_path: Path
) -> None:
    """register_next_step_handler's conversation on two hosts of one PostgreSQL store, a host SIGKILLed after every
    settled step (in turn) and restarted: each step is answered as plain telebot answers it, by whichever host
    claims it, with the handler and arguments the other host may have registered."""
    expected = _reference("steps", STEPS, tmp_path)
    assert expected[-1] == ["Nice to meet you Ann, age 30, Female"]
    assert _between_steps("steps", STEPS, tables(), seed=2302) == expected


@pytest.mark.soak
@pytest.mark.skipif(not SOAK, reason="long form: TF_SOAK=1")
@pytest.mark.parametrize("kind", ["steps", "states"])
def test_conversations_survive_sigkills_at_any_moment_across_two_hosts(
    tables: Callable[[], str], tmp_path: Path, kind: str
) -> None:
    """Long form: both conversations, three rounds each; between steps as above, then a host SIGKILLed a random
    moment into each step's handling (before or after its settle): every answer is telebot's, in order (one a
    kill left uncertain may be missing, as the call journal promises), and each round ends with the summary."""
    steps = STEPS if kind == "steps" else SURVEY
    expected = _reference(kind, steps, tmp_path)
    for seed in range(3):
        assert _between_steps(kind, steps, tables(), seed=seed) == expected
    wanted = [step[0] for step in expected]
    rng = random.Random(2303)
    for _round in range(3):
        table = tables()
        with psycopg.connect(str(DSN), autocommit=True) as conn, FakeBotAPI(max_long_poll=0.5) as api, \
                _hosts(api, kind, table) as hosts:
            for text in steps:
                update_id = api.push_message(7, text)
                threading.Event().wait(rng.uniform(0, 0.15))  # the kill lands somewhere in this step's handling
                hosts.kill(rng.randrange(2))
                settled = eventually(lambda u=update_id, t=table: _settled(conn, t, u), timeout=60)
                assert settled, f"{text!r} not settled"
            answers = _answers(api, 7)
            hosts.stop()
        deduplicated = [text for index, text in enumerate(answers) if index == 0 or answers[index - 1] != text]
        assert deduplicated[-1] == wanted[-1]
        remaining = iter(wanted)
        assert all(text in remaining for text in deduplicated), (deduplicated, wanted)
