"""One rate-limit path for every call the bot makes, across processes: a 429 pause the fence's handler met holds a
``telegram-fence broadcast run --db`` in another process, and a pause the broadcast met holds the fence's handlers.
Real subprocesses (tests/limits_child.py), real stores (a SQLite file; PostgreSQL when TELEGRAM_FENCE_PG_DSN is set),
timestamps taken by the fake Bot API server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, stop
from pg_support import BACKENDS, DSN, store_of

from telegram_fence import Broadcast, ConfigurationError, SqliteUpdateStore
from telegram_fence.calls.journal import Journal
from telegram_fence.calls.limits import shared_limits
from telegram_fence.testing import FakeBotAPI

CHILD = Path(__file__).with_name("limits_child.py")
WAIT = 6  # the retry_after the fake answers: long enough for a child process to start sending on a loaded host


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh store of each backend (the PostgreSQL tables are dropped afterwards)."""
    with store_of(request.param, tmp_path, "tf_limits") as store:
        yield store


def _db_args(store: Any) -> list[str]:
    if isinstance(store, SqliteUpdateStore):
        return ["--db", str(store.path)]
    return ["--db", str(DSN), "--table", store.table]


class _Child:
    """``telegram-fence broadcast run`` in a child process that has imported everything and waits for ``go``."""

    def __init__(self, api: FakeBotAPI, argv: list[str]) -> None:
        env = {**os.environ, "TELEGRAM_BOT_TOKEN": api.token,
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, str(CHILD), *argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready", self.proc.stderr.read() if self.proc.stderr else ""

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 30.0) -> tuple[int, str]:
        try:
            _out, err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _broadcast(api: FakeBotAPI, tmp_path: Path, audience: list[int], store: Any) -> _Child:
    Broadcast(None, tmp_path / "broadcasts", "news").create(audience, "news")
    return _Child(api, ["broadcast", "run", "news", "--dir", str(tmp_path / "broadcasts"), "--rate", "50",
                        "--api-url", api.base_url, *_db_args(store)])


def _to(api: FakeBotAPI, chat: int) -> list[Any]:
    return [c for c in api.calls_to("sendMessage") if str(c.params.get("chat_id")) == str(chat)]


@pytest.mark.parametrize("scope", ["chat", "bot"])
def test_a_pause_the_bot_met_holds_a_broadcast_run_in_another_process(api: FakeBotAPI, store: Any, tmp_path: Path,
                                                                      scope: str) -> None:
    """The fence's handler meets a 429 (retry_after WAIT, 6 s) on chat 99 (scope "chat") or on a call without a chat
    (setMyCommands: the whole bot); a `broadcast run --db` started in another process right after sends
    nothing to the paused scope before the pause ends, measured from the fake's timestamps, while a chat the pause
    does not hold is sent at once."""
    bot = telebot.TeleBot(api.token, threaded=False)
    method = "sendMessage" if scope == "chat" else "setMyCommands"
    if scope == "chat":
        bot.message_handler(func=lambda m: True)(lambda m: bot.send_message(99, "from the handler"))
    else:
        command = telebot.types.BotCommand("start", "start")
        bot.message_handler(func=lambda m: True)(lambda m: bot.set_my_commands([command]))
    api.fail(method, 429, retry_after=WAIT, times=1)
    child = _broadcast(api, tmp_path, [98, 99], store)
    fence = make_fence(bot, store)
    fence.start()
    try:
        api.push_message(1, "hi")
        assert eventually(lambda: fence.stats()["calls"]["paused"] == 1)  # counted once it is in the store
        child.go()
        code, err = child.finish()
        assert code == 0, err
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        child.kill()
        stop(fence)
    refused = api.calls_to(method)[0]
    ends = refused.time + WAIT
    news_99 = [c for c in _to(api, 99) if c.params.get("text") == "news"]
    news_98 = _to(api, 98)
    assert len(news_99) == 1 and len(news_98) == 1
    assert news_99[0].time >= ends, round(news_99[0].time - refused.time, 3)
    if scope == "chat":
        assert news_98[0].time < ends, "chat 98 is not held by chat 99's pause (and the broadcast ran within it)"
    else:
        assert news_98[0].time >= ends, "a pause of the whole bot holds every chat"
    handler_calls = [c for c in api.calls_to(method) if c.params.get("text") != "news"]
    assert len(handler_calls) == 2 and handler_calls[1].time >= ends


def test_a_pause_a_broadcast_run_met_holds_the_fence_in_another_process(api: FakeBotAPI, store: Any,
                                                                        tmp_path: Path) -> None:
    """A `broadcast run --db` in another process meets a 429 (retry_after WAIT, 6 s) on chat 99; a reply a handler of
    the running fence makes to chat 99, and an OperatorChannel message of the fence's process to chat 99, made after
    the pause is in the store, reach the fake only after the pause ends (fake's timestamps); the broadcast sends 99
    again, once, after the pause too."""
    from telegram_fence import OperatorChannel

    bot = telebot.TeleBot(api.token, threaded=False)
    bot.message_handler(func=lambda m: True)(lambda m: bot.send_message(m.chat.id, "reply"))
    fence = make_fence(bot, store)
    fence.start()
    child = _broadcast(api, tmp_path, [99], store)
    try:
        api.fail("sendMessage", 429, retry_after=WAIT, times=1)
        child.go()
        assert eventually(lambda: Journal(store).paused_until("chat:99", time.time()) > 0)
        pushed_at = time.time()
        api.push_message(99, "hi")
        operator = OperatorChannel(telebot.TeleBot(api.token, threaded=False), 99)
        operator.post("operator note")
        assert eventually(lambda: fence.stats()["settled"] == 1)
        assert operator.close(10)
        code, err = child.finish()
        assert code == 0, err
    finally:
        child.kill()
        stop(fence)
    calls = _to(api, 99)
    refused, later = calls[0], calls[1:]
    ends = refused.time + WAIT
    assert refused.params["text"] == "news"
    assert pushed_at < ends, "the update was pushed while the pause held (else the test shows nothing)"
    assert sorted(c.params["text"] for c in later) == ["news", "operator note", "reply"]
    assert all(c.time >= ends for c in later), [round(c.time - refused.time, 3) for c in later]


def test_shared_limits_refuses_a_process_whose_fence_journals_calls(api: FakeBotAPI, store: Any) -> None:
    """shared_limits() beside a running fence would wait for the limits twice: it is refused, naming why."""
    fence = make_fence(telebot.TeleBot(api.token, threaded=False), store)
    fence.start()
    try:
        with pytest.raises(ConfigurationError, match="fence journals calls"), shared_limits(store):
            pass
    finally:
        stop(fence)


def test_broadcast_run_refuses_a_db_that_is_not_the_bots_in_one_line(api: FakeBotAPI, tmp_path: Path) -> None:
    """`broadcast run --db` with a missing file or a PostgreSQL server that refuses, or --telegram-rates without
    --db: one line on stderr, exit 2, nothing created, nothing sent."""
    Broadcast(None, tmp_path / "b", "news").create([1], "news")
    env = {**os.environ, "TELEGRAM_BOT_TOKEN": api.token}
    for extra in (["--db", str(tmp_path / "nope.db")], ["--telegram-rates"],
                  ["--db", "host=127.0.0.1 port=1 dbname=nope connect_timeout=2"]):
        done = subprocess.run([sys.executable, "-m", "telegram_fence", "broadcast", "run", "news", "--dir",
                               str(tmp_path / "b"), "--api-url", api.base_url, *extra],
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "nope.db").exists()
    assert api.calls_to("sendMessage") == []


def test_shared_limits_hold_every_thread_and_record_the_pauses_they_meet(api: FakeBotAPI, store: Any) -> None:
    """Inside shared_limits(), telebot's calls from any thread wait for a pause recorded in the store, and the
    pause a 429 answers is written there for the other processes."""
    bot = telebot.TeleBot(api.token, threaded=False)
    Journal(store).pause("chat:5", time.time() + 1.0)
    with shared_limits(store):
        started = time.time()
        sent = threading.Thread(target=lambda: bot.send_message(5, "held"), name="fence-test-sender")
        sent.start()
        sent.join(10)
        api.fail("sendMessage", 429, retry_after=2, times=1)
        with pytest.raises(telebot.apihelper.ApiTelegramException):
            bot.send_message(6, "refused")
    assert _to(api, 5)[0].time >= started + 0.9
    assert Journal(store).paused_until("chat:6", time.time()) > time.time() + 1.0
