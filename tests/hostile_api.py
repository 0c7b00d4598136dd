"""A Bot API server for the tests that answers ``getUpdates`` with whatever bytes a test scripts.

The fake Bot API (``telegram_fence.testing.FakeBotAPI``) behaves like Telegram; this one behaves like a
faulty proxy or an attacker in between: replayed ids, ids out of order, duplicate JSON keys, lone
surrogates, huge answers. Each ``getUpdates`` takes the next scripted body (and records the offset it
was asked with); with nothing scripted it answers the held items at or above the offset, as Telegram
would (an empty list after a short wait when there are none). Every other method answers
``{"ok": true, "result": true}``.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawQ"

Body = bytes | Callable[[int], bytes]


def message(update_id: int, chat_id: int = 1, text: str = "hi") -> dict[str, Any]:
    """A raw text-message update as Telegram sends it."""
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 1_700_000_000,
            "chat": {"id": chat_id, "type": "private"},
            "from": {"id": chat_id, "is_bot": False, "first_name": "A"},
            "text": text,
        },
    }


def answer(updates: Iterable[dict[str, Any]]) -> bytes:
    """The bytes of a successful ``getUpdates`` answer holding ``updates``."""
    return json.dumps({"ok": True, "result": list(updates)}).encode()


class HostileAPI:
    """The scripted server on 127.0.0.1; a context manager. ``api_url`` is telebot's URL template.

    ``script(*bodies)`` queues answers (bytes, or ``fn(offset) -> bytes``); ``offsets`` lists the offsets
    ``getUpdates`` was called with (0 when none was sent). Safe to use from the test thread while it runs.
    """

    def __init__(self, idle_wait: float = 0.1) -> None:
        self.offsets: list[int] = []
        self._bodies: deque[Body] = deque()
        self._held: list[tuple[int, bytes]] = []
        self._cond = threading.Condition()
        self._closing = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                parts = urllib.parse.urlsplit(self.path)
                method = parts.path.rsplit("/", 1)[-1]
                body = b'{"ok":true,"result":true}'
                if method == "getUpdates":
                    params = urllib.parse.parse_qs(parts.query)
                    body = server._next(int(params.get("offset", ["0"])[0]), idle_wait)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="hostile-api", daemon=True)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/bot{{0}}/{{1}}"

    def script(self, *bodies: Body) -> None:
        with self._cond:
            self._bodies.extend(bodies)
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Scripted answers not yet taken."""
        with self._cond:
            return len(self._bodies)

    def hold(self, *items: tuple[int, bytes]) -> None:
        """Keep raw items ``(update_id, json bytes)`` as Telegram keeps updates: once nothing is scripted,
        each ``getUpdates`` answers those with ``update_id >= offset`` (until a higher offset confirms them)."""
        with self._cond:
            self._held.extend(items)
            self._cond.notify_all()

    def _next(self, offset: int, idle_wait: float) -> bytes:
        with self._cond:
            self.offsets.append(offset)
            if not self._bodies and not self._closing and not self._due(offset):
                self._cond.wait(idle_wait)
            if not self._bodies:
                return b'{"ok":true,"result":[' + b",".join(raw for _, raw in self._due(offset)) + b"]}"
            body = self._bodies.popleft()
        return body(offset) if callable(body) else body

    def _due(self, offset: int) -> list[tuple[int, bytes]]:
        return [item for item in self._held if item[0] >= offset]

    def __enter__(self) -> HostileAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
