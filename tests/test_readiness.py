"""Readiness: ``run()`` and ``run_webhook()`` say ``READY=1`` on ``$NOTIFY_SOCKET`` once a SIGTERM stops them cleanly.

The crash drill once failed with "the bot exited with -15 after SIGTERM, not 0": its last kill landed after the last
note, so it sent SIGTERM to the restarted bot while Python was still importing, before the fence had installed its
handlers. A harness now waits for ``READY=1`` first; these tests pin that the signal comes after the handlers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from webhook_support import SECRET, TOKEN

from telegram_fence.cli.demo import DrillDb, _spawn, _wait_done
from telegram_fence.runtime.signals import notify
from telegram_fence.testing import FakeBotAPI, ReadinessSocket

TESTS = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _finish(child: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str]:
    try:
        _, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
        raise AssertionError(f"the child did not exit within {timeout} s; stderr:\n{err}") from None
    return child.returncode, err


@pytest.mark.parametrize("door", ["polling", "webhook"])
def test_sigterm_at_once_after_ready_exits_zero(tmp_path: Path, door: str) -> None:
    """A SIGTERM sent the moment the bot said READY=1 (nothing handled yet, nothing waited for) is a graceful
    stop: exit 0, no warning, and STOPPING=1 was said after READY=1."""
    db = str(tmp_path / "bot.db")
    with FakeBotAPI(token=TOKEN) as api, ReadinessSocket() as ready:
        if door == "polling":
            argv = [sys.executable, str(TESTS / "stop_child.py"), db]
            env = ready.env(TELEGRAM_API_URL=api.api_url, TELEGRAM_BOT_TOKEN=api.token)
        else:
            argv = [sys.executable, str(TESTS / "webhook_stop_child.py"), db, api.api_url, str(_free_port())]
            env = ready.env(TF_TEST_TOKEN=TOKEN, TF_TEST_SECRET=SECRET)
        child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            assert ready.wait_ready(child, timeout=30), f"no READY=1; exit {child.poll()}"
            child.send_signal(signal.SIGTERM)
            code, err = _finish(child)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert code == 0, err
        assert "Traceback" not in err and "WARNING" not in err, err
        assert ready.heard(child.pid) == ["READY=1", "STOPPING=1"]


def test_the_drills_restart_after_the_last_note_stops_cleanly(tmp_path: Path) -> None:
    """The flake's moment, made certain: every note is written, the bot is killed and restarted, and the SIGTERM
    goes out as soon as the restarted bot says READY=1: exit 0 (without the wait it meets the default disposition)."""
    db = str(tmp_path / "drill.db")
    with FakeBotAPI(max_long_poll=1.0) as api, ReadinessSocket() as ready:
        api.push_messages(5, chats=[1])
        child = _spawn(api.api_url, api.token, db, 1.0, 2, ready)
        try:
            assert _wait_done(DrillDb(db), 5, time.monotonic() + 60)
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            child = _spawn(api.api_url, api.token, db, 1.0, 2, ready)
            assert ready.wait_ready(child, timeout=30)
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=20) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_wait_ready_is_false_for_a_child_that_exits_without_it() -> None:
    """A process that ends without READY=1 is noticed at its exit, not after the timeout."""
    with ReadinessSocket() as ready:
        child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], env=ready.env())
        assert not ready.wait_ready(child, timeout=60)
        assert child.returncode == 3


def test_wait_ready_tells_children_apart() -> None:
    """One socket serves a run of restarts: a READY=1 from an earlier child does not count for the next one."""
    code = "import sys; from telegram_fence.runtime.signals import notify; sys.exit(0 if notify(*sys.argv[1:]) else 9)"
    env_path = os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    with ReadinessSocket() as ready:
        first = subprocess.Popen([sys.executable, "-c", code, "READY=1"], env=ready.env(PYTHONPATH=env_path))
        assert ready.wait_ready(first, timeout=30)
        assert first.wait(10) == 0
        second = subprocess.Popen([sys.executable, "-c", code, "STATUS=starting"], env=ready.env(PYTHONPATH=env_path))
        assert not ready.wait_ready(second, timeout=30)
        assert second.returncode == 0
        assert ready.heard(second.pid) == ["STATUS=starting"]
        assert ready.heard(first.pid) == ["READY=1"]


def test_notify_sends_nothing_without_a_socket_and_never_raises(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    """No $NOTIFY_SOCKET, one nobody listens on, or one that is not a Unix socket address: False, no exception."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "@telegram-fence-test-nobody-listens-here")
    assert notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert notify("READY=1") is False


def test_notify_reaches_a_path_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """systemd's usual form, a socket path: the fields arrive as one datagram, one per line."""
    # a directory of its own under the system's temporary root: pytest's tmp_path can exceed the 108 bytes of a
    # Unix socket address
    with tempfile.TemporaryDirectory(prefix="tf-", dir="/tmp") as short, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        path = Path(short) / "notify.sock"
        listener.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert notify("READY=1", "STATUS=serving")
        listener.settimeout(5)
        assert listener.recv(4096) == b"READY=1\nSTATUS=serving"
