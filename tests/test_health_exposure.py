"""Health and metrics stay off the public webhook port unless asked for, and no scrape writes to the store:
``/readyz`` proves the store would take a write without making one. Real HTTP against real fences, on real SQLite
files and real PostgreSQL tables."""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import serving
from pg_support import requires_pg, store_of

from telegram_fence import Fence


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture
def webhook_fence(bot: telebot.TeleBot, db: str) -> Iterator[Fence]:
    fence = Fence(bot, db)
    yield fence
    fence.stop()
    assert fence.join()


def test_the_webhook_port_answers_no_health_path_by_default(webhook_fence: Fence) -> None:
    """Without ``health=True`` a GET of ``/metrics``, ``/livez`` or ``/readyz`` on the webhook app is refused like
    any request that is not a delivery (405), and says nothing of the fence."""
    app = webhook_fence.webhook_app("s3cret")
    webhook_fence.start()
    with serving(app) as port:
        for path in ("/metrics", "/livez", "/readyz"):
            status, body = _get(f"http://127.0.0.1:{port}{path}")
            assert status == 405 and b"telegram_fence" not in body and b"ok" not in body, (path, body)


def test_the_webhook_port_answers_the_health_paths_when_asked(webhook_fence: Fence) -> None:
    """With ``health=True`` the webhook app answers ``/livez``, ``/readyz`` and ``/metrics`` beside the intake."""
    app = webhook_fence.webhook_app("s3cret", health=True)
    webhook_fence.start()
    with serving(app) as port:
        assert _get(f"http://127.0.0.1:{port}/livez") == (200, b"ok\n")
        assert _get(f"http://127.0.0.1:{port}/readyz") == (200, b"ok\n")
        status, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and b"telegram_fence_ready 1" in body


def _meta(store: Any) -> list[tuple[Any, ...]]:
    """Every row of the store's meta table, with PostgreSQL's row version (``xmin``: changed by any write)."""
    if hasattr(store, "table"):
        with store.read() as conn:
            return sorted(conn.execute(f"SELECT key, value, xmin::text FROM {store.table}_meta").fetchall())
    with store.read() as conn:
        return sorted(conn.execute("SELECT key, value FROM fence_meta").fetchall())


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=requires_pg)])
def test_scrapes_write_nothing_to_the_store(bot: telebot.TeleBot, tmp_path: Path, kind: str) -> None:
    """Twenty ``/readyz`` and ``/metrics`` answers of a ready webhook fence leave the store as it was: its meta
    table row for row (on SQLite the file and its WAL byte for byte), while readiness still checked the writes."""
    with store_of(kind, tmp_path, "tf_scrape") as store:
        fence = Fence(bot, store)
        app = fence.webhook_app("s3cret", health=True)
        fence.start()
        try:
            with serving(app) as port:
                url = f"http://127.0.0.1:{port}"
                assert _get(url + "/readyz") == (200, b"ok\n")
                before = _meta(store)
                files = _files(tmp_path) if kind == "sqlite" else None
                for _ in range(10):
                    assert _get(url + "/readyz") == (200, b"ok\n")
                    assert _get(url + "/metrics")[0] == 200
                assert _meta(store) == before
                assert all(row[0] != "health_probe" for row in before)
                if files is not None:
                    assert _files(tmp_path) == files
        finally:
            fence.stop()
            assert fence.join()


def _files(directory: Path) -> dict[str, str]:
    """The digest of the SQLite file and of its WAL."""
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
            for name in ("bot.db", "bot.db-wal") if os.path.exists(directory / name)}


@pytest.mark.parametrize("health", [False, True])
def test_run_webhook_serves_the_health_paths_on_its_port_only_when_asked(tmp_path: Path, health: bool) -> None:
    """``run_webhook``'s own server answers ``GET /livez`` 405 by default and 200 with ``health=True``."""
    import socket
    import threading

    from telegram_fence.testing import FakeBotAPI

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with FakeBotAPI() as api:
        fence = Fence(telebot.TeleBot(api.token), str(tmp_path / "bot.db"), shutdown_timeout=5.0)
        codes: list[Any] = []
        thread = threading.Thread(target=lambda: codes.append(fence.run_webhook(
            f"http://127.0.0.1:{port}/hook", secret_token="s3cret", listen=("127.0.0.1", port), health=health)),
            name="run-webhook")
        thread.start()
        try:
            assert api.wait_for(lambda: len(api.calls_to("setWebhook")) == 1, timeout=20)
            status, body = _get(f"http://127.0.0.1:{port}/livez")
            assert (status, body == b"ok\n") == ((200, True) if health else (405, False)), (status, body)
        finally:
            fence.stop()
            thread.join(30)
        assert not thread.is_alive() and codes == [0]
