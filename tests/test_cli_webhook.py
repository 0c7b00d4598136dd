"""`telegram-fence webhook info|delete` as a user runs them: real processes, the fake Bot API over real HTTP,
real files; the server from --api-url or $TELEGRAM_API_URL, one line per failure, distinct exit codes."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import apsw
import pytest
from webhook_support import SECRET, TOKEN

from telegram_fence import SqliteUpdateStore
from telegram_fence.ingress.webhook_guard import register
from telegram_fence.testing import FakeBotAPI


def _cli(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("TELEGRAM_API_URL", "TELEGRAM_BOT_TOKEN")}
    return subprocess.run([sys.executable, "-m", "telegram_fence", *argv], env={**base, **env},
                          capture_output=True, text=True, timeout=60)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("how", ["env", "option"])
def test_info_and_delete_go_to_the_server_named_by_api_url_or_the_environment(tmp_path: Path, how: str) -> None:
    """With $TELEGRAM_API_URL or --api-url naming the fake, info shows its webhook and delete deletes it there."""
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    with FakeBotAPI(token=TOKEN) as api:
        register(TOKEN, "https://prod.example.com/hook", SECRET)
        env = {"TELEGRAM_BOT_TOKEN": TOKEN}
        option: list[str] = []
        if how == "env":
            env["TELEGRAM_API_URL"] = api.base_url
        else:
            option = ["--api-url", api.api_url]
        info = _cli("webhook", "info", *option, **env)
        assert info.returncode == 0, info.stderr
        assert "prod.example.com" in info.stdout
        deleted = _cli("webhook", "delete", str(db), *option, **env)
        assert deleted.returncode == 0, deleted.stderr
        assert api.webhook_url == ""


@pytest.mark.parametrize("command", ["info", "delete"])
def test_an_unreachable_bot_api_is_one_short_line_and_exit_3(tmp_path: Path, command: str) -> None:
    """A Bot API server nobody listens on: one line on stderr naming the server and the cause (no chain
    repeated, no traceback), exit 3 (could not reach Telegram), not 2 (bad input)."""
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    argv = ["webhook", command, *([str(db)] if command == "delete" else [])]
    done = _cli(*argv, TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_API_URL=f"http://127.0.0.1:{_closed_port()}")
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("telegram-fence: could not reach Telegram at 127.0.0.1:")
    assert "Connection refused" in line and "getWebhookInfo" in line
    assert len(line) < 250, line
    assert TOKEN.split(":")[1] not in line


def test_a_token_telegram_does_not_know_is_bad_input(tmp_path: Path) -> None:
    """A token the server answers 401 to exits 2 with one line saying the token is wrong."""
    with FakeBotAPI(token=TOKEN) as api:
        done = _cli("webhook", "info", "--api-url", api.api_url, TELEGRAM_BOT_TOKEN="654321:" + "B" * 35)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "token is wrong" in done.stderr


def test_delete_refuses_another_applications_sqlite_file_and_leaves_it_byte_identical(tmp_path: Path) -> None:
    """`webhook delete` on a SQLite file without the fence's tables exits 2 naming it, calls no Bot API method,
    and leaves the file byte for byte as it was (no fence tables, no WAL switch, no -wal/-shm)."""
    other = tmp_path / "app.db"
    conn = apsw.Connection(str(other))
    conn.execute("CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT); INSERT INTO customers VALUES (1, 'a')")
    conn.close()
    before = _digest(other)
    with FakeBotAPI(token=TOKEN) as api:
        register(TOKEN, "https://prod.example.com/hook", SECRET)
        calls = len(api.calls)
        done = _cli("webhook", "delete", str(other), TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_API_URL=api.base_url)
        assert len(api.calls) == calls
        assert api.webhook_url != ""
    assert done.returncode == 2, done.stderr
    assert "not a telegram_fence database" in done.stderr and str(other) in done.stderr
    assert _digest(other) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_retry_refuses_an_exhaustion_without_a_payload_and_changes_nothing(tmp_path: Path) -> None:
    """An update too deep to read, delivered over real HTTP, is kept as a payload-less exhaustion; `retry` of it
    exits 1 saying it holds no payload to run, and its row (state, error, attempts) and the exhaustion are as before."""
    from webhook_support import post

    from telegram_fence.ingress.webhook import WebhookIntake, WsgiServer

    db = tmp_path / "bot.db"
    store = SqliteUpdateStore(db)
    app = WebhookIntake(store, SECRET)
    server = WsgiServer(app, "127.0.0.1", 0)
    server.start()
    try:
        deep = '{"update_id": 5, "message": ' + "[" * 100_000 + "]" * 100_000 + "}"
        assert post(server.port, deep)[0] == 200
    finally:
        server.stop()
        assert server.join(10) and app.close(10)

    def row() -> tuple[object, ...]:
        with store.write() as conn:
            return tuple(conn.execute("SELECT state, attempt, error, payload, acknowledged FROM fence_updates "
                                      "WHERE update_id = 5").fetchone())

    before = row()
    assert before[0] == 3 and json.loads(str(before[3])) == {"update_id": 5}
    assert [e.identity.update_id for e in store.due_exhaustions()] == [5]
    done = _cli("retry", str(db), "5")
    assert done.returncode == 1, done.stderr
    assert "no payload to run" in done.stderr and "back to pending" not in done.stdout
    assert done.stderr.startswith("telegram-fence: update 5: not retried")
    assert row() == before
    assert [e.identity.update_id for e in store.due_exhaustions()] == [5]
    store.close()
