"""Stopping: a stop closes the long poll instead of waiting it out; a second signal stops at once; logs
reach stderr for a program that configured no logging."""

from __future__ import annotations

import http.client
import io
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import telebot
from helpers import eventually, signal_when_ready
from telebot import apihelper

from telegram_fence import Fence, SqliteUpdateStore
from telegram_fence.ingress.long_poll import LongPoll
from telegram_fence.testing import FakeBotAPI, ReadinessSocket
from telegram_fence.textlog import fallback_logging, install_fallback

CHILD = str(Path(__file__).with_name("stop_child.py"))
WAIT = 90  # seconds a child has to start and answer: a hang guard (a loaded 2-core host under -X dev took over 30)


def _spawn(api: FakeBotAPI, db: str, ready: ReadinessSocket, *flags: str, **env: str) -> subprocess.Popen[str]:
    child_env = ready.env(TELEGRAM_API_URL=api.api_url, TELEGRAM_BOT_TOKEN=api.token, **env)
    return subprocess.Popen([sys.executable, *flags, CHILD, db], env=child_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(child: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str]:
    try:
        _, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
        raise AssertionError(f"the child did not exit within {timeout} s; stderr:\n{err}") from None
    return child.returncode, err


def test_stop_during_a_long_poll_returns_at_once(tmp_path: Path) -> None:
    """stop() + join() during a 60 s long poll returns within a few seconds, and the update Telegram
    had not delivered yet is handled by the next fence (nothing lost)."""
    with FakeBotAPI() as api:
        bot = telebot.TeleBot(api.token, threaded=False)
        handled: list[str] = []
        fence = Fence(bot, str(tmp_path / "bot.db"), long_poll_timeout=60)
        fence.handler(lambda update: handled.append(update.message.text))
        fence.start()
        assert api.wait_for(lambda: api.polling, timeout=10)
        began = time.monotonic()
        fence.stop()
        assert fence.join(10)
        assert time.monotonic() - began < 5, "the stop waited for the long poll"
        api.push_message(1, "after the stop")
        again = Fence(bot, str(tmp_path / "bot.db"), long_poll_timeout=60)
        again.handler(lambda update: handled.append(update.message.text))
        again.start()
        try:
            assert api.wait_for(lambda: handled == ["after the stop"], timeout=10)
        finally:
            again.stop()
            assert again.join(10)


def test_stop_through_telebot_path_does_not_wait_for_the_long_poll(tmp_path: Path) -> None:
    """With telebot's request path (a custom session) the stop leaves the long poll to run out and returns."""
    session = requests.Session()
    previous = apihelper.session
    apihelper.session = session
    try:
        with FakeBotAPI() as api:
            fence = Fence(telebot.TeleBot(api.token, threaded=False), str(tmp_path / "bot.db"), long_poll_timeout=8)
            fence.handler(lambda update: None)
            fence.start()
            assert api.wait_for(lambda: api.polling, timeout=10)
            poller = fence._poller
            assert poller is not None and poller._connection is None  # a call through telebot: not interruptible
            began = time.monotonic()
            fence.stop()
            assert fence.join(10)
            assert time.monotonic() - began < 5, "the stop waited for the long poll"
            api.push_message(1, "arrives at the abandoned call")
            assert eventually(lambda: not poller.alive, timeout=20)
            with SqliteUpdateStore(str(tmp_path / "bot.db")) as store:
                assert store.next_offset() == 0, "the abandoned call's update was recorded"
    finally:
        apihelper.session = previous
        session.close()


def test_a_stop_while_start_builds_the_pool_claims_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal that lands while start() is still building its parts (the pool not yet the fence's): the pool is
    told once it exists, so an update left pending by an earlier run is not claimed, and the join ends at once."""
    from telegram_fence.runtime import fence as fence_module

    store = SqliteUpdateStore(tmp_path / "bot.db")
    store.record([{"update_id": 1, "message": {"message_id": 1, "date": 0, "chat": {"id": 5, "type": "private"},
                                               "text": "hi"}}], 2)
    ran: list[int] = []
    build = fence_module._build_parts

    def build_then_signal(built: Fence) -> Any:
        parts = build(built)
        built.stop()  # as a SIGTERM handler would, before start() holds the pool
        return parts

    monkeypatch.setattr(fence_module, "_build_parts", build_then_signal)
    with FakeBotAPI() as api, store:
        fence = Fence(telebot.TeleBot(api.token, threaded=False), store)
        fence.attempt_handler(lambda update, ctx: ran.append(update.update_id))
        fence.start()
        time.sleep(1.0)  # long enough for an unstopped pool to claim and handle the pending update
        assert fence.join(5)
        assert ran == []
        assert store.stats()["pending"] == 1


def test_sigint_on_an_idle_bot_exits_zero_promptly_without_a_warning(tmp_path: Path) -> None:
    """SIGINT on an idle `Fence.run()` with the default 25 s long poll: exit 0 within seconds, nothing at
    WARNING or above on stderr."""
    with FakeBotAPI() as api, ReadinessSocket() as ready:
        child = _spawn(api, str(tmp_path / "bot.db"), ready)
        api.push_message(1, "hello")
        assert api.wait_sent(1, timeout=WAIT)
        assert api.wait_for(lambda: api.polling, timeout=10)
        began = time.monotonic()
        signal_when_ready(child, ready, signal.SIGINT)
        code, err = _finish(child)
        elapsed = time.monotonic() - began
    assert code == 0, err
    assert elapsed < 5, f"stopping took {elapsed:.1f} s"
    for level in ("WARNING", "ERROR", "CRITICAL", "Traceback"):
        assert level not in err, err


def _blocked_signals(pid: int) -> dict[int, set[int]]:
    """Which of SIGINT and SIGTERM each thread of process ``pid`` blocks, by thread id (from ``/proc``)."""
    masks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        line = next(line for line in (task / "status").read_text().splitlines() if line.startswith("SigBlk:"))
        blocked = int(line.split()[1], 16)
        masks[int(task.name)] = {sig for sig in (signal.SIGINT, signal.SIGTERM) if blocked >> (sig - 1) & 1}
    return masks


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads each thread's signal mask from /proc")
def test_only_the_main_thread_of_a_running_bot_can_take_sigint_or_sigterm(tmp_path: Path) -> None:
    """Every thread `Fence.run()` starts, and the shutdown's after a first signal, blocks SIGINT and SIGTERM, so the
    kernel hands them to the main thread, whose handler stops the bot (or, the second time, exits at once): taken
    by another thread, a signal is only flagged while the main thread sleeps on."""
    with FakeBotAPI() as api, ReadinessSocket() as ready:
        child = _spawn(api, str(tmp_path / "bot.db"), ready)
        api.push_message(1, "hang")
        assert api.wait_for(lambda: [s.text for s in api.sent] == ["hanging"], timeout=WAIT)
        running = _blocked_signals(child.pid)
        signal_when_ready(child, ready, signal.SIGINT)
        assert child.stderr is not None
        assert "waiting" in child.stderr.readline()  # said once the shutdown's thread runs
        stopping = _blocked_signals(child.pid)
        child.send_signal(signal.SIGINT)
        code, err = _finish(child)
    assert code == 130, err
    assert running.pop(child.pid) == set() and stopping.pop(child.pid) == set(), "the main thread takes them"
    assert len(running) >= 3, running  # the writer, the heartbeat, the poller, the workers …
    assert len(stopping) > len(set(stopping) & set(running)), "the shutdown's thread was read"
    assert all(blocked == {signal.SIGINT, signal.SIGTERM} for blocked in [*running.values(), *stopping.values()]), \
        (running, stopping)


#: Python's development mode with every ResourceWarning an error (an unclosed socket, file or database would print)
_DEV = ("-X", "dev", "-W", "error::ResourceWarning", "-X", "tracemalloc=5")


def test_a_bot_in_development_mode_stops_on_sigint_without_a_single_warning(tmp_path: Path) -> None:
    """Under ``python -X dev -W error::ResourceWarning`` a default fenced bot answers, and SIGINT ends it with exit
    0 and nothing at all on stderr: no ResourceWarning (socket, file, database), no DeprecationWarning, no line."""
    with FakeBotAPI() as api, ReadinessSocket() as ready:
        child = _spawn(api, str(tmp_path / "bot.db"), ready, *_DEV)
        api.push_message(1, "hello")
        assert api.wait_for(lambda: "echo hello" in [s.text for s in api.sent], timeout=WAIT)
        signal_when_ready(child, ready, signal.SIGINT)
        code, err = _finish(child)
    assert (code, err) == (0, "")


def test_a_refused_token_in_development_mode_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """A token Telegram refuses (401): under development mode the bot prints the one line that says so, and
    nothing else (no ResourceWarning for the connections it opened), and exits 1."""
    with FakeBotAPI() as api, ReadinessSocket() as ready:
        api.revoke_token()
        child = _spawn(api, str(tmp_path / "bot.db"), ready, *_DEV)
        code, err = _finish(child)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, (code, err)
    assert "CRITICAL telegram_fence.fence: poller ended: Telegram refused the bot token" in lines[0]


def test_second_sigint_abandons_a_hanging_handler_and_nothing_is_lost(tmp_path: Path) -> None:
    """A second SIGINT while a handler hangs exits at once (130); after a restart the update is handled."""
    db = str(tmp_path / "bot.db")
    with FakeBotAPI() as api, ReadinessSocket() as ready:
        child = _spawn(api, db, ready, STOP_CHILD_LEASE="1")
        api.push_message(1, "hang")
        assert api.wait_for(lambda: [s.text for s in api.sent] == ["hanging"], timeout=WAIT)
        signal_when_ready(child, ready, signal.SIGINT)
        assert child.stderr is not None
        time.sleep(0.5)  # the graceful stop is under way (it would wait 10 s for the handler)
        assert child.poll() is None, "the first SIGINT did not wait for the running handler"
        began = time.monotonic()
        child.send_signal(signal.SIGINT)
        code, err = _finish(child)
        assert time.monotonic() - began < 3, "the second SIGINT did not stop at once"
        assert code == 130, err
        assert "second signal" in err
        again = _spawn(api, db, ready, STOP_CHILD_LEASE="1", STOP_CHILD_NO_HANG="1")
        try:
            assert api.wait_for(lambda: "echo hang" in [s.text for s in api.sent], timeout=WAIT)
        finally:
            signal_when_ready(again, ready)
            code, err = _finish(again)
        assert code == 0, err
        assert [s.text for s in api.sent].count("hanging") == 1, "the journaled reply was replayed, not resent"


def test_a_stop_that_waits_for_a_handler_says_so_and_then_says_it_abandoned_it(tmp_path: Path) -> None:
    """SIGINT while a handler hangs: a second later a line saying the stop waits (how long, for how many, that a
    second Ctrl-C stops at once); after ``shutdown_timeout`` a line saying the handler was abandoned; exit 0."""
    with FakeBotAPI() as api, ReadinessSocket() as ready:
        child = _spawn(api, str(tmp_path / "bot.db"), ready, STOP_CHILD_SHUTDOWN="2")
        api.push_message(1, "hang")
        assert api.wait_for(lambda: [s.text for s in api.sent] == ["hanging"], timeout=WAIT)
        began = time.monotonic()
        signal_when_ready(child, ready, signal.SIGINT)
        assert child.stderr is not None
        first = child.stderr.readline()
        said_at = time.monotonic() - began
        code, rest = _finish(child)
        elapsed = time.monotonic() - began
    assert 0.9 < said_at < 1.9, f"the waiting line came {said_at:.1f} s after the signal"
    assert "WARNING telegram_fence.fence: stopping: waiting (shutdown_timeout=2 s) for 1 running handler(s); a " \
        "second Ctrl-C" in first, first + rest
    assert code == 0 and 2 <= elapsed < 8, (code, elapsed, rest)
    lines = [line for line in rest.splitlines() if line.strip()]
    assert len(lines) == 1 and "1 handler(s) still running after shutdown_timeout=2 s abandoned" in lines[0], rest
    assert "Traceback" not in first + rest


def test_failing_handler_is_logged_to_stderr_without_logging_configured(tmp_path: Path) -> None:
    """With no logging configured, a failing handler's line reaches stderr with the update id and the error."""
    with FakeBotAPI() as api, ReadinessSocket() as ready:
        child = _spawn(api, str(tmp_path / "bot.db"), ready)
        update_id = api.push_message(1, "fail now")
        api.push_message(2, "fine")  # another chat: chat 1 waits for the failing update's retries
        assert api.wait_for(lambda: "echo fine" in [s.text for s in api.sent], timeout=WAIT)
        signal_when_ready(child, ready)
        code, err = _finish(child)
    assert code == 0, err
    lines = [line for line in err.splitlines() if "ValueError: cannot handle 'fail now'" in line]
    assert lines, err
    assert str(update_id) in lines[0] and "WARNING" in lines[0] and "telegram_fence" in lines[0]
    # where the bot's code raised it (its traceback comes only with the exhaustion, minutes later)
    raise_line = Path(CHILD).read_text(encoding="utf-8").splitlines().index(
        "            raise ValueError(f\"cannot handle {text!r}\")") + 1
    assert re.search(rf"cannot handle 'fail now' \(at \S*stop_child\.py:{raise_line} in echo\); will retry in "
                     r"\d+(\.\d)? s", lines[0]), lines[0]
    # and it has the shape docs/operations.md shows ("Logs when nothing is configured")
    page = " ".join((Path(__file__).parent.parent / "docs" / "operations.md").read_text(encoding="utf-8").split())
    shown = re.search(r"`… WARNING telegram_fence\.workers: (update [^`]*?) …`", page)
    assert shown is not None, "docs/operations.md shows no failed attempt's line"

    def shape(line: str) -> str:
        line = re.sub(r"\): .*? \(at \S+:\d+ in \w+\)", "): E (at F)", line)
        return re.sub(r"\d+(\.\d+)?", "N", line)

    real = lines[0].split(" WARNING telegram_fence.workers: ", 1)[1]
    assert shape(real).startswith(shape(shown[1])), (real, shown[1])


def test_abort_ends_a_get_in_progress_and_refuses_later_calls() -> None:
    """LongPoll.abort() from another thread ends a call blocked on a silent server, and every later call."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    poll = LongPoll()
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            poll.get(f"http://127.0.0.1:{port}/botX/getUpdates?timeout=60", 60)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call, name="test-long-poll")
    thread.start()
    try:
        peer, _ = server.accept()  # the request is sent; the server never answers
        began = time.monotonic()
        poll.abort()
        thread.join(10)
        assert not thread.is_alive() and time.monotonic() - began < 5
        assert outcome and isinstance(outcome[0], (OSError, http.client.HTTPException)), outcome
        with pytest.raises(ConnectionAbortedError):
            poll.get(f"http://127.0.0.1:{port}/botX/getUpdates", 1)
        peer.close()
    finally:
        server.close()


def test_fallback_logging_only_when_nothing_is_configured() -> None:
    """Readable lines with the record's fields go to the stream only while no handler is configured, and the
    handler is removed afterwards; tokens are masked."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()
    package = logging.getLogger("telegram_fence")
    stream = io.StringIO()
    try:
        with fallback_logging(stream) as handler:
            assert handler is not None and handler in package.handlers
            logging.getLogger("telegram_fence.workers").warning(
                "handler failed; will retry",
                extra={"update_id": 7, "attempt": 2, "err": ValueError("bad 123456:" + "A" * 35)})
        assert handler not in package.handlers
        line = stream.getvalue()
        assert line.count("\n") == 1
        assert "WARNING telegram_fence.workers: handler failed; will retry" in line
        assert "update_id=7" in line and "attempt=2" in line and "err=ValueError: bad" in line
        assert "A" * 35 not in line
        root.addHandler(logging.NullHandler())
        with fallback_logging(stream) as handler:
            assert handler is None
    finally:
        root.handlers[:] = saved


_STARTED_CHILD = """
import logging, sys, threading
import telebot
from telegram_fence import Fence
from telegram_fence.telegram import use_api_url

use_api_url(sys.argv[1])
ended = threading.Event()
fence = Fence(telebot.TeleBot(sys.argv[2]), sys.argv[3], long_poll_timeout=0.2, on_ended=lambda reason: ended.set())
fence.start()
assert ended.wait(30), "the fence did not end"
assert fence.join()
logging.getLogger("telegram_fence.test").warning("after join")
"""


def test_a_started_fence_says_why_it_ended_without_logging_configured(tmp_path: Path) -> None:
    """``start()`` (as under a WSGI server with ``webhook_app``), no logging configured: the end of the fence is one
    readable line with its reason, as under ``run()`` (was: Python's last-resort ``poller ended``, no reason); after
    ``join()`` the library's handler is gone again."""
    with FakeBotAPI() as api:
        api.fail("getUpdates", 401, "Unauthorized", times=None)
        done = subprocess.run([sys.executable, "-c", _STARTED_CHILD, api.base_url, api.token, str(tmp_path / "bot.db")],
                              capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    ended = [line for line in lines if " ended" in line and "telegram_fence" in line]
    assert len(ended) == 1 and "CRITICAL" in ended[0] and "ended: Telegram refused the bot token" in ended[0], lines
    assert ended[0].count("Telegram refused the bot token") == 1, ended  # the field is not repeated after it
    assert lines[-1] == "after join", lines  # Python's last resort again: the fence's handler was removed
    assert "Traceback" not in done.stderr


def test_the_fallback_steps_aside_once_the_program_configures_logging_after_all() -> None:
    """A program that configures logging after the fence started (waitress's ``serve()`` calls
    ``logging.basicConfig()``) gets each record once, from its own handler, not a second time from the fallback."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()
    stream, theirs = io.StringIO(), io.StringIO()
    log = logging.getLogger("telegram_fence.webhook")
    try:
        undo = install_fallback(stream)
        log.warning("before")
        root.addHandler(logging.StreamHandler(theirs))
        log.warning("after")
        undo()
        undo()  # a second undo changes nothing
    finally:
        root.handlers[:] = saved
    assert [line.split(": ", 1)[1] for line in stream.getvalue().splitlines()] == ["before"]
    assert theirs.getvalue() == "after\n"
    assert not [h for h in logging.getLogger("telegram_fence").handlers if h.__class__.__name__ == "_FallbackHandler"]
