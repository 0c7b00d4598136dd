"""Small helpers shared by the project's tests: waiting for a condition, a quick fence and its bounded stop, a
signal to a child bot once it is ready for it, a webhook delivery to a WSGI app and whether it is on disk, a SQLite
store that notes the threads of its calls, a fence run over a burst of messages and the check that each ran once, in
its chat's order."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw
import pytest

from telegram_fence import Fence, SqliteUpdateStore
from telegram_fence.testing import ApiError, ReadinessSocket


def _json_bound_by_recursion_limit() -> bool:
    """Whether this interpreter's JSON reader stops at ``sys.getrecursionlimit()`` (3.10 and 3.11: yes; 3.12+ use a
    C stack bound far deeper than any payload a store keeps)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)
    try:
        json.loads("[" * 600 + "]" * 600)
    except RecursionError:
        return True
    finally:
        sys.setrecursionlimit(limit)
    return False


#: Skips a test of "a payload the store keeps but Python cannot read" where no such payload exists: on Python 3.12+
#: the JSON reader is not bound by the recursion limit, and it reads every payload SQLite's reader keeps.
needs_recursion_bound_json = pytest.mark.skipif(
    not _json_bound_by_recursion_limit(),
    reason="this Python's JSON reader is not bound by the recursion limit: every payload a store keeps decodes "
    "here, so the case cannot arise",
)


def eventually(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Wait until ``predicate()`` is truthy (state owned by other threads or processes); False on timeout."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        pause.wait(interval)


def make_fence(bot: Any, store: Any, **options: Any) -> Fence:
    """A fence tuned for tests: short long polls and leases, a short shutdown bound (each overridable)."""
    options.setdefault("long_poll_timeout", 0.3)
    options.setdefault("lease", 2.0)
    options.setdefault("shutdown_timeout", 3.0)
    return Fence(bot, store, **options)


def stop(fence: Fence) -> None:
    """Stop ``fence`` and fail the test unless it shut down within its bound."""
    fence.stop()
    assert fence.join(10), "the fence did not shut down within its bound"


def signal_when_ready(child: subprocess.Popen[Any], ready: ReadinessSocket, signum: int = signal.SIGTERM,
                      timeout: float = 30.0) -> None:
    """Send ``signum`` to ``child`` once it said ``READY=1`` on ``ready`` (its fence's SIGINT/SIGTERM handlers are
    in place: before that, Python's default disposition kills it); fail the test when it never says so."""
    assert ready.wait_ready(child, timeout), f"the child did not say READY=1 (exit code {child.poll()})"
    child.send_signal(signum)


@contextmanager
def serving(app: Any) -> Iterator[int]:
    """Serve the WSGI ``app`` (a webhook intake) on a free port of 127.0.0.1; yields the port. On exit the server
    stops and is joined, and the app is closed (its threads end and are joined): each must happen within 10 s."""
    from telegram_fence.ingress.webhook import WsgiServer

    server = WsgiServer(app, "127.0.0.1", 0)
    server.start()
    try:
        yield server.port
    finally:
        server.stop()
        assert server.join(10)
        assert app.close(10)


def rows(store: Any, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """Every row ``query`` yields on a SQLite store's connection (the committed rows, and the open block's own)."""
    with store.read() as conn:
        return conn.execute(query, params).fetchall()


def pragma(store: Any, name: str) -> Any:
    """A SQLite store connection's value of pragma ``name``."""
    with store.read() as conn:
        return conn.pragma(name)


def stored_ids(store: Any) -> list[int]:
    """The update ids a SQLite store holds, in order."""
    with store.write() as conn:
        return [row[0] for row in conn.execute("SELECT update_id FROM fence_updates ORDER BY update_id")]


def on_disk(path: str, update_id: int) -> bool:
    """Whether the SQLite fence database at ``path`` holds ``update_id``, read on a read-only connection of its own
    (what another process would see: committed rows only)."""
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute("SELECT 1 FROM fence_updates WHERE update_id = ?", (update_id,)).fetchone() is not None
    finally:
        conn.close()


def webhook_deliverer(app: Any, secret: str, *, chats: int = 1,
                      stored: Callable[[int], bool] | None = None) -> Callable[[int], str]:
    """A function delivering update ``n`` (a message "hi" in chat ``n % chats``) to the webhook WSGI ``app`` with
    ``secret``, as Telegram does, and returning the status line; with ``stored``, a 200 fails the test unless
    ``stored(n)`` holds when it is answered (the update was on disk before its 200)."""

    def deliver(update_id: int) -> str:
        body = json.dumps({"update_id": update_id, "message": {
            "message_id": update_id, "date": 1_700_000_000, "chat": {"id": update_id % chats, "type": "private"},
            "text": "hi"}}).encode()
        environ = {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
                   "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": secret}
        statuses: list[str] = []
        b"".join(app(environ, lambda status, headers: statuses.append(status)))
        if stored is not None and statuses[0].startswith("200"):
            assert stored(update_id), f"update {update_id} was answered 200 before it was on disk"
        return statuses[0]

    return deliver


@contextmanager
def fence_through(api: Any, bot: Any, store: Any, count: int, *, chats: int, lease: float) -> Iterator[Fence]:
    """Push ``count`` messages (texts ending in 0 … count-1) to chats 1 … ``chats`` of the fake ``api``, run a
    fence for ``bot`` on ``store`` (``lease``; short long polls and shutdown), and yield it, still running, once
    Telegram saw every one confirmed and the store settled all ``count``; stopped and joined (15 s) after the block.
    Fails the test when either wait runs out (60 s each)."""
    ids = api.push_messages(count, chats=list(range(1, chats + 1)))
    fence = Fence(bot, store, long_poll_timeout=0.3, lease=lease, shutdown_timeout=3.0)
    fence.start()
    try:
        assert api.wait_confirmed(ids[-1] + 1, timeout=60)
        assert eventually(lambda: fence.stats()["settled"] == count, timeout=60)
        yield fence
    finally:
        fence.stop()
        assert fence.join(15)


def assert_each_once_in_chat_order(seen: dict[int, list[int]], count: int) -> None:
    """``seen`` (chat -> the message numbers its handler ran, in the order they ran) holds each of 0 … count-1
    exactly once, and every chat's in increasing order."""
    handled = [number for numbers in seen.values() for number in numbers]
    assert sorted(handled) == list(range(count)), "an update was lost or handled twice"
    for chat, numbers in seen.items():
        assert numbers == sorted(numbers), f"chat {chat}'s updates ran out of order"


class ThreadNotingStore(SqliteUpdateStore):
    """A real SQLite store that notes the name of the thread of each call of the methods named ``noted``
    (``calls``: ``(method, thread)`` in call order, behind ``lock``)."""

    def __init__(self, path: str, noted: Sequence[str]) -> None:
        super().__init__(path)
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []
        for name in noted:
            setattr(self, name, self._noting(name, getattr(self, name)))

    def _noting(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.calls.append((name, threading.current_thread().name))
            return method(*args, **kwargs)

        return call

    def stored(self, update_id: int) -> bool:
        """Whether ``update_id`` is stored (read on a connection of its own: what another process would see)."""
        return on_disk(self.path, update_id)

    def threads_of(self, *names: str) -> set[str]:
        """The names of the threads that called any of the methods ``names``."""
        with self.lock:
            return {thread for method, thread in self.calls if method in names}


def serve_files(api: Any, files: dict[str, Path]) -> None:
    """Answer ``getFile(file_id)`` on ``api`` as a local Bot API server does: the path of ``files[file_id]``."""

    def get_file(params: dict[str, Any]) -> dict[str, Any]:
        file_id = str(params.get("file_id") or "")
        if file_id not in files:
            raise ApiError(400, "Bad Request: invalid file_id")
        path = Path(files[file_id]).absolute()
        size = path.stat().st_size if path.is_file() else 0
        return {"file_id": file_id, "file_unique_id": f"U{file_id}", "file_size": size, "file_path": str(path)}

    api.add_method("getFile", get_file)
