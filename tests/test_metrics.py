"""Metrics and health: /metrics in Prometheus' text format (read with Prometheus' own parser), /livez, /readyz."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import telebot
from pg_support import DSN, fresh_tables, new_table, requires_pg
from prometheus_client.parser import text_string_to_metric_families

from telegram_fence import ConfigurationError, Fence, SqliteUpdateStore
from telegram_fence.errors import StoreUnavailable
from telegram_fence.runtime.health import check_write, liveness, readiness
from telegram_fence.testing import FakeBotAPI


def _get(url: str, timeout: float = 10) -> tuple[int, str, str]:
    """``(status, content type, body)`` of a GET, 5xx answers included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, parsed by prometheus_client, keyed by name and labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@pytest.fixture
def handled_bot(bot: telebot.TeleBot) -> tuple[telebot.TeleBot, threading.Event]:
    """A bot whose handler sets an event (and fails on the text "fail")."""
    seen = threading.Event()

    @bot.message_handler(func=lambda m: True)
    def handle(message: Any) -> None:
        seen.set()
        if message.text == "fail":
            raise ValueError("failing on purpose")

    return bot, seen


@pytest.fixture
def fence(handled_bot: tuple[telebot.TeleBot, threading.Event], db: str) -> Iterator[Fence]:
    """A started fence serving its metrics on a free port of 127.0.0.1."""
    fence = Fence(handled_bot[0], db, metrics=("127.0.0.1", 0), retry=lambda error, attempt: None)
    fence.start()
    yield fence
    fence.stop()
    assert fence.join()


def test_metrics_parse_with_prometheus_parser_and_count_the_updates(
    api: FakeBotAPI, fence: Fence, handled_bot: tuple[telebot.TeleBot, threading.Event]
) -> None:
    """``GET /metrics`` answers the text format that Prometheus' parser reads, every name prefixed, with the
    updates recorded, handled and exhausted counted and the store's states as gauges."""
    api.push_message(1, "hello")
    api.push_message(2, "fail")
    assert api.wait_for(lambda: fence.stats()["workers"]["handled"] == 1
                        and fence.stats()["workers"]["exhausted"] == 1)
    assert fence.metrics_url is not None
    status, content_type, text = _get(fence.metrics_url + "/metrics")
    assert status == 200
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    families = list(text_string_to_metric_families(text))
    assert families and all(f.name.startswith("telegram_fence_") for f in families)
    samples = _samples(text)
    assert samples[("telegram_fence_updates_recorded_total", (("door", "poller"),))] == 2
    assert samples[("telegram_fence_updates_handled_total", ())] == 1
    assert samples[("telegram_fence_updates_exhausted_total", ())] == 1
    assert samples[("telegram_fence_updates_retried_total", ())] == 0
    assert samples[("telegram_fence_updates", (("state", "settled"),))] == 1
    assert samples[("telegram_fence_updates", (("state", "exhausted"),))] == 1
    assert samples[("telegram_fence_backlog", ())] == 0
    assert samples[("telegram_fence_workers", ())] == 64
    assert samples[("telegram_fence_live", ())] == 1
    assert samples[("telegram_fence_ready", ())] == 1
    assert samples[("telegram_fence_poller_leading", ())] == 1
    assert samples[("telegram_fence_poller_progress_age_seconds", ())] >= 0
    kinds = {f.name: f.type for f in families}
    assert kinds["telegram_fence_updates_handled"] == "counter"
    assert kinds["telegram_fence_backlog"] == "gauge"


def test_livez_and_readyz_answer_ok_for_a_running_polling_fence(api: FakeBotAPI, fence: Fence) -> None:
    """A fence whose threads run and whose poller is answered is live and ready (200 ``ok``); any other path 404s."""
    assert fence.metrics_url is not None
    assert api.wait_for(lambda: fence.stats()["poller"]["polls"] >= 1)
    assert _get(fence.metrics_url + "/livez")[::2] == (200, "ok\n")
    assert _get(fence.metrics_url + "/readyz")[::2] == (200, "ok\n")
    assert _get(fence.metrics_url + "/nothing")[0] == 404


def _lock_holder(path: str) -> subprocess.Popen[str]:
    """Another process holding the SQLite file's write lock (``BEGIN EXCLUSIVE``) until its stdin closes."""
    code = (
        "import sqlite3, sys\n"
        "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "conn.execute('BEGIN EXCLUSIVE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
        "conn.execute('ROLLBACK')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None and child.stdout.readline() == "locked\n"
    return child


def _timed_get(url: str) -> tuple[float, int, str]:
    """``(seconds it took, status, body)`` of a GET (the client waits up to 30 s: a hang shows as a long time)."""
    started = time.monotonic()
    status, _, body = _get(url, timeout=30)
    return time.monotonic() - started, status, body


#: Answers must come before the store's lock waits could have run out once (5 s, the default busy timeout of
#: SQLite and lock_timeout of PostgreSQL): a generous bound on the documented ~1 s, not a speed measurement.
_BEFORE_A_LOCK_WAIT = 4.0


def test_readyz_turns_false_while_another_process_holds_the_store_locked_and_true_after(
    api: FakeBotAPI, fence: Fence, db: str
) -> None:
    """While another process holds the database's write lock (default 5 s busy timeout), ``/readyz`` answers 503
    naming the lock and ``/metrics`` answers 200 (``telegram_fence_ready`` 0, the counts read as WAL lets them),
    each before a single busy timeout could have run out; ``/livez`` stays 200; once it lets go, ready again."""
    assert fence.metrics_url is not None
    assert api.wait_for(lambda: fence.stats()["poller"]["polls"] >= 1)
    assert _get(fence.metrics_url + "/readyz")[0] == 200
    child = _lock_holder(db)
    try:
        api.push_message(1, "hello")  # the poller's write now waits for the other process's lock
        took, status, body = _timed_get(fence.metrics_url + "/readyz")
        assert status == 503 and took < _BEFORE_A_LOCK_WAIT, (took, body)
        assert body.startswith("the store cannot take a write (checked for ")
        # Either the check met the other process's lock itself, or a write of this fence waiting for it.
        assert "stayed locked" in body or "held the write lock" in body
        assert _get(fence.metrics_url + "/livez")[0] == 200
        took, status, text = _timed_get(fence.metrics_url + "/metrics")
        assert status == 200 and took < _BEFORE_A_LOCK_WAIT, took
        samples = _samples(text)
        assert samples[("telegram_fence_ready", ())] == 0
        assert samples[("telegram_fence_store_answered", ())] == 1  # WAL: the reads never wait for the writer
        assert ("telegram_fence_updates", (("state", "pending"),)) in samples
    finally:
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(10) == 0
    assert api.wait_for(lambda: _get(fence.metrics_url + "/readyz")[::2] == (200, "ok\n"), timeout=15)


@requires_pg
def test_on_postgresql_readyz_and_metrics_answer_in_time_while_another_session_locks_the_table(
    api: FakeBotAPI,
) -> None:
    """While another session holds ``ACCESS EXCLUSIVE`` on the updates table (every read of it waits, up to the
    store's 5 s lock_timeout), ``/readyz`` answers 503 saying the store could not be read and ``/metrics`` 200
    with ``telegram_fence_store_answered`` 0 and no store counts, each before one lock_timeout could have run
    out; once the lock goes, ready again with the counts back."""
    import psycopg

    from telegram_fence.store.postgres import PostgresUpdateStore

    assert DSN is not None
    with fresh_tables() as tables:
        table = new_table()
        tables.append(table)
        store = PostgresUpdateStore(DSN, table=table)
        fence = Fence(telebot.TeleBot(api.token), store, metrics=("127.0.0.1", 0), long_poll_timeout=0.3)
        try:
            fence.start()
            url = fence.metrics_url
            assert url is not None
            assert api.wait_for(lambda: _get(url + "/readyz")[0] == 200, timeout=15)
            with psycopg.connect(DSN) as other:
                other.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
                took, status, body = _timed_get(url + "/readyz")
                assert status == 503 and took < _BEFORE_A_LOCK_WAIT, (took, body)
                assert body.startswith("the store could not be read: "), body
                assert _get(url + "/livez")[0] == 200
                took, status, text = _timed_get(url + "/metrics")
                assert status == 200 and took < _BEFORE_A_LOCK_WAIT, took
                samples = _samples(text)
                assert samples[("telegram_fence_store_answered", ())] == 0
                assert samples[("telegram_fence_ready", ())] == 0
                assert samples[("telegram_fence_live", ())] == 1
                assert ("telegram_fence_updates", (("state", "pending"),)) not in samples
                other.rollback()
            assert _get(url + "/readyz")[::2] == (200, "ok\n")
            samples = _samples(_get(url + "/metrics")[2])
            assert samples[("telegram_fence_store_answered", ())] == 1
            assert ("telegram_fence_updates", (("state", "pending"),)) in samples
        finally:
            fence.stop()
            assert fence.join()
            store.close()


def test_readyz_says_paused_and_livez_fails_once_the_fence_ended(api: FakeBotAPI, fence: Fence) -> None:
    """A paused fence is not ready (it fetches nothing); a fence that ended on its own (token refused) is not
    live, and ``/livez`` names the reason."""
    assert fence.metrics_url is not None
    url = fence.metrics_url
    fence.pause()
    status, _, body = _get(url + "/readyz")
    assert (status, body.startswith("paused")) == (503, True)
    api.fail("getUpdates", 401, "Unauthorized", times=None)
    fence.resume()
    assert api.wait_for(lambda: fence.ended_reason is not None)
    status, _, body = _get(url + "/livez")
    assert status == 503 and "the fence ended: Telegram refused the bot token" in body


def test_the_metrics_thread_is_named_and_joined_with_the_fence(handled_bot: Any, db: str) -> None:
    """``metrics=`` starts one thread named ``fence-metrics``; ``join()`` ends it and frees the port."""
    fence = Fence(handled_bot[0], db, metrics=("127.0.0.1", 0))
    fence.start()
    assert "fence-metrics" in [t.name for t in threading.enumerate()]
    url = fence.metrics_url
    assert url is not None
    fence.stop()
    assert fence.join()
    assert "fence-metrics" not in [t.name for t in threading.enumerate()]
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/livez", timeout=5)


@pytest.mark.parametrize("value", [("127.0.0.1",), ("", 9464), ("127.0.0.1", 70000), ("127.0.0.1", "9464"), 9464])
def test_a_bad_metrics_address_is_refused_naming_the_option(bot: telebot.TeleBot, db: str, value: Any) -> None:
    """``metrics=`` must be ``(host, port)``: anything else is a ConfigurationError naming it."""
    with pytest.raises(ConfigurationError, match=r"metrics=.* must be \(host, port\)"):
        Fence(bot, db, metrics=value)


def _wsgi_get(app: Any, path: str, method: str = "GET") -> tuple[str, bytes]:
    answer: list[str] = []
    body = b"".join(app({"REQUEST_METHOD": method, "PATH_INFO": path, "wsgi.input": io.BytesIO(b"")},
                        lambda status, headers: answer.append(status)))
    return answer[0], body


def test_a_webhook_app_answers_the_health_paths_beside_the_intake(bot: telebot.TeleBot, db: str) -> None:
    """The WSGI app of ``webhook_app(health=True)`` answers ``GET /metrics``, ``/livez``, ``/readyz`` without the secret
    (ready while the intake is open, not once it closed); its webhook path still wants a POST."""
    fence = Fence(bot, db)
    app = fence.webhook_app("s3cret", health=True)
    fence.start()
    try:
        assert _wsgi_get(app, "/livez") == ("200 OK", b"ok\n")
        assert _wsgi_get(app, "/readyz") == ("200 OK", b"ok\n")
        status, text = _wsgi_get(app, "/metrics")
        samples = _samples(text.decode())
        assert status == "200 OK"
        assert samples[("telegram_fence_ready", ())] == 1
        assert ("telegram_fence_poller_alive", ()) not in samples
        assert samples[("telegram_fence_webhook_requests_total", (("outcome", "stored"),))] == 0
        assert _wsgi_get(app, "/webhook")[0].startswith("405")
        app.close()
        status, text = _wsgi_get(app, "/readyz")
        assert status.startswith("503") and b"the webhook intake is closed" in text
    finally:
        fence.stop()
        assert fence.join()


def test_health_app_is_a_wsgi_app_of_the_same_answers(bot: telebot.TeleBot, db: str) -> None:
    """``health_app()`` answers the three paths (HEAD without a body), 404 elsewhere, 405 for a POST; before
    the start the fence is neither live nor ready."""
    fence = Fence(bot, db)
    app = fence.health_app()
    assert _wsgi_get(app, "/livez") == ("503 Service Unavailable", b"the fence is not started\n")
    fence.start()
    try:
        assert _wsgi_get(app, "/livez") == ("200 OK", b"ok\n")
        assert _wsgi_get(app, "/livez", "HEAD") == ("200 OK", b"")
        assert _wsgi_get(app, "/elsewhere")[0] == "404 Not Found"
        assert _wsgi_get(app, "/livez", "POST")[0] == "405 Method Not Allowed"
    finally:
        fence.stop()
        assert fence.join()


_LIVE: list[str] = []
_RUNNING = {"threads": {"started": True, "dispatcher": True, "heartbeat": True, "exhaustions": True},
            "workers": {"alive": 4}, "poller": {"alive": True, "paused": False, "leading": True, "progress_age": 3.0},
            "webhook": None, "stopping": False, "ended_reason": None}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"poller": {"alive": True, "paused": False, "leading": True, "progress_age": 99.0}},
         "the last getUpdates answer was 99 s ago"),
        ({"poller": {"alive": True, "paused": False, "leading": False, "progress_age": 99.0}},
         "the last poll leadership check was 99 s ago"),
        ({"poller": {"alive": True, "paused": False, "leading": True, "progress_age": None}},
         "the last getUpdates answer was never"),
        ({"stopping": True}, "the fence is stopping"),
        ({"store_error": "StoreUnavailable('gone')"}, "the store could not be read"),
        ({"calls": {"journal": None, "journal_error": "read: no time left"}},
         "the calls journal could not be read: read: no time left"),
        ({"poller": None, "webhook": {"intake": {"closed": 0, "last_failed": 1}}}, "answered 500"),
    ],
)
def test_readiness_names_what_is_missing(change: dict[str, Any], reason: str) -> None:
    """Readiness fails, naming why, for a poller without recent progress (getUpdates, or the leadership check of
    a poller another process leads), a stopping fence, an unreadable store or calls journal, a webhook whose last
    delivery failed."""
    stats = {**_RUNNING, **change}
    reasons = readiness(stats, _LIVE, write_error=None, max_progress_age=55.0)
    assert any(reason in line for line in reasons), reasons
    assert readiness(_RUNNING, _LIVE, write_error=None, max_progress_age=55.0) == []


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"ended_reason": "poller crashed"}, "the fence ended: poller crashed"),
        ({"threads": {"started": True, "dispatcher": False, "heartbeat": True, "exhaustions": True}},
         "the dispatcher thread is not alive"),
        ({"poller": {"alive": False}}, "the poller thread is not alive"),
        ({"threads": {"started": False}}, "the fence is not started"),
    ],
)
def test_liveness_names_the_thread_that_is_gone(change: dict[str, Any], reason: str) -> None:
    """Liveness fails for an ended fence, a dead dispatcher or a dead poller, naming it; idle worker threads that
    ended are no failure."""
    assert reason in liveness({**_RUNNING, **change}, polling=True)
    assert liveness(_RUNNING, polling=True) == []
    assert liveness({**_RUNNING, "workers": {"alive": 0}}, polling=True) == []
    assert liveness({**_RUNNING, "poller": None}, polling=False) == []


@requires_pg
def test_the_postgresql_write_check_is_bounded_by_a_lock_held_by_another_session() -> None:
    """On PostgreSQL the readiness write check passes when nothing holds writes off, and fails with
    StoreUnavailable within its bound while another session holds a lock that keeps every write waiting."""
    import psycopg

    from telegram_fence.store.postgres import PostgresUpdateStore

    assert DSN is not None
    with fresh_tables() as tables:
        table = new_table()
        tables.append(table)
        store = PostgresUpdateStore(DSN, table=table)
        try:
            assert check_write(store, 1.0) is None
            with psycopg.connect(DSN) as other:
                other.execute(f"LOCK TABLE {table} IN SHARE MODE")  # (CREATE INDEX takes this one)
                error = check_write(store, 0.3)
                assert error is not None and error.startswith("the store cannot take a write (checked for 0.3 s)")
                with pytest.raises(StoreUnavailable):
                    store.probe_writable(0.3)
                other.rollback()
            assert check_write(store, 1.0) is None
        finally:
            store.close()


@requires_pg
def test_on_postgresql_the_leader_and_the_waiting_host_are_both_ready_and_say_who_polls(api: FakeBotAPI) -> None:
    """Two fences on one PostgreSQL table: the one that polls and the one whose leadership checks say another
    host leads are both ready (leadership known); ``telegram_fence_poller_leading`` tells them apart."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    assert DSN is not None
    with fresh_tables() as tables:
        table = new_table()
        tables.append(table)
        stores = [PostgresUpdateStore(DSN, table=table), PostgresUpdateStore(DSN, table=table, create_table=False)]
        fences = [Fence(telebot.TeleBot(api.token), store, metrics=("127.0.0.1", 0), long_poll_timeout=0.3)
                  for store in stores]
        try:
            for fence in fences:
                fence.start()
            assert api.wait_for(lambda: sum(f.stats()["poller"]["leading"] for f in fences) == 1, timeout=15)
            leading = []
            for fence in fences:
                assert fence.metrics_url is not None
                assert _get(fence.metrics_url + "/readyz")[::2] == (200, "ok\n")
                leading.append(_samples(_get(fence.metrics_url + "/metrics")[2])[("telegram_fence_poller_leading", ())])
            assert sorted(leading) == [0, 1]
        finally:
            for fence in fences:
                fence.stop()
            for fence in fences:
                assert fence.join()
            for store in stores:
                store.close()


def test_a_metrics_address_in_use_is_refused_naming_the_option_and_nothing_starts(
    bot: telebot.TeleBot, db: str
) -> None:
    """``metrics=`` on a port another socket holds: ``start()`` raises ConfigurationError naming the option and the
    address (chained from the OSError; was a bare ``OSError: Address already in use``), and no thread runs."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        fence = Fence(bot, db, metrics=("127.0.0.1", port))
        with pytest.raises(ConfigurationError, match=rf"metrics=\('127.0.0.1', {port}\): cannot listen there") as info:
            fence.start()
    assert isinstance(info.value.__cause__, OSError)
    assert fence.stats()["threads"]["started"] is False
    assert not [t for t in threading.enumerate() if t.name.startswith("fence-")]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_bounded_block_whose_time_is_spent_fails_reads_at_once_and_the_store_reads_again_after(
    backend: str, db: str
) -> None:
    """``store.bounded(seconds)`` (what ``/metrics`` and ``/readyz`` read under): a read once its time is spent is
    ``StoreUnavailable`` saying so, the nested block keeps the earlier deadline, and after the block the
    thread's reads are the store's ordinary ones again (the counts come back)."""
    with contextlib.ExitStack() as stack:
        if backend == "postgres":
            if DSN is None:
                pytest.skip("TELEGRAM_FENCE_PG_DSN is not set")
            from telegram_fence.store.postgres import PostgresUpdateStore

            table = new_table()
            stack.enter_context(fresh_tables()).append(table)
            store: Any = stack.enter_context(PostgresUpdateStore(DSN, table=table))
        else:
            store = stack.enter_context(SqliteUpdateStore(db))
        with store.bounded(5.0):
            assert store.stats()["pending"] == 0
            with store.bounded(0.0), pytest.raises(StoreUnavailable, match="no time left"):
                store.stats()
            # the earlier deadline wins
            with store.bounded(0.0), store.bounded(5.0), pytest.raises(StoreUnavailable, match="no time left"):
                store.stats()
            assert store.stats()["pending"] == 0
        assert store.stats()["pending"] == 0
