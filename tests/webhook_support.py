"""Test support for the webhook tests: a real HTTP client for the intake, and a small stand-in Bot API.

The stand-in answers ``getWebhookInfo``, ``setWebhook``, ``deleteWebhook``, ``getUpdates`` (409
while a webhook is set) and ``sendMessage`` (for the operator channel) over real HTTP, so telebot's
own request path runs. It stands in until the fake server's webhook mode lands; it pushes no updates.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from telegram_fence.telegram import api_server

TOKEN = "123456:" + "A" * 35
SECRET = "s3cret-Token_for-tests"


def post(port: int, body: bytes | str | None, *, secret: str | None = SECRET, method: str = "POST",
         headers: dict[str, str] | None = None, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """One request to the intake on ``127.0.0.1:port``; ``(status, headers, body)``. Raises ``OSError``
    (or ``http.client`` errors) when the connection fails."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        sent = {"Content-Type": "application/json", **(headers or {})}
        if secret is not None:
            sent["X-Telegram-Bot-Api-Secret-Token"] = secret
        data = body.encode() if isinstance(body, str) else body
        conn.request(method, "/telegram/hook", body=data, headers=sent)
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def raw_request(port: int, head: bytes, body_parts: list[bytes], *, half_close: bool = True,
                timeout: float = 30.0) -> tuple[int, bytes]:
    """Send ``head`` then each part of the body over a plain socket; return ``(status, raw answer)``."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        for part in body_parts:
            sock.sendall(part)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    answer = b"".join(chunks)
    return int(answer.split(b" ", 2)[1]), answer


def update(update_id: int, chat: int = 1, text: str = "hi") -> dict[str, Any]:
    return {"update_id": update_id,
            "message": {"message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"},
                        "from": {"id": chat, "is_bot": False, "first_name": "u"}, "text": text}}


class StandInAPI:
    """A Bot API server holding one bot's webhook registration. Thread-safe; a context manager that
    points telebot at it (``api_server``) and stops it afterwards."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.url = ""
        self.secret: str | None = None
        self.allowed_updates: Any = None
        self.pending = 0
        self.last_error: str | None = None
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.sent: list[str] = []  # texts of sendMessage (the operator channel)
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self._answer()

            def _answer(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    raw = self.rfile.read(length).decode()
                    if "json" in (self.headers.get("Content-Type") or ""):
                        params.update({k: str(v) for k, v in json.loads(raw).items()})
                    else:
                        params.update(dict(urllib.parse.parse_qsl(raw, keep_blank_values=True)))
                method = parts.path.rsplit("/", 1)[-1]
                status, answer = stand_in.answer(method, params)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.api_url = f"http://127.0.0.1:{self.port}/bot{{0}}/{{1}}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="stand-in-api",
                                        daemon=True)

    def answer(self, method: str, params: dict[str, str]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.calls.append((method, params))
            if method == "getWebhookInfo":
                result: dict[str, Any] = {"url": self.url, "has_custom_certificate": False,
                                          "pending_update_count": self.pending}
                if self.last_error:
                    result["last_error_message"] = self.last_error
                    result["last_error_date"] = 1_700_000_000
                return 200, {"ok": True, "result": result}
            if method == "setWebhook":
                self.url = params.get("url", "")
                self.secret = params.get("secret_token")
                self.allowed_updates = params.get("allowed_updates")
                if params.get("drop_pending_updates") in ("True", "true"):
                    self.pending = 0
                return 200, {"ok": True, "result": True, "description": "Webhook was set"}
            if method == "deleteWebhook":
                self.url = ""
                self.secret = None
                if params.get("drop_pending_updates") in ("True", "true"):
                    self.pending = 0
                return 200, {"ok": True, "result": True, "description": "Webhook was deleted"}
            if method == "getUpdates":
                if self.url:
                    return 409, {"ok": False, "error_code": 409,
                                 "description": "Conflict: can't use getUpdates method while webhook is active; "
                                                "use deleteWebhook to delete the webhook first"}
                return 200, {"ok": True, "result": []}
            if method == "sendMessage":
                self.sent.append(params.get("text", ""))
                return 200, {"ok": True, "result": {
                    "message_id": len(self.sent), "date": 0, "text": params.get("text", ""),
                    "chat": {"id": int(params.get("chat_id", 0)), "type": "private"}}}
            return 404, {"ok": False, "error_code": 404, "description": "Not Found"}

    def called(self, method: str) -> list[dict[str, str]]:
        with self.lock:
            return [params for name, params in self.calls if name == method]

    def __enter__(self) -> StandInAPI:
        self._thread.start()
        self._install = api_server(self.api_url)
        self._install.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._install.__exit__(None, None, None)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@contextmanager
def stand_in() -> Iterator[StandInAPI]:
    with StandInAPI() as api:
        yield api
