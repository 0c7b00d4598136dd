"""A PostgreSQL server that accepts the session and then stops answering (a frozen relay in front of the real
server): every store and leadership call is bounded on this side, the poller says so and the fence ends with a
reason after the bound the store documents."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import telebot
from helpers import eventually
from pg_relay import Relay
from pg_support import DSN, drop_tables, new_table, requires_pg
from store_helpers import claim_one

from telegram_fence import Fence
from telegram_fence.errors import StoreUnavailable
from telegram_fence.store import Identity

pytestmark = requires_pg


@pytest.fixture
def table() -> Iterator[str]:
    name = new_table("tf_mute")
    yield name
    drop_tables(name)


@pytest.fixture
def relay() -> Iterator[Relay]:
    from psycopg.conninfo import conninfo_to_dict

    assert DSN is not None
    params = conninfo_to_dict(DSN)
    relay = Relay(str(params.get("host", "127.0.0.1")), int(params.get("port", 5432)))
    yield relay
    relay.close()


def _through(relay: Relay) -> str:
    from psycopg.conninfo import make_conninfo

    assert DSN is not None
    return make_conninfo(DSN, host="127.0.0.1", port=str(relay.port), connect_timeout="2")


def message(update_id: int, chat: int = 1) -> dict[str, Any]:
    return {"update_id": update_id,
            "message": {"message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"}, "text": "x"}}


def _bounded(call: Callable[[], object], within: float) -> BaseException | None:
    """Run ``call`` on a thread; the exception it raised (``None`` when it returned), failing the test when it was
    still blocked after ``within`` seconds."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # the test inspects it
            outcome.append(exc)

    worker = threading.Thread(target=run, name="test-bounded-call", daemon=True)
    worker.start()
    worker.join(within)
    assert not worker.is_alive(), f"the call was still blocked after {within:g} s"
    return outcome[0]


CALLS: dict[str, Callable[[Any], object]] = {
    "next_offset": lambda store: store.next_offset(),
    "record": lambda store: store.record([message(7)], 8),
    "exchange_one": lambda store: claim_one(store, 30.0),
    "owns": lambda store: store.owns(Identity(1, 1, "x")),
    "stats": lambda store: store.stats(),
}


def test_store_calls_on_a_server_that_stopped_answering_raise_store_unavailable(table: str, relay: Relay) -> None:
    """With the server frozen after the store opened, each store call raises StoreUnavailable within about twice
    statement_timeout (+ the wait for a new connection), never blocks (before: every call waited forever), and
    the store still closes; once the server answers again, so does the store."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    store = PostgresUpdateStore(_through(relay), table=table, pool_size=2, statement_timeout=0.5,
                                connect_timeout=2.0, lock_timeout=0.5)
    try:
        store.record([message(1)], 2)
        relay.freeze()
        started = time.monotonic()
        for name, call in CALLS.items():
            outcome = _bounded(lambda call=call: call(store), within=10.0)  # type: ignore[misc]
            assert isinstance(outcome, StoreUnavailable), f"{name}: {outcome!r}"
        assert time.monotonic() - started < 30
        relay.thaw()
        assert eventually(lambda: _answers(store), timeout=15), "the store did not recover once the server answered"
    finally:
        assert _bounded(store.close, within=10.0) is None


def _answers(store: Any) -> bool:
    try:
        # 8 too: the frozen relay forwards what it held once thawed, so the cut record (BEGIN, insert and COMMIT
        # sent together) may commit after all; a connection lost at commit time is ambiguous for any client
        return store.next_offset() in (2, 8)
    except StoreUnavailable:
        return False


def test_a_leadership_whose_server_stops_answering_is_lost_within_its_bound(table: str, relay: Relay) -> None:
    """The poll leadership, taken through the relay, turns held=False within check_interval + answer_bound once the
    server stops answering, and release() returns (before: its check blocked forever, and release() with it)."""
    from telegram_fence.store.postgres import PostgresUpdateStore

    store = PostgresUpdateStore(_through(relay), table=table, pool_size=2, lock_timeout=0.25, leader_check=0.2)
    try:
        leadership = store.poll_leadership()
        assert leadership.acquire(timeout=10.0), leadership.last_error
        relay.freeze()
        bound = leadership.check_interval + leadership.answer_bound
        assert eventually(lambda: not leadership.held, timeout=bound + 5), "still held with the server frozen"
        assert _bounded(leadership.release, within=5.0) is None
    finally:
        assert _bounded(store.close, within=10.0) is None


def test_a_fence_whose_server_stops_answering_mid_claim_ends_with_a_reason(
    table: str, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stops answering while a handler holds a claim: the poller shows
    the failure in last_error and the fence ends with a reason (before: the settle and the leadership check
    blocked forever, and the fence looked alive)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from telegram_fence.ingress import poller as poller_module
    from telegram_fence.store.postgres import PostgresUpdateStore
    from telegram_fence.testing import FakeBotAPI

    monkeypatch.setattr(poller_module, "LEAD_FAILURE_LIMIT", 2.0)
    assert DSN is not None
    params = {k: v for k, v in conninfo_to_dict(DSN).items() if k not in ("host", "port")}
    conninfo = make_conninfo("", **params, host="127.0.0.1", port=relay.port, connect_timeout=2)
    store = PostgresUpdateStore(conninfo, table=table, pool_size=4, statement_timeout=0.5, lock_timeout=0.25,
                                leader_check=0.2, connect_timeout=2.0)
    running, release = threading.Event(), threading.Event()

    def handler(_update: Any) -> None:
        running.set()
        release.wait(20)

    with FakeBotAPI(max_long_poll=0.3) as api:
        fence = Fence(telebot.TeleBot(api.token, threaded=False), store, long_poll_timeout=0.3, lease=5.0,
                      shutdown_timeout=6.0)
        fence.handler(handler)
        fence.start()
        try:
            api.push_message(1, "hi")
            assert running.wait(20), "the handler never ran"
            relay.freeze()
            release.set()  # its settle now waits for a server that does not answer
            errors: list[str] = []

            def ended() -> bool:
                errors.append(str((fence.stats()["poller"] or {}).get("last_error") or ""))
                return fence.ended_reason is not None

            assert eventually(ended, timeout=40), "the fence did not end"
            assert any("cannot take the poll leadership" in error for error in errors), errors
            assert "cannot take the poll leadership" in str(fence.ended_reason)
        finally:
            release.set()
            fence.stop()
            assert fence.join(20)  # (the shutdown's own store calls wait for the bound too)
            assert _bounded(store.close, within=10.0) is None


def test_a_transaction_held_open_by_the_applications_code_is_never_cut(table: str) -> None:
    """Inside write(), the application's own code may take longer than the bound (only time waiting at the server
    counts): the transaction commits, and a statement of the application's still runs under statement_timeout."""
    import psycopg

    from telegram_fence.store.postgres import PostgresUpdateStore

    assert DSN is not None
    store = PostgresUpdateStore(DSN, table=table, pool_size=2, statement_timeout=0.3)
    try:
        with store.write() as conn:
            threading.Event().wait(1.0)  # > 2 x statement_timeout, in Python: no statement in progress
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert store.watchdog.cuts == 0
        with pytest.raises(psycopg.errors.QueryCanceled), store.write() as conn:
            conn.execute("SELECT pg_sleep(2)")  # the server's own bound cancels it first
        assert store.watchdog.cuts == 0
    finally:
        store.close()


def test_the_stores_own_connections_use_tcp_keepalives(table: str) -> None:
    """The pool the store makes and its leadership session carry the keepalive settings (unless the connection
    string sets them), so a peer that vanished is noticed by TCP too."""
    from psycopg.conninfo import make_conninfo

    from telegram_fence.store.postgres import PostgresUpdateStore
    from telegram_fence.store.postgres.connection import KEEPALIVES

    assert DSN is not None
    store = PostgresUpdateStore(make_conninfo(DSN, keepalives_idle="7"), table=table, pool_size=2)
    try:
        with store.write() as conn:
            pooled = conn.info.get_parameters()
        leadership = store.poll_leadership()
        assert leadership.acquire(timeout=10.0), leadership.last_error
        session = store.dedicated("test")
        try:
            dedicated = session.info.get_parameters()
        finally:
            session.close()
    finally:
        store.close()
    for params in (pooled, dedicated):
        assert params.get("keepalives_idle") == "7"  # the application's setting wins
        assert params.get("keepalives_count") == str(KEEPALIVES["keepalives_count"])
