"""The webhook door keeps the polling door's promises: hostile request heads, a second Ctrl-C, a swapped
secret, re-deliveries after pruning; over real HTTP, real WSGI servers, real files and processes."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually, serving, signal_when_ready
from pg_support import fresh_tables, new_table, requires_pg
from store_helpers import claim_one, settle_one
from telebot import apihelper
from webhook_support import SECRET, TOKEN, post, raw_request, update

from telegram_fence import Fence, SqliteUpdateStore
from telegram_fence.ingress.webhook import WebhookIntake, WsgiServer
from telegram_fence.ingress.webhook_guard import split_tag, tagged_url
from telegram_fence.testing import FakeBotAPI, ReadinessSocket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])




def _head(length: bytes) -> bytes:
    return (b"POST /telegram/hook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"X-Telegram-Bot-Api-Secret-Token: " + SECRET.encode() + b"\r\nContent-Length: " + length + b"\r\n\r\n")


@pytest.mark.parametrize("length", [b"\xb2", b"\xd9\xa3", b"9" * 4300, b"1" * 25, b"+12", b"-1", b"1_0"],
                         ids=["superscript-two", "arabic-indic-digit-bytes", "4300-digits", "25-digits", "plus",
                              "negative", "underscore"])
def test_a_content_length_that_is_not_plain_ascii_digits_is_400_without_a_traceback(
        tmp_path: Path, length: bytes, capfd: pytest.CaptureFixture[str]) -> None:
    """A Content-Length of a Unicode digit (``²``), thousands of digits, a sign or an underscore answers 400
    over real HTTP, prints no traceback, and stores nothing; the next good delivery is stored."""
    with SqliteUpdateStore(tmp_path / "hook.db") as store:
        app = WebhookIntake(store, SECRET)
        body = json.dumps(update(5)).encode()
        with serving(app) as port:
            status, answer = raw_request(port, _head(length), [])  # no body: none is read before the 400
            good = raw_request(port, _head(str(len(body)).encode()), [body])[0]
        assert status == 400, answer
        assert b"Content-Length" in answer
        assert good == 200
        assert store.stats()["pending"] == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


CHILD = str(Path(__file__).with_name("webhook_stop_child.py"))


def _spawn_webhook(api: FakeBotAPI, db: str, port: int, ready: ReadinessSocket, **env: str) -> subprocess.Popen[str]:
    child_env = ready.env(TF_TEST_TOKEN=TOKEN, TF_TEST_SECRET=SECRET, **env)
    return subprocess.Popen([sys.executable, CHILD, db, api.api_url, str(port)], env=child_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(child: subprocess.Popen[str], timeout: float = 40) -> tuple[int, str]:
    try:
        _, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
        raise AssertionError(f"the child did not exit within {timeout} s; stderr:\n{err}") from None
    return child.returncode, err


def test_a_second_sigint_in_run_webhook_abandons_a_hung_handler_exits_130_and_nothing_is_lost(
        tmp_path: Path) -> None:
    """run_webhook in a real process: the first SIGINT waits for a hung handler (shutdown_timeout 30 s), a
    second exits 130 at once saying so; the next start handles the abandoned update after its lease."""
    db = str(tmp_path / "bot.db")
    port = free_port()
    with FakeBotAPI(token=TOKEN) as api, ReadinessSocket() as ready:
        child = _spawn_webhook(api, db, port, ready)
        try:
            api.push_message(1, "hang")
            assert api.wait_for(lambda: [s.text for s in api.sent] == ["hanging"], timeout=30)
            signal_when_ready(child, ready, signal.SIGINT)
            time.sleep(0.5)  # the graceful stop is under way (it would wait 30 s for the handler)
            assert child.poll() is None, "the first SIGINT did not wait for the running handler"
            began = time.monotonic()
            child.send_signal(signal.SIGINT)
            code, err = _finish(child)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert time.monotonic() - began < 5, f"the second SIGINT did not stop at once: {code} {err}"
        assert code == 130, err
        assert "second signal" in err
        again = _spawn_webhook(api, db, port, ready, STOP_CHILD_NO_HANG="1")
        try:
            assert api.wait_for(lambda: "echo hang" in [s.text for s in api.sent], timeout=30)
        finally:
            signal_when_ready(again, ready)
            code, err = _finish(again)
        assert code == 0, err


def _sqlite_backend(tmp_path: Path) -> tuple[Any, Callable[[], dict[int, int]], Callable[[], None]]:
    store = SqliteUpdateStore(tmp_path / "bot.db")
    with store.write() as conn:
        conn.execute("CREATE TABLE notes(update_id INTEGER NOT NULL, attempt INTEGER NOT NULL)")

    def rows() -> dict[int, int]:
        with store.write() as conn:
            found = conn.execute("SELECT update_id, count(*) FROM notes GROUP BY update_id").fetchall()
        return dict(found)

    return store, rows, store.close


def _pg_backend(table: str) -> tuple[Any, Callable[[], dict[int, int]], Callable[[], None]]:
    import psycopg
    from pg_support import DSN

    from telegram_fence.store.postgres import PostgresUpdateStore

    assert DSN is not None
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table}_domain (update_id bigint NOT NULL, attempt int NOT NULL)")
    store = PostgresUpdateStore(DSN, table=table)

    def rows() -> dict[int, int]:
        with psycopg.connect(DSN) as conn:
            found = conn.execute(f"SELECT update_id, count(*) FROM {table}_domain GROUP BY update_id").fetchall()
        return {int(u): int(n) for u, n in found}

    return store, rows, store.close


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=requires_pg)])
def test_a_redelivery_after_prune_is_not_handled_twice(tmp_path: Path, backend: str) -> None:
    """Telegram delivers an update again after its 200 was lost and the settled row was pruned (prune with a
    cutoff in the future, as retention or `prune` would): it is answered 200, its handler does not run again
    and its complete=True write is not committed twice; on SQLite and PostgreSQL, over real HTTP."""
    with fresh_tables() as made:
        if backend == "sqlite":
            store, rows, close = _sqlite_backend(tmp_path)
            note = "INSERT INTO notes(update_id, attempt) VALUES (?, ?)"
        else:
            table = new_table("tf_door")
            made.append(table)
            store, rows, close = _pg_backend(table)
            note = f"INSERT INTO {table}_domain (update_id, attempt) VALUES (%s, %s)"
        handled: list[int] = []
        fence = Fence(telebot.TeleBot(TOKEN, threaded=False), store, lease=5.0, shutdown_timeout=5.0)

        @fence.attempt_handler
        def take_note(update: telebot.types.Update, ctx: Any) -> None:
            handled.append(update.update_id)
            with ctx.transaction(complete=True) as conn:
                conn.execute(note, (update.update_id, ctx.identity.attempt))

        app = fence.webhook_app(SECRET)
        fence.start()
        try:
            with serving(app) as port:
                assert post(port, json.dumps(update(100, chat=7)))[0] == 200
                assert eventually(lambda: store.stats()["settled"] == 1)
                pruned = store.prune(store.clock() + 3600)  # retention and `prune` pass such a cutoff
                assert post(port, json.dumps(update(100, chat=7)))[0] == 200  # the re-delivery
                assert post(port, json.dumps(update(101, chat=7)))[0] == 200  # behind it in the same chat
                assert eventually(lambda: 101 in handled)
                assert eventually(lambda: store.stats()["settled"] == 2)
        finally:
            fence.stop()
            assert fence.join(15)
        assert pruned == 0
        assert handled == [100, 101]
        assert rows() == {100: 1, 101: 1}
        close()


def test_prune_on_the_command_line_keeps_a_redeliverable_update_and_deletes_a_polled_one(tmp_path: Path) -> None:
    """`telegram-fence prune --older-than 1s` deletes a settled update the cursor passed (polled two days ago) and
    keeps one it has not passed (stored by the webhook ten seconds ago, within Telegram's 24 h), whose
    re-delivery then is not stored again."""
    db = tmp_path / "bot.db"
    with SqliteUpdateStore(db, clock=lambda: time.time() - 2 * 86_400) as store:
        store.record([update(5)], 6)  # polled: the cursor moves past it
        claim = claim_one(store, 5.0)
        assert claim is not None and settle_one(store, claim.identity)
    with SqliteUpdateStore(db, clock=lambda: time.time() - 10) as store:
        store.record([update(9)], 0)  # delivered by the webhook: the cursor stays
        claim = claim_one(store, 5.0)
        assert claim is not None and settle_one(store, claim.identity)
    done = subprocess.run([sys.executable, "-m", "telegram_fence", "prune", str(db), "--older-than", "1s"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with SqliteUpdateStore(db) as store:
        with store.write() as conn:
            kept = [row[0] for row in conn.execute("SELECT update_id FROM fence_updates ORDER BY update_id")]
        assert store.record([update(9)], 0) == 0
    assert kept == [9]


class _RunWebhook:
    """run_webhook on a thread; ``code`` is its return value (or the exception it raised)."""

    def __init__(self, fence: Fence, url: str, port: int) -> None:
        self.fence = fence
        self.code: Any = None
        self.thread = threading.Thread(target=self._run, args=(url, port), name="run-webhook")
        self.thread.start()

    def _run(self, url: str, port: int) -> None:
        try:
            self.code = self.fence.run_webhook(url, secret_token=SECRET, listen=("127.0.0.1", port))
        except BaseException as exc:
            self.code = exc

    def finish(self, timeout: float = 30) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "run_webhook did not return"
        return self.code


def test_our_tagged_url_registered_again_with_another_secret_ends_the_fence(tmp_path: Path) -> None:
    """Another program registers our very URL (tag included) with its own secret: Telegram's deliveries are
    answered 401, and the watch's next check finds Telegram's 401: it ends the fence with a reason naming it,
    run_webhook returns 1, nothing handled, the update still waits at Telegram."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    with FakeBotAPI(token=TOKEN, webhook_retry_delay=0.05, webhook_max_retry_delay=0.2) as api:
        handled: list[int] = []
        ended: list[str] = []
        fence = Fence(telebot.TeleBot(TOKEN, threaded=False), str(tmp_path / "bot.db"), lease=5.0,
                      shutdown_timeout=5.0, on_ended=ended.append)
        fence.handler(lambda u: handled.append(u.update_id))
        fence.webhook_check_interval = 0.3
        run = _RunWebhook(fence, url, port)
        try:
            assert api.wait_for(lambda: len(api.calls_to("setWebhook")) == 1, timeout=20)
            apihelper.set_webhook(TOKEN, url=tagged_url(url, SECRET), secret_token="another-programs-secret")
            api.push_message(1, "hello")
            code = run.finish()
        finally:
            fence.stop()
        assert code == 1
        assert handled == []
        assert len(ended) == 1 and "401" in ended[0] and "another secret" in ended[0]
        assert fence.ended_reason == ended[0]
        assert SECRET not in ended[0] and "another-programs-secret" not in ended[0]
        assert api.pending_count == 1  # not answered 200: Telegram keeps it for whoever serves it rightly


def test_refused_requests_from_anyone_else_carrying_our_tag_do_not_end_the_fence(tmp_path: Path) -> None:
    """A stranger posting to our tagged URL with wrong secrets gets 401s, but Telegram reports no refused delivery,
    so the watch's checks pass, the fence runs on and still handles Telegram's updates."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    query = split_tag(tagged_url(url, SECRET))[1]
    with FakeBotAPI(token=TOKEN) as api:
        handled: list[int] = []
        fence = Fence(telebot.TeleBot(TOKEN, threaded=False), str(tmp_path / "bot.db"), lease=5.0,
                      shutdown_timeout=5.0)
        fence.handler(lambda u: handled.append(u.update_id))
        fence.webhook_check_interval = 0.3
        run = _RunWebhook(fence, url, port)
        try:
            assert api.wait_for(lambda: len(api.calls_to("setWebhook")) == 1, timeout=20)
            for _ in range(4):
                assert post(port, json.dumps(update(999)), secret="guessed", path=f"/hook?tf={query}")[0] == 401
            assert eventually(lambda: (fence.stats()["webhook"] or {}).get("checks", 0) >= 2, timeout=10)
            api.push_message(1, "hello")
            assert eventually(lambda: len(handled) == 1)
            assert fence.ended_reason is None
        finally:
            fence.stop()
        assert run.finish() == 0


def test_register_webhook_serves_an_own_server_with_takeover_protection_and_the_watch(tmp_path: Path) -> None:
    """webhook_app behind one's own WSGI server plus register_webhook: refused with WebhookTaken while another
    host holds the webhook (nothing registered), then registered and watched: an update is handled, and a move
    elsewhere ends the fence; join() ends the watch thread."""
    from telegram_fence import ConfigurationError, WebhookTaken

    with FakeBotAPI(token=TOKEN) as api:
        apihelper.set_webhook(TOKEN, url="https://other.example.org/hook")
        handled: list[int] = []
        ended: list[str] = []
        fence = Fence(telebot.TeleBot(TOKEN, threaded=False), str(tmp_path / "bot.db"), lease=5.0,
                      shutdown_timeout=5.0, on_ended=ended.append)
        fence.handler(lambda u: handled.append(u.update_id))
        fence.webhook_check_interval = 0.1
        app = fence.webhook_app(SECRET)
        server = WsgiServer(app, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.port}/hook"
        server.start()
        fence.start()
        try:
            with pytest.raises(ConfigurationError):
                fence.register_webhook(url, secret_token="not-the-apps-secret")
            with pytest.raises(WebhookTaken, match=r"other\.example\.org"):
                fence.register_webhook(url, secret_token=SECRET)
            assert api.webhook_url == "https://other.example.org/hook"
            fence.register_webhook(url, secret_token=SECRET, takeover_from="other.example.org")
            api.push_message(1, "hello")
            assert eventually(lambda: len(handled) == 1)
            apihelper.set_webhook(TOKEN, url="https://laptop.example.net/x")
            assert eventually(lambda: fence.ended_reason is not None)
        finally:
            fence.stop()
            assert fence.join(15)
            server.stop()
            assert server.join(10)
        assert "laptop.example.net" in ended[0]
        assert not [t for t in threading.enumerate() if t.name == "fence-webhook-watch"]


@pytest.mark.parametrize("change", ["secret", "url"])
def test_webhook_app_without_register_webhook_ends_when_its_webhook_is_swapped_or_moved(
    tmp_path: Path, change: str
) -> None:
    """webhook_app behind one's own server, with the webhook registered by the application itself (no
    register_webhook): after the first delivery, another program registering the same URL with its own secret
    (Telegram's deliveries then 401) or moving it elsewhere ends the fence with a reason naming it (before: the
    fence ran on, handling nothing)."""
    with FakeBotAPI(token=TOKEN, webhook_retry_delay=0.05, webhook_max_retry_delay=0.2) as api:
        handled: list[int] = []
        ended: list[str] = []
        fence = Fence(telebot.TeleBot(TOKEN, threaded=False), str(tmp_path / "bot.db"), lease=5.0,
                      shutdown_timeout=5.0, on_ended=ended.append)
        fence.handler(lambda u: handled.append(u.update_id))
        fence.webhook_check_interval = 0.2
        app = fence.webhook_app(SECRET)
        server = WsgiServer(app, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.port}/hook"
        server.start()
        fence.start()
        try:
            apihelper.set_webhook(TOKEN, url=url, secret_token=SECRET)  # the application's own registration
            api.push_message(1, "hello")
            assert eventually(lambda: len(handled) == 1, timeout=20)
            assert eventually(lambda: (fence.stats()["webhook"] or {}).get("checks", 0) >= 1, timeout=10)
            if change == "secret":
                apihelper.set_webhook(TOKEN, url=url, secret_token="another-programs-secret")
                api.push_message(2, "hello again")
            else:
                apihelper.set_webhook(TOKEN, url="https://laptop.example.net/x")
            assert eventually(lambda: fence.ended_reason is not None, timeout=20), fence.stats()["webhook"]
        finally:
            fence.stop()
            assert fence.join(15)
            server.stop()
            assert server.join(10)
        assert len(handled) == 1
        if change == "secret":
            assert "401" in ended[0] and "another secret" in ended[0] and "another-programs-secret" not in ended[0]
        else:
            assert "laptop.example.net" in ended[0]
        assert not [t for t in threading.enumerate() if t.name == "fence-webhook-watch"]


def _status(db: str, *extra: str) -> subprocess.CompletedProcess[str]:
    # --timeout 30: the command's 3 s default is for an operator; a PostgreSQL server shared with four suites and
    # benchmarks on two cores has answered a stats query in more
    return subprocess.run([sys.executable, "-m", "telegram_fence", "status", db, "--timeout", "30", *extra],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=requires_pg)])
def test_status_of_a_webhook_bot_counts_deliveries_and_checks_as_progress(tmp_path: Path, backend: str) -> None:
    """`telegram-fence status --max-progress-age 90` of a running webhook bot says healthy and names the webhook
    generation; a delivery and a check of the webhook each move its progress; after the stop it is unhealthy,
    stopped with its reason. On SQLite and PostgreSQL, the command in a real process."""
    with fresh_tables() as made:
        if backend == "sqlite":
            target = str(tmp_path / "bot.db")
            store: Any = target
            extra: list[str] = []
        else:
            from pg_support import DSN

            from telegram_fence.store.postgres import PostgresUpdateStore

            table = new_table("tf_door")
            made.append(table)
            assert DSN is not None
            target, extra = DSN, ["--table", table]
            store = PostgresUpdateStore(DSN, table=table)
        port = free_port()
        with FakeBotAPI(token=TOKEN) as api:
            handled: list[int] = []
            fence = Fence(telebot.TeleBot(TOKEN, threaded=False), store, lease=5.0, shutdown_timeout=5.0)
            fence.handler(lambda u: handled.append(u.update_id))
            fence.webhook_check_interval = 0.2
            run = _RunWebhook(fence, f"http://127.0.0.1:{port}/hook", port)
            try:
                assert api.wait_for(lambda: len(api.calls_to("setWebhook")) == 1, timeout=20)

                def progress() -> float:
                    return float(fence.store.stats()["generation"]["progress_at"])

                first = progress()
                api.push_message(1, "hello")
                assert eventually(lambda: len(handled) == 1)
                assert eventually(lambda: progress() > first)
                healthy = _status(target, *extra, "--max-progress-age", "90")
                assert healthy.returncode == 0, healthy.stdout + healthy.stderr
                assert "webhook generation" in healthy.stdout and "UNHEALTHY" not in healthy.stdout
                data = json.loads(_status(target, *extra, "--json").stdout)
                assert data["door"] == "webhook" and data["generation"]["ended_at"] is None
                checks = fence.stats()["webhook"]["checks"]
                before = progress()
                assert eventually(lambda: fence.stats()["webhook"]["checks"] > checks + 1)
                assert progress() > before  # no delivery meanwhile: the checks are the door's progress
            finally:
                fence.stop()
            assert run.finish() == 0
        stopped = _status(target, *extra, "--max-progress-age", "90")
        assert stopped.returncode == 1
        assert "UNHEALTHY: webhook generation" in stopped.stdout and "clean stop" in stopped.stdout
        if backend == "postgres":
            store.close()


def test_a_listen_address_in_use_is_refused_naming_the_option_before_the_webhook_is_registered(tmp_path: Path) -> None:
    """``run_webhook(listen=...)`` on a port another socket holds raises ConfigurationError naming ``listen=`` and
    the address (chained from the OSError; was a bare ``OSError: Address already in use``); setWebhook is never
    called, so the webhook of whoever holds it stays theirs."""
    from telegram_fence import ConfigurationError

    with FakeBotAPI(token=TOKEN) as api, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        fence = Fence(telebot.TeleBot(TOKEN), str(tmp_path / "bot.db"))
        with pytest.raises(ConfigurationError, match=rf"listen=\('127.0.0.1', {port}\): cannot listen there") as info:
            fence.run_webhook(f"http://127.0.0.1:{port}/hook", secret_token=SECRET, listen=("127.0.0.1", port))
        assert isinstance(info.value.__cause__, OSError)
        assert api.calls_to("setWebhook") == []
