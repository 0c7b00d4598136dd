"""`broadcast run` and the examples reach a Bot API server given by --api-url or $TELEGRAM_API_URL."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import signal_when_ready
from telebot import apihelper

from telegram_fence.delivery.broadcast import Broadcast
from telegram_fence.errors import ConfigurationError
from telegram_fence.telegram import api_url_formats, use_api_url
from telegram_fence.testing import FakeBotAPI, ReadinessSocket

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("given", "api", "files"),
    [
        ("http://127.0.0.1:8081", "http://127.0.0.1:8081/bot{0}/{1}", "http://127.0.0.1:8081/file/bot{0}/{1}"),
        ("https://bots.example/tg/", "https://bots.example/tg/bot{0}/{1}", "https://bots.example/tg/file/bot{0}/{1}"),
        ("http://h:1/bot{0}/{1}", "http://h:1/bot{0}/{1}", "http://h:1/file/bot{0}/{1}"),
        ("http://h:1/api/{0}/{1}", "http://h:1/api/{0}/{1}", None),
    ],
)
def test_a_plain_base_url_or_telebots_format_is_accepted(given: str, api: str, files: str | None) -> None:
    """A base URL gets telebot's /bot{0}/{1} and /file/bot{0}/{1} formats; a format string is kept."""
    assert api_url_formats(given) == (api, files)


@pytest.mark.parametrize("given", ["ftp://h", "127.0.0.1:8081", "http://", "http://h:port", "http://h/bot{0}"])
def test_a_malformed_url_is_refused(given: str) -> None:
    """Anything but an http(s) URL with a host (and both placeholders, or none) raises ConfigurationError."""
    with pytest.raises(ConfigurationError):
        api_url_formats(given)


def test_the_environment_variable_is_honoured_and_absence_changes_nothing() -> None:
    """use_api_url() reads $TELEGRAM_API_URL; without it telebot's setting stays as it was."""
    before = (apihelper.API_URL, apihelper.FILE_URL)
    try:
        assert use_api_url(environ={}) is None
        assert before == (apihelper.API_URL, apihelper.FILE_URL)
        assert use_api_url(environ={"TELEGRAM_API_URL": "http://127.0.0.1:9"}) == "http://127.0.0.1:9/bot{0}/{1}"
        assert apihelper.API_URL == "http://127.0.0.1:9/bot{0}/{1}"
    finally:
        apihelper.API_URL, apihelper.FILE_URL = before  # type: ignore[assignment]


@pytest.fixture
def api() -> Iterator[FakeBotAPI]:
    with FakeBotAPI(max_long_poll=0.3) as server:
        yield server


def child_env(api: FakeBotAPI, **extra: str) -> dict[str, str]:
    env = dict(os.environ, TELEGRAM_BOT_TOKEN=api.token, PYTHONUNBUFFERED="1", **extra)
    env.pop("TELEGRAM_API_URL", None)
    env.update(extra)
    return env


@pytest.mark.parametrize("how", ["--api-url", "TELEGRAM_API_URL"])
def test_broadcast_run_reaches_the_server_named(api: FakeBotAPI, tmp_path: Path, how: str) -> None:
    """A real `broadcast run` process sends through the fake server given by flag or by environment."""
    Broadcast(None, tmp_path, "news").create([1, 2], "hello")
    argv = [sys.executable, "-m", "telegram_fence", "broadcast", "run", "news", "--dir", str(tmp_path), "--rate", "100"]
    env = child_env(api)
    if how == "--api-url":
        argv += ["--api-url", api.base_url]
    else:
        env["TELEGRAM_API_URL"] = api.base_url
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert sorted(s.chat_id for s in api.sent) == [1, 2]


def _serve_until_reply(argv: list[str], env: dict[str, str], api: FakeBotAPI, cwd: Path, reply: str) -> None:
    ready = ReadinessSocket()
    child = subprocess.Popen(argv, env={**env, "NOTIFY_SOCKET": ready.address}, cwd=cwd, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        api.push_message(5, "ping")
        assert api.wait_for(lambda: any(reply in (s.text or "") for s in api.sent), timeout=30), \
            child.stderr.read().decode() if child.poll() is not None and child.stderr else "no reply"
        signal_when_ready(child, ready)
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stderr:
            child.stderr.close()
        ready.close()


@pytest.mark.parametrize("example", ["echo_bot.py", "notes_bot.py"])
def test_the_examples_honour_the_environment_variable(api: FakeBotAPI, tmp_path: Path, example: str) -> None:
    """Each example, run as a script with $TELEGRAM_API_URL, talks to that server and stops cleanly on SIGTERM."""
    env = child_env(api, TELEGRAM_API_URL=api.base_url, OPERATOR_CHAT_ID="42")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    reply = "ping" if example == "echo_bot.py" else "noted"
    _serve_until_reply([sys.executable, str(ROOT / "examples" / example)], env, api, tmp_path, reply)
