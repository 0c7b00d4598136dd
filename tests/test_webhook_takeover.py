"""run_webhook's takeover protection and watch, polling against a set webhook, and the webhook CLI,
against a stand-in Bot API server over real HTTP."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually
from webhook_support import SECRET, TOKEN, StandInAPI, post, update

from telegram_fence import Fence, SqliteUpdateStore, WebhookTaken
from telegram_fence.cli.main import main as cli_main
from telegram_fence.ingress.webhook_guard import split_tag, tagged_url

URL = "https://bot.example.com/telegram/hook"
CHILD = str(Path(__file__).with_name("webhook_child.py"))


@pytest.fixture
def api() -> Iterator[StandInAPI]:
    with StandInAPI() as server:
        yield server


def make_fence(tmp_path: Path, **options: Any) -> Fence:
    options.setdefault("lease", 5.0)
    options.setdefault("shutdown_timeout", 5.0)
    return Fence(telebot.TeleBot(TOKEN, threaded=False), str(tmp_path / "bot.db"), **options)


class Running:
    """run_webhook on a thread; ``code`` is its return value (or the exception it raised)."""

    def __init__(self, fence: Fence, **kwargs: Any) -> None:
        self.fence = fence
        self.code: Any = None
        self.thread = threading.Thread(target=self._run, args=(kwargs,), name="run-webhook")
        self.thread.start()

    def _run(self, kwargs: dict[str, Any]) -> None:
        try:
            self.code = self.fence.run_webhook(URL, secret_token=SECRET, listen=("127.0.0.1", 0), **kwargs)
        except BaseException as exc:
            self.code = exc

    def port(self) -> int:
        assert eventually(lambda: (self.fence.stats()["webhook"] or {}).get("listen") is not None)
        listen = self.fence.stats()["webhook"]["listen"]
        return int(listen.rstrip("/").rsplit(":", 1)[1])

    def finish(self, timeout: float = 20) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "run_webhook did not return"
        return self.code


def test_refused_when_the_webhook_points_to_another_host(api: StandInAPI, tmp_path: Path) -> None:
    """A webhook set to another host refuses to start, naming that host only; setWebhook is never called."""
    api.url = "https://staging.example.org/private/path?k=v"
    with pytest.raises(WebhookTaken) as info:
        make_fence(tmp_path).run_webhook(URL, secret_token=SECRET, listen=("127.0.0.1", 0))
    text = str(info.value)
    assert "staging.example.org" in text
    assert "private" not in text and "k=v" not in text and SECRET not in text
    assert api.called("setWebhook") == []
    assert api.url == "https://staging.example.org/private/path?k=v"


def test_refused_for_the_same_url_registered_with_another_secret(api: StandInAPI, tmp_path: Path) -> None:
    """The same address registered with another secret (another tag) is someone else's: refused."""
    api.url = tagged_url(URL, "the-other-secret")
    with pytest.raises(WebhookTaken, match=r"bot\.example\.com"):
        make_fence(tmp_path).run_webhook(URL, secret_token=SECRET, listen=("127.0.0.1", 0))
    assert api.called("setWebhook") == []


def test_takeover_from_the_named_host_registers_serves_and_handles(api: StandInAPI, tmp_path: Path) -> None:
    """With takeover_from naming the current host, the tagged URL and secret are registered and updates handled."""
    api.url = "https://staging.example.org/hook"
    handled: list[int] = []
    fence = make_fence(tmp_path, allowed_updates=["message"])
    fence.handler(lambda u: handled.append(u.update_id))
    run = Running(fence, takeover_from="staging.example.org")
    try:
        port = run.port()
        assert eventually(lambda: api.called("setWebhook") != [])
        registered = api.called("setWebhook")[0]
        assert registered["url"] == tagged_url(URL, SECRET)
        assert registered["secret_token"] == SECRET
        assert json.loads(registered["allowed_updates"]) == ["message"]
        assert registered["drop_pending_updates"] in ("False", "false")
        assert post(port, json.dumps(update(5)))[0] == 200
        assert post(port, json.dumps(update(6)), secret="wrong")[0] == 401
        assert eventually(lambda: handled == [5])
        assert fence.stats()["poller"] is None
    finally:
        fence.stop()
    assert run.finish() == 0


def test_an_own_registration_is_renewed_and_an_empty_one_set(api: StandInAPI, tmp_path: Path) -> None:
    """A webhook already ours (same URL, this secret's tag) is registered again; drop_pending is passed on."""
    api.url = tagged_url(URL, SECRET)
    api.pending = 3
    fence = make_fence(tmp_path)
    run = Running(fence, drop_pending=True)
    try:
        assert eventually(lambda: api.called("setWebhook") != [])
        assert api.pending == 0
    finally:
        fence.stop()
    assert run.finish() == 0


def test_a_moved_webhook_is_reported_and_ends_the_fence(api: StandInAPI, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The periodic getWebhookInfo notices another host took the webhook: log, operator chat, on_ended, exit 1."""
    from telegram_fence import OperatorChannel

    ended: list[str] = []
    operator = OperatorChannel(telebot.TeleBot(TOKEN, threaded=False), 999)
    fence = make_fence(tmp_path, on_ended=ended.append, operator=operator)
    fence.webhook_check_interval = 0.1
    api.pending = 4
    api.last_error = "Wrong response from the webhook: 500 Internal Server Error"
    with caplog.at_level(logging.WARNING, logger="telegram_fence"):
        run = Running(fence)
        try:
            assert eventually(lambda: (fence.stats()["webhook"] or {}).get("checks", 0) >= 1)
            webhook = fence.stats()["webhook"]
            assert webhook["pending_update_count"] == 4
            assert webhook["last_error_message"] == api.last_error
            assert webhook["host"] == "bot.example.com"
            with api.lock:
                api.url = "https://laptop.example.net:8443/x?y=z"
            code = run.finish()
        finally:
            fence.stop()
    assert code == 1
    assert len(ended) == 1 and "laptop.example.net:8443" in ended[0]
    assert "y=z" not in ended[0]
    assert fence.ended_reason == ended[0]
    assert any("webhook ended" in r.getMessage() for r in caplog.records)
    assert operator.drain(5)
    operator.close(5)
    assert any("laptop.example.net:8443" in text for text in api.sent)


def test_polling_a_bot_whose_webhook_is_set_ends_at_once_naming_the_host(api: StandInAPI, tmp_path: Path) -> None:
    """Fence.run() (polling) with a webhook set ends on the first 409 with the webhook's host in the reason."""
    api.url = tagged_url("https://prod.example.com/hook", SECRET)
    fence = make_fence(tmp_path, long_poll_timeout=0.2, conflict_grace=60.0)
    started = time.monotonic()
    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(fence.run()), name="run-poll")
    thread.start()
    thread.join(20)
    assert code == [1]
    assert time.monotonic() - started < 15  # far below conflict_grace: no 409 retries
    reason = fence.ended_reason or ""
    assert "prod.example.com" in reason and "tf=" not in reason and "/hook" not in reason


def test_cli_info_shows_host_pending_and_last_error(api: StandInAPI, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`telegram-fence webhook info` shows the owner host, pending count and last error, never the URL or token."""
    monkeypatch.setenv("MY_BOT_TOKEN", TOKEN)
    api.url = tagged_url("https://prod.example.com/hook/path", SECRET)
    api.pending = 12
    api.last_error = "Connection timed out"
    assert cli_main(["webhook", "info", "--token-env", "MY_BOT_TOKEN"]) == 0
    out = capsys.readouterr().out
    assert "prod.example.com" in out and "12" in out and "Connection timed out" in out
    assert "/hook/path" not in out and TOKEN not in out and "tf=" not in out
    assert cli_main(["webhook", "info", "--token-env", "MY_BOT_TOKEN", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["host"] == "prod.example.com" and data["pending_update_count"] == 12 and data["tagged"]


def test_cli_delete_keeps_pending_updates(api: StandInAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`telegram-fence webhook delete DB` deletes the webhook with drop_pending_updates false; polling works again."""
    monkeypatch.setenv("MY_BOT_TOKEN", TOKEN)
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    api.url = tagged_url("https://prod.example.com/hook", SECRET)
    api.pending = 5
    assert cli_main(["webhook", "delete", str(db), "--token-env", "MY_BOT_TOKEN"]) == 0
    assert api.url == ""
    assert api.pending == 5
    assert [c.get("drop_pending_updates") for c in api.called("deleteWebhook")] == ["False"]
    assert "prod.example.com" in capsys.readouterr().out


def test_cli_without_a_token_is_bad_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing token variable exits 2 naming the variable."""
    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    assert cli_main(["webhook", "info", "--token-env", "NO_SUCH_TOKEN_VAR"]) == 2
    assert "NO_SUCH_TOKEN_VAR" in capsys.readouterr().err


def test_sigterm_stops_run_webhook_cleanly(api: StandInAPI, tmp_path: Path) -> None:
    """SIGTERM to a process in run_webhook stops it: exit 0, the webhook stays registered, stored updates kept."""
    db = str(tmp_path / "bot.db")
    child = subprocess.Popen(
        [sys.executable, CHILD, "run_webhook", db, api.api_url, URL],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "TF_TEST_TOKEN": TOKEN, "TF_TEST_SECRET": SECRET},
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        assert eventually(lambda: api.called("setWebhook") != [])
        assert post(port, json.dumps(update(77)))[0] == 200
        child.send_signal(signal.SIGTERM)
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert split_tag(api.url)[0] == URL
    with SqliteUpdateStore(db) as store:
        stats = store.stats()
        assert stats["pending"] + stats["settled"] == 1 and stats["claimed"] == 0


def test_webhook_app_is_refused_on_a_polling_fence_and_twice(api: StandInAPI, tmp_path: Path) -> None:
    """webhook_app() after start() (polling) or a second time raises ConfigurationError."""
    from telegram_fence import ConfigurationError

    fence = make_fence(tmp_path)
    fence.webhook_app(SECRET)
    with pytest.raises(ConfigurationError, match="already called"):
        fence.webhook_app(SECRET)
    (tmp_path / "poll").mkdir()
    polling = make_fence(tmp_path / "poll", long_poll_timeout=0.2)
    polling.start()
    try:
        with pytest.raises(ConfigurationError, match="before start"):
            polling.webhook_app(SECRET)
    finally:
        polling.stop()
        polling.join(10)
