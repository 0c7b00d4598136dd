"""Helpers for the outbox tests: a scripted loopback HTTP collector, and a child process to kill.

As a script (``python outbox_child.py MODE DB URL UPDATES_JSON``) it opens the store (a SQLite file, or with
``TF_OUTBOX_CHILD_DSN`` set the PostgreSQL inbox table ``DB``), builds an outbox capturing chat 1, and then,
by MODE:

- ``deliver``: records the updates (with their captures), prints ``recorded``, starts the delivery
  thread and waits forever — the test kills it while the collector holds the request open;
- ``hang-in-hook``: records the updates with an ``authorize`` that prints ``in-hook`` and blocks
  forever, i.e. inside the record transaction — the test kills it there.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHILD_LEASE = 30.0
CHILD_TIMEOUT = 20.0
CAPTURED_CHAT = 1


@dataclass
class Reply:
    """One scripted answer: status, headers, body; ``hold`` seconds to keep the request open first."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: str = '{"ok":true}'
    hold: float = 0.0


@dataclass
class Received:
    """One request the collector got."""

    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Collector:
    """A real HTTP collector on loopback that records POSTs and answers from a script (default 200).

    ``close()`` releases held requests, stops the server and joins its thread.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.received: list[Received] = []
        self.script: deque[Reply] = deque()
        self.default = Reply()
        self.release = threading.Event()
        self._cond = threading.Condition()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with collector._cond:
                    collector.received.append(Received(self.path, dict(self.headers.items()), body))
                    reply = collector.script.popleft() if collector.script else collector.default
                    collector._cond.notify_all()
                if reply.hold:
                    collector.release.wait(reply.hold)
                data = reply.body.encode()
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (timeout) or was killed

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}/capture"
        self._thread = threading.Thread(
            target=self.server.serve_forever, args=(0.02,), name="test-collector", daemon=True
        )
        self._thread.start()

    def answer(self, *replies: Reply) -> None:
        """Queue scripted answers for the next requests."""
        with self._cond:
            self.script.extend(replies)

    def wait_for(self, count: int, timeout: float = 10.0) -> bool:
        """Wait until at least ``count`` requests arrived; ``False`` on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.received) >= count, timeout)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


def update(update_id: int, chat_id: int, text: str = "hello", message_id: int | None = None) -> dict[str, Any]:
    """A raw text-message update as Telegram sends it."""
    return {
        "update_id": update_id,
        "message": {
            "message_id": message_id if message_id is not None else update_id * 10,
            "date": 1_700_000_000 + update_id,
            "chat": {"id": chat_id, "type": "private"},
            "from": {"id": chat_id, "is_bot": False, "first_name": "A"},
            "text": text,
        },
    }


def main(argv: list[str]) -> None:
    import os

    from telegram_fence.delivery.outbox import CaptureRule, Outbox
    from telegram_fence.store.sqlite import SqliteUpdateStore

    mode, db, url, updates_json = argv
    updates = json.loads(updates_json)
    dsn = os.environ.get("TF_OUTBOX_CHILD_DSN")  # set: ``db`` is a PostgreSQL inbox table on that server
    if dsn:
        from telegram_fence.store.postgres import PostgresUpdateStore

        store: Any = PostgresUpdateStore(dsn, table=db)
    else:
        store = SqliteUpdateStore(db)
    if mode == "deliver":
        outbox = Outbox(store, url, rule=CaptureRule(chats={CAPTURED_CHAT}), lease=CHILD_LEASE, timeout=CHILD_TIMEOUT)
        outbox.store.record(updates, updates[-1]["update_id"] + 1, on_record=outbox.record_hook)
        print("recorded", flush=True)
        outbox.start()
    elif mode == "hang-in-hook":

        def authorize(update: Any) -> bool:
            print("in-hook", flush=True)
            threading.Event().wait()
            return True

        outbox = Outbox(store, url, rule=CaptureRule(authorize=authorize))
        outbox.store.record(updates, updates[-1]["update_id"] + 1, on_record=outbox.record_hook)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    threading.Event().wait()  # until killed


if __name__ == "__main__":
    main(sys.argv[1:])
