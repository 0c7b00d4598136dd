"""Small helpers shared by the project's tests: waiting for a condition, a quick fence and its bounded stop, a
signal to a child bot once it is ready for it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from telegram_fence import Fence
from telegram_fence.testing import ReadinessSocket


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
    from telegram_fence.ingress.wsgi_server import WsgiServer

    server = WsgiServer(app, "127.0.0.1", 0)
    server.start()
    try:
        yield server.port
    finally:
        server.stop()
        assert server.join(10)
        assert app.close(10)


def stored_ids(store: Any) -> list[int]:
    """The update ids a SQLite store holds, in order."""
    with store.write() as conn:
        return [row[0] for row in conn.execute("SELECT update_id FROM fence_updates ORDER BY update_id")]
