"""run_webhook's takeover protection and watch, polling against a set webhook, and the webhook CLI,
against the fake Bot API server (its webhook mode) over real HTTP."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually, signal_when_ready
from telebot import apihelper
from webhook_support import SECRET, TOKEN, post, update

from telegram_fence import Fence, SqliteUpdateStore, WebhookTaken
from telegram_fence.cli.main import main as cli_main
from telegram_fence.ingress.webhook_guard import register, split_tag, tagged_url
from telegram_fence.testing import FakeBotAPI, ReadinessSocket

URL = "https://bot.example.com/telegram/hook"
CHILD = str(Path(__file__).with_name("webhook_child.py"))


@pytest.fixture
def api() -> Iterator[FakeBotAPI]:
    with FakeBotAPI(token=TOKEN) as server:
        yield server


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def set_webhook(url: str) -> None:
    """setWebhook as another program would call it (no tag, no secret)."""
    apihelper.set_webhook(TOKEN, url=url)


def failed_delivery(api: FakeBotAPI, messages: int) -> int:
    """Register this secret's webhook on a loopback port nothing listens on and push ``messages``: the
    fake's first delivery fails (``Connection refused``) and waits its long retry delay. Returns the port."""
    port = free_port()
    register(TOKEN, f"http://127.0.0.1:{port}/hook/path", SECRET)
    api.push_messages(messages)
    assert api.wait_for(lambda: api.webhook_attempts >= 1, timeout=10)
    return port


def make_fence(tmp_path: Path, **options: Any) -> Fence:
    options.setdefault("lease", 5.0)
    options.setdefault("shutdown_timeout", 5.0)
    return Fence(telebot.TeleBot(TOKEN, threaded=False), str(tmp_path / "bot.db"), **options)


class Running:
    """run_webhook on a thread; ``code`` is its return value (or the exception it raised)."""

    def __init__(self, fence: Fence, url: str = URL, **kwargs: Any) -> None:
        self.fence = fence
        self.code: Any = None
        kwargs.setdefault("listen", ("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._run, args=(url, kwargs), name="run-webhook")
        self.thread.start()

    def _run(self, url: str, kwargs: dict[str, Any]) -> None:
        try:
            self.code = self.fence.run_webhook(url, secret_token=SECRET, **kwargs)
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


def test_refused_when_the_webhook_points_to_another_host(api: FakeBotAPI, tmp_path: Path) -> None:
    """A webhook set to another host refuses to start, naming that host only; setWebhook is never called."""
    set_webhook("https://staging.example.org/private/path?k=v")
    with pytest.raises(WebhookTaken) as info:
        make_fence(tmp_path).run_webhook(URL, secret_token=SECRET, listen=("127.0.0.1", 0))
    text = str(info.value)
    assert "staging.example.org" in text
    assert "private" not in text and "k=v" not in text and SECRET not in text
    assert len(api.calls_to("setWebhook")) == 1  # only the other program's
    assert api.webhook_url == "https://staging.example.org/private/path?k=v"


def test_refused_for_the_same_url_registered_with_another_secret(api: FakeBotAPI, tmp_path: Path) -> None:
    """The same address registered with another secret (another tag) is someone else's: refused."""
    register(TOKEN, URL, "the-other-secret")
    with pytest.raises(WebhookTaken, match=r"bot\.example\.com"):
        make_fence(tmp_path).run_webhook(URL, secret_token=SECRET, listen=("127.0.0.1", 0))
    assert len(api.calls_to("setWebhook")) == 1
    assert api.webhook_url == tagged_url(URL, "the-other-secret")


def test_takeover_from_the_named_host_registers_serves_and_handles(api: FakeBotAPI, tmp_path: Path) -> None:
    """With takeover_from naming the current host, the tagged URL and secret are registered and the
    updates Telegram then delivers are handled; a request without the secret is refused."""
    set_webhook("https://staging.example.org/hook")
    api.push_message(7, "before the takeover")
    port = free_port()
    url = f"http://127.0.0.1:{port}/telegram/hook"
    handled: list[str] = []
    fence = make_fence(tmp_path, allowed_updates=["message"])
    fence.handler(lambda u: handled.append(u.message.text))
    run = Running(fence, url, takeover_from="staging.example.org", listen=("127.0.0.1", port))
    try:
        assert api.wait_for(lambda: len(api.calls_to("setWebhook")) == 2, timeout=20)
        registered = api.calls_to("setWebhook")[1].params
        assert registered["url"] == tagged_url(url, SECRET)
        assert registered["secret_token"] == SECRET
        assert json.loads(registered["allowed_updates"]) == ["message"]
        assert str(registered["drop_pending_updates"]).lower() == "false"
        api.push_message(7, "after the takeover")
        assert api.wait_delivered(timeout=20)
        assert eventually(lambda: sorted(handled) == ["after the takeover", "before the takeover"])
        assert post(port, json.dumps(update(10**6)), secret="wrong")[0] == 401
        assert fence.stats()["poller"] is None
    finally:
        fence.stop()
    assert run.finish() == 0
    assert len(handled) == 2


def test_an_own_registration_is_renewed_and_drop_pending_passed_on(api: FakeBotAPI, tmp_path: Path) -> None:
    """A webhook already ours (same URL, this secret's tag) is registered again; drop_pending drops Telegram's queue."""
    register(TOKEN, URL, SECRET)
    api.push_messages(3)
    assert api.pending_count == 3
    fence = make_fence(tmp_path)
    run = Running(fence, drop_pending=True)
    try:
        assert api.wait_for(lambda: len(api.calls_to("setWebhook")) == 2, timeout=20)
        assert api.pending_count == 0
        assert api.webhook_url == tagged_url(URL, SECRET)
    finally:
        fence.stop()
    assert run.finish() == 0


def test_a_moved_webhook_is_reported_and_ends_the_fence(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The periodic getWebhookInfo shows Telegram's pending count and last error, then notices another host
    took the webhook: log, operator chat, on_ended, exit 1."""
    from telegram_fence import OperatorChannel

    with FakeBotAPI(token=TOKEN, webhook_retry_delay=600, webhook_max_retry_delay=600) as api:
        port = failed_delivery(api, 4)  # the bot was down: 4 wait, the last delivery failed
        ended: list[str] = []
        operator = OperatorChannel(telebot.TeleBot(TOKEN, threaded=False), 999)
        fence = make_fence(tmp_path, on_ended=ended.append, operator=operator)
        fence.webhook_check_interval = 0.1
        with caplog.at_level(logging.WARNING, logger="telegram_fence"):
            run = Running(fence, f"http://127.0.0.1:{port}/hook/path", listen=("127.0.0.1", port))
            try:
                assert eventually(lambda: (fence.stats()["webhook"] or {}).get("checks", 0) >= 1)
                webhook = fence.stats()["webhook"]
                assert webhook["pending_update_count"] == 4
                assert webhook["last_error_message"] == "Connection refused"
                assert webhook["host"] == f"127.0.0.1:{port}"
                set_webhook("https://laptop.example.net:8443/x?y=z")
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
        assert any("laptop.example.net:8443" in (sent.text or "") for sent in api.sent_to(999))


def test_polling_a_bot_whose_webhook_is_set_ends_at_once_naming_the_host(api: FakeBotAPI, tmp_path: Path) -> None:
    """Fence.run() (polling) against the fake with a webhook set ends on the first 409, its reason naming the
    webhook's host (never its path or tag), far sooner than conflict_grace."""
    register(TOKEN, "https://prod.example.com/hook", SECRET)
    api.push_messages(2)
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
    assert len(api.calls_to("getUpdates")) == 1
    assert api.pending_count == 2  # nothing confirmed, nothing lost


def test_cli_info_shows_host_pending_and_last_error(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`telegram-fence webhook info` shows the owner host, pending count and last error, never the URL or token."""
    monkeypatch.setenv("MY_BOT_TOKEN", TOKEN)
    with FakeBotAPI(token=TOKEN, webhook_retry_delay=600, webhook_max_retry_delay=600) as api:
        port = failed_delivery(api, 12)
        assert cli_main(["webhook", "info", "--token-env", "MY_BOT_TOKEN"]) == 0
        out = capsys.readouterr().out
        assert f"127.0.0.1:{port}" in out and "12" in out and "Connection refused" in out
        assert "/hook/path" not in out and TOKEN not in out and "tf=" not in out
        assert cli_main(["webhook", "info", "--token-env", "MY_BOT_TOKEN", "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["host"] == f"127.0.0.1:{port}" and data["pending_update_count"] == 12 and data["tagged"]


def test_cli_delete_keeps_pending_updates(api: FakeBotAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`telegram-fence webhook delete DB` deletes the webhook keeping Telegram's queue; polling gets them again."""
    monkeypatch.setenv("MY_BOT_TOKEN", TOKEN)
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    register(TOKEN, "https://prod.example.com/hook", SECRET)
    ids = api.push_messages(5)
    assert cli_main(["webhook", "delete", str(db), "--token-env", "MY_BOT_TOKEN"]) == 0
    assert api.webhook_url == ""
    assert api.pending_count == 5
    assert [str(c.params.get("drop_pending_updates")) for c in api.calls_to("deleteWebhook")] == ["False"]
    assert "prod.example.com" in capsys.readouterr().out
    assert [u.update_id for u in telebot.TeleBot(TOKEN, threaded=False).get_updates(timeout=0)] == ids


def test_cli_without_a_token_is_bad_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing token variable exits 2 naming the variable."""
    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    assert cli_main(["webhook", "info", "--token-env", "NO_SUCH_TOKEN_VAR"]) == 2
    assert "NO_SUCH_TOKEN_VAR" in capsys.readouterr().err


def test_sigterm_stops_run_webhook_cleanly(api: FakeBotAPI, tmp_path: Path) -> None:
    """SIGTERM to a process in run_webhook stops it: exit 0, the webhook stays registered, stored updates kept."""
    db = str(tmp_path / "bot.db")
    ready = ReadinessSocket()
    child = subprocess.Popen(
        [sys.executable, CHILD, "run_webhook", db, api.api_url, URL],
        stdout=subprocess.PIPE, text=True, env=ready.env(TF_TEST_TOKEN=TOKEN, TF_TEST_SECRET=SECRET),
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        assert api.wait_for(lambda: api.calls_to("setWebhook") != [], timeout=20)
        assert post(port, json.dumps(update(77)))[0] == 200
        signal_when_ready(child, ready)
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        ready.close()
    assert split_tag(api.webhook_url)[0] == URL
    with SqliteUpdateStore(db) as store:
        stats = store.stats()
        assert stats["pending"] + stats["settled"] == 1 and stats["claimed"] == 0


def test_webhook_app_is_refused_on_a_polling_fence_and_twice(api: FakeBotAPI, tmp_path: Path) -> None:
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
