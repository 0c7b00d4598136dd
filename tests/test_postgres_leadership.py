"""Poll leadership on PostgreSQL: its session is opened with the application pool's full connection settings,
its waits are bounded against a server that never answers, and a poller that cannot lead says so and ends."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import nullcontext, suppress
from typing import Any

import psycopg
import pytest
import telebot
from helpers import eventually
from pg_relay import Relay
from pg_support import DSN, drop_tables, new_table, requires_pg

from telegram_fence import Fence
from telegram_fence.testing import FakeBotAPI

pytestmark = requires_pg


@pytest.fixture
def table() -> Iterator[str]:
    name = new_table("tf_lead")
    yield name
    drop_tables(name)


def _split(*keys: str) -> tuple[str, dict[str, Any]]:
    """:data:`DSN` without ``keys``, and those settings as connection keyword arguments."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    assert DSN is not None
    params = conninfo_to_dict(DSN)
    kwargs = {key: params.pop(key) for key in keys if key in params}
    return make_conninfo("", **params), kwargs


def _stop_listening(server: socket.socket) -> None:
    """Stop taking connections and wake the thread blocked in ``accept()`` (on Linux a close alone does neither:
    the blocked call keeps the socket listening until it returns)."""
    with suppress(OSError):
        server.shutdown(socket.SHUT_RDWR)
    server.close()


class _Silent:
    """A TCP server that accepts connections and never answers (a hung database host)."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="test-silent-server", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _addr = self._server.accept()
            except OSError:
                return
            self._held.append(conn)

    def close(self) -> None:
        _stop_listening(self._server)
        for conn in self._held:
            conn.close()
        self._thread.join(5)
        assert not self._thread.is_alive()


def test_acquire_is_bounded_against_a_server_that_never_answers() -> None:
    """acquire(timeout=1.0) against a server that accepts TCP and never answers returns False within libpq's
    least connect timeout (2 s), with the failure in last_error (before: it blocked for minutes)."""
    from telegram_fence.store.postgres.leadership import PollLeadership

    silent = _Silent()
    leadership = PollLeadership(
        lambda timeout: psycopg.Connection.connect(
            host="127.0.0.1", port=silent.port, user="postgres", dbname="test", autocommit=True,
            connect_timeout=max(2, int(timeout + 0.999)),
        ),
        table="tf_lead_none", namespace=1, watch=lambda _session, _bound: nullcontext(),
    )
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(leadership.acquire(timeout=1.0)), name="test-acquire")
    try:
        worker.start()
        worker.join(20)
        assert not worker.is_alive(), "acquire(timeout=1.0) was still blocked after 20 s"
        assert result == [False]
        assert leadership.last_error, "the failure to reach the server is not reported"
    finally:
        leadership.release()
        silent.close()


def test_a_poller_that_cannot_lead_says_so_and_ends_the_fence(table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the leadership session cannot be opened (the database takes no new connections) the poller shows
    the failure in last_error and, after LEAD_FAILURE_LIMIT, ends the fence with that reason (before: alive
    with last_error None, forever)."""
    from psycopg.conninfo import make_conninfo

    from telegram_fence.ingress import poller as poller_module
    from telegram_fence.store.postgres import PostgresUpdateStore

    monkeypatch.setattr(poller_module, "LEAD_FAILURE_LIMIT", 2.0)
    conninfo, kwargs = _split("host", "port")
    relay = Relay(str(kwargs.get("host", "127.0.0.1")), int(kwargs.get("port", 5432)))
    store = PostgresUpdateStore(make_conninfo(conninfo, host="127.0.0.1", port=relay.port), table=table, pool_size=4)
    opened = [store.pool.getconn(timeout=30) for _ in range(4)]
    for conn in opened:
        store.pool.putconn(conn)
    with FakeBotAPI(max_long_poll=0.3) as api:
        fence = Fence(telebot.TeleBot(api.token, threaded=False), store, long_poll_timeout=0.3, lease=2.0,
                      shutdown_timeout=3.0)
        fence.handler(lambda update: None)
        relay.refuse_new()  # the pool's four connections go on; the leadership session cannot be opened
        fence.start()
        try:
            assert eventually(lambda: (fence.stats()["poller"] or {}).get("last_error"), timeout=20)
            assert "cannot take the poll leadership" in fence.stats()["poller"]["last_error"]
            assert eventually(lambda: fence.ended_reason is not None, timeout=30)
            assert "cannot take the poll leadership" in str(fence.ended_reason)
        finally:
            fence.stop()
            fence.join(15)
            store.close()
            relay.close()
