"""``python -m telegram_fence.testing``: the fake Bot API server on its own, with a real bot (examples/echo_bot.py)
talking to it; real processes, real sockets."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

from helpers import signal_when_ready

from telegram_fence.testing import ReadinessSocket

ROOT = Path(__file__).resolve().parent.parent


def _lines(stream: object) -> queue.Queue[str]:
    """The lines of a child's stdout, as they come (a reader thread, ended by the stream's end)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line.rstrip("\n"))

    threading.Thread(target=read, name="test-fake-alone-stdout", daemon=True).start()
    return lines


def _until(lines: queue.Queue[str], wanted: str, timeout: float = 30) -> list[str]:
    seen = []
    while wanted not in seen:
        seen.append(lines.get(timeout=timeout))
    return seen


def test_a_user_tries_the_echo_example_against_the_fake_server_alone(tmp_path: Path) -> None:
    """The server prints the two variables a bot needs; a line typed is a message, the bot's answer is printed;
    SIGINT stops the server with exit 0 and nothing on stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen([sys.executable, "-m", "telegram_fence.testing", "--chat", "7"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    bot = None
    try:
        assert server.stdin is not None
        lines = _lines(server.stdout)
        head = [lines.get(timeout=30) for _ in range(3)]
        assert head[0].startswith("TELEGRAM_BOT_TOKEN=") and head[1].startswith("TELEGRAM_API_URL=http://127.0.0.1:")
        assert "Ctrl-C stops it" in head[2]
        settings = dict(line.split("=", 1) for line in head[:2])
        with ReadinessSocket() as ready:
            bot = subprocess.Popen([sys.executable, str(ROOT / "examples" / "echo_bot.py")], cwd=tmp_path,
                                   env=ready.env(**{**env, **settings}), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
            server.stdin.write("hello there\n")
            server.stdin.flush()
            assert "bot -> 7: hello there" in _until(lines, "bot -> 7: hello there")
            signal_when_ready(bot, ready, signal.SIGINT)
            assert bot.wait(30) == 0
        server.send_signal(signal.SIGINT)
        assert server.wait(30) == 0
        assert server.stderr is not None and server.stderr.read() == ""
    finally:
        for child in (bot, server):
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()


def test_bad_arguments_are_one_line_and_exit_2() -> None:
    """A port that is no number is one line naming it (argparse's usage dump is left out), exit 2."""
    result = subprocess.run([sys.executable, "-m", "telegram_fence.testing", "--port", "x"], capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "--port" in result.stderr
