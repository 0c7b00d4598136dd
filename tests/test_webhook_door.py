"""The webhook door keeps the polling door's promises: hostile request heads, a second Ctrl-C, a swapped
secret, re-deliveries after pruning; over real HTTP, real WSGI servers, real files and processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from webhook_support import SECRET, raw_request, update

from telegram_fence import SqliteUpdateStore, WebhookIntake
from telegram_fence.ingress.wsgi_server import WsgiServer


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
