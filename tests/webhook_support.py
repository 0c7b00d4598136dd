"""Test support for the webhook tests: a real HTTP client for the intake, and updates to send it.

The Bot API side (``setWebhook``, ``getWebhookInfo``, pushed deliveries) is the fake server's webhook
mode, :class:`telegram_fence.testing.FakeBotAPI`.
"""

from __future__ import annotations

import http.client
import socket
from typing import Any

TOKEN = "123456:" + "A" * 35
SECRET = "s3cret-Token_for-tests"


def post(port: int, body: bytes | str | None, *, secret: str | None = SECRET, method: str = "POST",
         headers: dict[str, str] | None = None, timeout: float = 30.0,
         path: str = "/telegram/hook") -> tuple[int, dict[str, str], bytes]:
    """One request to the intake on ``127.0.0.1:port``; ``(status, headers, body)``. Raises ``OSError``
    (or ``http.client`` errors) when the connection fails."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        sent = {"Content-Type": "application/json", **(headers or {})}
        if secret is not None:
            sent["X-Telegram-Bot-Api-Secret-Token"] = secret
        data = body.encode() if isinstance(body, str) else body
        conn.request(method, path, body=data, headers=sent)
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
