"""The webhook door keeps the polling door's promises: hostile request heads, a second Ctrl-C, a swapped
secret, re-deliveries after pruning; over real HTTP, real WSGI servers, real files and processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from webhook_support import SECRET, TOKEN, raw_request, update

from telegram_fence import SqliteUpdateStore, WebhookIntake
from telegram_fence.ingress.wsgi_server import WsgiServer
from telegram_fence.testing import FakeBotAPI


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(app: WebhookIntake) -> Iterator[int]:
    server = WsgiServer(app, "127.0.0.1", 0)
    server.start()
    try:
        yield server.port
    finally:
        server.stop()
        assert server.join(10)
        assert app.close(10)


def _head(length: bytes) -> bytes:
    return (b"POST /telegram/hook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"X-Telegram-Bot-Api-Secret-Token: " + SECRET.encode() + b"\r\nContent-Length: " + length + b"\r\n\r\n")


@pytest.mark.parametrize("length", [b"\xb2", b"\xd9\xa3", b"9" * 4300, b"1" * 25, b"+12", b"-1", b"1_0"],
                         ids=["superscript-two", "arabic-indic-digit-bytes", "4300-digits", "25-digits", "plus",
                              "negative", "underscore"])
def test_a_content_length_that_is_not_plain_ascii_digits_is_400_without_a_traceback(
        tmp_path: Path, length: bytes, capfd: pytest.CaptureFixture[str]) -> None:
    """A Content-Length of a Unicode digit (``²``), thousands of digits, a sign or an underscore answers 400
    over real HTTP, prints no traceback, and stores nothing; the next good delivery is stored."""
    with SqliteUpdateStore(tmp_path / "hook.db") as store:
        app = WebhookIntake(store, SECRET)
        body = json.dumps(update(5)).encode()
        with serving(app) as port:
            status, answer = raw_request(port, _head(length), [])  # no body: none is read before the 400
            good = raw_request(port, _head(str(len(body)).encode()), [body])[0]
        assert status == 400, answer
        assert b"Content-Length" in answer
        assert good == 200
        assert store.stats()["pending"] == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


CHILD = str(Path(__file__).with_name("webhook_stop_child.py"))


def _spawn_webhook(api: FakeBotAPI, db: str, port: int, **env: str) -> subprocess.Popen[str]:
    child_env = dict(os.environ, TF_TEST_TOKEN=TOKEN, TF_TEST_SECRET=SECRET, **env)
    return subprocess.Popen([sys.executable, CHILD, db, api.api_url, str(port)], env=child_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(child: subprocess.Popen[str], timeout: float = 40) -> tuple[int, str]:
    try:
        _, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
        raise AssertionError(f"the child did not exit within {timeout} s; stderr:\n{err}") from None
    return child.returncode, err


def test_a_second_sigint_in_run_webhook_abandons_a_hung_handler_exits_130_and_nothing_is_lost(
        tmp_path: Path) -> None:
    """run_webhook in a real process: the first SIGINT waits for a hung handler (shutdown_timeout 30 s), a
    second exits 130 at once saying so; the next start handles the abandoned update after its lease."""
    db = str(tmp_path / "bot.db")
    port = free_port()
    with FakeBotAPI(token=TOKEN) as api:
        child = _spawn_webhook(api, db, port)
        try:
            api.push_message(1, "hang")
            assert api.wait_for(lambda: [s.text for s in api.sent] == ["hanging"], timeout=30)
            child.send_signal(signal.SIGINT)
            time.sleep(0.5)  # the graceful stop is under way (it would wait 30 s for the handler)
            assert child.poll() is None, "the first SIGINT did not wait for the running handler"
            began = time.monotonic()
            child.send_signal(signal.SIGINT)
            code, err = _finish(child)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert time.monotonic() - began < 5, f"the second SIGINT did not stop at once: {code} {err}"
        assert code == 130, err
        assert "second signal" in err
        again = _spawn_webhook(api, db, port, STOP_CHILD_NO_HANG="1")
        try:
            assert api.wait_for(lambda: "echo hang" in [s.text for s in api.sent], timeout=30)
        finally:
            again.send_signal(signal.SIGTERM)
            code, err = _finish(again)
        assert code == 0, err
