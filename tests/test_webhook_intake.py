"""The webhook intake over real HTTP (the stdlib threaded server), with real SQLite files and threads."""

from __future__ import annotations

import io
import json
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import apsw
import pytest
from helpers import eventually, serving, stored_ids
from pg_support import store_of
from webhook_support import SECRET, post, raw_request, update

from telegram_fence import ConfigurationError, SqliteUpdateStore
from telegram_fence.ingress.webhook import WebhookIntake
from telegram_fence.store.schema import PENDING, SKIPPED


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteUpdateStore]:
    with store_of("sqlite", tmp_path, busy_timeout=0.2) as s:
        yield s






def states(store: SqliteUpdateStore) -> dict[int, int]:
    with store.write() as conn:
        return dict(conn.execute("SELECT update_id, state FROM fence_updates").fetchall())


def body(u: dict[str, Any]) -> bytes:
    return json.dumps(u).encode()


def test_a_delivered_update_is_stored_before_200(store: SqliteUpdateStore) -> None:
    """A POST with the right secret and an update answers 200 with an empty body, and the update is stored."""
    app = WebhookIntake(store, SECRET)
    with serving(app) as port:
        status, _, answer = post(port, body(update(7)))
    assert (status, answer) == (200, b"")
    assert stored_ids(store) == [7]


def test_missing_or_wrong_secret_is_401_and_stores_nothing(store: SqliteUpdateStore) -> None:
    """A missing, wrong or prefix-only secret answers 401 and nothing is stored."""
    app = WebhookIntake(store, SECRET)
    with serving(app) as port:
        assert post(port, body(update(1)), secret=None)[0] == 401
        assert post(port, body(update(2)), secret="wrong")[0] == 401
        assert post(port, body(update(3)), secret=SECRET[:-1])[0] == 401
        assert post(port, body(update(4)), secret=SECRET + "x")[0] == 401
    assert stored_ids(store) == []


def test_only_post_is_accepted(store: SqliteUpdateStore) -> None:
    """GET, PUT and HEAD answer 405 with an Allow: POST header, and nothing is stored."""
    app = WebhookIntake(store, SECRET)
    with serving(app) as port:
        for method in ("GET", "PUT", "DELETE"):
            status, headers, _ = post(port, body(update(1)) if method == "PUT" else None, method=method)
            assert status == 405
            assert headers["allow"] == "POST"
        status, headers, _ = post(port, None, method="HEAD")
        assert status == 405
    assert stored_ids(store) == []


@pytest.mark.parametrize("payload", [
    b"{not json",
    b"[1, 2]",
    b'"text"',
    b"{}",
    b'{"update_id": "5"}',
    b'{"update_id": -1}',
    b'{"update_id": true}',
    b'{"update_id": 5.0}',
    b'{"update_id": 5, "x": NaN}',
    b"\xff\xfe{}",
    b"",
])
def test_malformed_bodies_are_400(store: SqliteUpdateStore, payload: bytes) -> None:
    """A body that is not a JSON object with a non-negative integer update_id answers 400; nothing is stored."""
    app = WebhookIntake(store, SECRET)
    with serving(app) as port:
        assert post(port, payload)[0] == 400
    assert stored_ids(store) == []


def test_an_update_nesting_too_deep_is_kept_as_an_exhaustion_and_answered_200(store: SqliteUpdateStore) -> None:
    """An update nesting 100000 levels deep answers 200 and is stored as an exhaustion holding only its update_id;
    deep bodies without a readable update_id still answer 400.
    """
    depth = 100_000
    app = WebhookIntake(store, SECRET, max_body=4 * depth)
    deep = b"[" * depth + b"]" * depth
    with serving(app) as port:
        assert post(port, b'{"message":' + deep + b', "update_id": 9}')[0] == 200
        assert post(port, b'{"message":' + deep + b"}")[0] == 400
        assert post(port, b'{"update_id": 10, "message":' + deep)[0] == 400
    assert states(store) == {9: 3}
    (exhaustion,) = store.due_exhaustions()
    assert dict(exhaustion.update) == {"update_id": 9} and "nests too deep" in exhaustion.error


def test_a_body_above_max_body_is_413(store: SqliteUpdateStore) -> None:
    """A declared body above max_body answers 413, and one of exactly max_body is accepted."""
    app = WebhookIntake(store, SECRET, max_body=300)
    big = body({**update(1), "pad": "x" * 400})
    exact = body({**update(2), "pad": ""})
    exact = exact[:-1] + b" " * (300 - len(exact)) + b"}"
    assert len(exact) == 300
    with serving(app) as port:
        assert post(port, big)[0] == 413
        assert post(port, exact)[0] == 200
    assert stored_ids(store) == [2]


def test_a_body_without_content_length_is_read_to_its_end_within_the_limit(store: SqliteUpdateStore) -> None:
    """Without Content-Length the body is read to its end: a small one is stored, one above max_body is 413."""
    app = WebhookIntake(store, SECRET, max_body=300)
    head = (b"POST /hook HTTP/1.0\r\nHost: x\r\nX-Telegram-Bot-Api-Secret-Token: " + SECRET.encode()
            + b"\r\nContent-Type: application/json\r\n\r\n")
    with serving(app) as port:
        assert raw_request(port, head, [body(update(5))])[0] == 200
        assert raw_request(port, head, [body({**update(6), "pad": "y" * 1000})])[0] == 413
    assert stored_ids(store) == [5]


class CountingStream(io.BytesIO):
    """A wsgi.input that counts the bytes handed out."""

    handed = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.handed += len(data)
        return data


def call_app(app: WebhookIntake, environ: dict[str, Any]) -> tuple[str, dict[str, str]]:
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen["status"], seen["headers"] = status, dict(headers)

    b"".join(app(environ, start_response))
    return seen["status"], seen["headers"]


def test_the_intake_never_reads_more_than_max_body_plus_one(store: SqliteUpdateStore) -> None:
    """Called as a plain WSGI app with a huge stream and no Content-Length, it reads at most max_body + 1 bytes."""
    app = WebhookIntake(store, SECRET, max_body=1000)
    stream = CountingStream(b"{" + b" " * 10_000_000 + b"}")
    status, _ = call_app(app, {"REQUEST_METHOD": "POST", "wsgi.input": stream,
                               "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": SECRET})
    assert status.startswith("413")
    assert stream.handed <= 1001
    declared = CountingStream(b"{" + b" " * 10_000_000 + b"}")
    status, _ = call_app(app, {"REQUEST_METHOD": "POST", "wsgi.input": declared, "CONTENT_LENGTH": "10000002",
                               "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": SECRET})
    assert status.startswith("413")
    assert declared.handed == 0


def test_a_bad_content_length_is_400(store: SqliteUpdateStore) -> None:
    """A Content-Length that is not a number, or longer than the body sent, answers 400."""
    app = WebhookIntake(store, SECRET)
    environ = {"REQUEST_METHOD": "POST", "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": SECRET}
    status, _ = call_app(app, {**environ, "CONTENT_LENGTH": "12a", "wsgi.input": io.BytesIO(body(update(1)))})
    assert status.startswith("400")
    status, _ = call_app(app, {**environ, "CONTENT_LENGTH": "500", "wsgi.input": io.BytesIO(body(update(1)))})
    assert status.startswith("400")
    assert stored_ids(store) == []


def test_a_duplicate_is_200_and_stored_once(store: SqliteUpdateStore) -> None:
    """The same update_id delivered three times answers 200 each time and is stored once."""
    app = WebhookIntake(store, SECRET)
    with serving(app) as port:
        assert [post(port, body(update(9)))[0] for _ in range(3)] == [200, 200, 200]
    assert stored_ids(store) == [9]
    assert store.stats()["pending"] == 1


def test_payloads_are_stored_as_python_reads_the_body(store: SqliteUpdateStore) -> None:
    """The stored payload is the update the intake parsed, also where SQLite would read the raw body otherwise
    (repeated keys: Python keeps the last), and non-ASCII text survives byte for byte."""
    app = WebhookIntake(store, SECRET)
    twice = b'{"update_id": 7, "message": {"text": "old"}, "update_id": 8, "message": {"text": "new"}}'
    plain = json.dumps(update(9, text="h\u00e9llo \u2603"), ensure_ascii=False).encode()
    with serving(app) as port:
        assert post(port, twice)[0] == 200
        assert post(port, plain)[0] == 200
    with store.write() as conn:
        payloads = {row[0]: json.loads(row[1]) for row in conn.execute("SELECT update_id, payload FROM fence_updates")}
    assert payloads == {8: {"update_id": 8, "message": {"text": "new"}}, 9: update(9, text="h\u00e9llo \u2603")}


def test_the_polling_cursor_is_never_moved(store: SqliteUpdateStore) -> None:
    """Deliveries above and below the stored cursor leave it where the last poller left it."""
    store.record([update(50)], 51)
    app = WebhookIntake(store, SECRET)
    with serving(app) as port:
        assert post(port, body(update(80)))[0] == 200
        assert post(port, body(update(20)))[0] == 200
    assert store.next_offset() == 51
    assert stored_ids(store) == [20, 50, 80]


def test_a_store_failure_is_500_and_a_retry_stores_it(store: SqliteUpdateStore) -> None:
    """While another process holds the write lock the delivery answers 500; redelivered later it is stored."""
    app = WebhookIntake(store, SECRET)
    other = apsw.Connection(store.path)
    with serving(app) as port:
        other.execute("BEGIN IMMEDIATE")
        try:
            assert post(port, body(update(3)))[0] == 500
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert stored_ids(store) == []
        assert post(port, body(update(3)))[0] == 200
    assert stored_ids(store) == [3]
    assert app.stats()["failed"] == 1


def test_unauthorised_updates_are_skipped_and_never_captured(store: SqliteUpdateStore) -> None:
    """authorize() false (or raising) stores the update as skipped, answers 200, and capture never sees it."""
    captured: list[int] = []

    def authorize(raw: dict[str, Any]) -> bool:
        chat = raw["message"]["chat"]["id"]
        if chat == 667:
            raise RuntimeError("authorization service down")
        return bool(chat != 666)

    def capture(conn: Any, new_updates: list[dict[str, Any]]) -> None:
        captured.extend(u["update_id"] for u in new_updates)

    app = WebhookIntake(store, SECRET, authorize=authorize, capture=capture)
    with serving(app) as port:
        assert post(port, body(update(1, chat=5)))[0] == 200
        assert post(port, body(update(2, chat=666)))[0] == 200
        assert post(port, body(update(3, chat=667)))[0] == 200
    assert states(store) == {1: PENDING, 2: SKIPPED, 3: SKIPPED}
    assert captured == [1]
    assert store.stats()["skipped"] == 2


def call(app: WebhookIntake, u: dict[str, Any]) -> int:
    """One delivery through the WSGI interface on this thread (as a server's pool thread makes it)."""
    statuses: list[str] = []
    b"".join(app(direct_environ(body(u)), lambda status, headers: statuses.append(status)))
    return int(statuses[0].split()[0])


def direct_environ(data: bytes) -> dict[str, Any]:
    return {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(len(data)), "wsgi.input": io.BytesIO(data),
            "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": SECRET}


def test_pool_threads_coming_straight_back_are_each_answered_after_their_own_commit(
    store: SqliteUpdateStore,
) -> None:
    """Pool threads that deliver again as soon as they are answered are all answered 200, each update stored once
    and on disk when its request is answered."""
    app = WebhookIntake(store, SECRET)
    failures: list[str] = []

    def pool(first: int) -> None:
        for update_id in range(first, first + 25):
            status = call(app, update(update_id, chat=first))
            if status != 200 or update_id not in stored_ids(store):
                failures.append(f"{update_id}: {status}")

    threads = [threading.Thread(target=pool, args=(1 + 100 * i,), name=f"pool-{i}") for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
    assert stored_ids(store) == sorted(1 + 100 * i + k for i in range(8) for k in range(25))
    stats = app.stats()
    assert stats["stored"] == 200 and stats["waiting"] == 0
    assert app.close(10)


def test_a_slow_client_holds_no_other_request(store: SqliteUpdateStore) -> None:
    """A client sending its body slowly does not delay the others; its update is stored once it arrives."""
    app = WebhookIntake(store, SECRET)
    slow_body = body(update(100))
    head = (b"POST /hook HTTP/1.0\r\nHost: x\r\nX-Telegram-Bot-Api-Secret-Token: " + SECRET.encode()
            + b"\r\nContent-Length: " + str(len(slow_body)).encode() + b"\r\n\r\n")
    with serving(app) as port:
        sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        sock.sendall(head + slow_body[:10])
        try:
            statuses = [post(port, body(update(i)))[0] for i in range(1, 6)]
            assert statuses == [200] * 5
            assert stored_ids(store) == [1, 2, 3, 4, 5]
            sock.sendall(slow_body[10:])
            answer = sock.recv(100)
        finally:
            sock.close()
    assert answer.split(b" ")[1] == b"200"
    assert stored_ids(store) == [1, 2, 3, 4, 5, 100]


def test_after_close_deliveries_are_503(store: SqliteUpdateStore) -> None:
    """close() makes later deliveries answer 503 (Telegram retries them) without storing them."""
    app = WebhookIntake(store, SECRET)
    with serving(app) as port:
        app.close()
        assert post(port, body(update(1)))[0] == 503
    assert stored_ids(store) == []


def test_close_answers_the_deliveries_in_hand_and_refuses_later_ones(store: SqliteUpdateStore) -> None:
    """close() during a commit: the deliveries already checked are still stored and answered 200, later ones 503,
    and close() returns True once every one in hand was answered."""
    in_commit = threading.Event()
    release = threading.Event()
    results: dict[int, int] = {}

    def capture(conn: Any, new_updates: list[dict[str, Any]]) -> None:
        if any(u["update_id"] == 1 for u in new_updates):
            in_commit.set()
            assert release.wait(20)

    app = WebhookIntake(store, SECRET, capture=capture)

    def deliver(update_id: int) -> None:
        results[update_id] = post(port, body(update(update_id, chat=update_id)))[0]

    with serving(app) as port:
        first = threading.Thread(target=deliver, args=(1,))
        first.start()
        assert in_commit.wait(10)
        queued = [threading.Thread(target=deliver, args=(i,)) for i in (2, 3, 4)]
        for thread in queued:
            thread.start()
        assert eventually(lambda: app.stats()["waiting"] == 4)
        assert app.close(0) is False  # closed, but four deliveries are still in hand
        assert post(port, body(update(9)))[0] == 503
        release.set()
        assert app.close(20) is True
        for thread in [first, *queued]:
            thread.join(20)
    assert results == {1: 200, 2: 200, 3: 200, 4: 200}
    assert stored_ids(store) == [1, 2, 3, 4]


@pytest.mark.parametrize("secret", ["", "has space", "x" * 257, "ünï", None])
def test_a_secret_telegram_would_refuse_is_refused(store: SqliteUpdateStore, secret: Any) -> None:
    """A secret outside Telegram's 1-256 characters of A-Za-z0-9_- raises ConfigurationError without echoing it."""
    with pytest.raises(ConfigurationError) as info:
        WebhookIntake(store, secret)
    assert not secret or secret not in str(info.value)


def test_requests_run_on_named_threads_that_stop_and_join(store: SqliteUpdateStore) -> None:
    """Each connection is served on a named thread, which records its own delivery; after stop, join and close
    none is left."""
    names: list[str] = []
    committers: list[str] = []
    app = WebhookIntake(store, SECRET, authorize=lambda u: names.append(threading.current_thread().name) or True,
                        on_commit=lambda updates: committers.append(threading.current_thread().name))
    with serving(app) as port:
        assert post(port, body(update(1)))[0] == 200
    assert names[0].startswith("fence-webhook-request-")
    assert committers == names[:1]
    left = [t.name for t in threading.enumerate() if t.name.startswith("fence-webhook")]
    assert left == []


def test_a_capture_source_gives_its_hook_and_what_is_no_store_or_hook_is_refused(
    store: SqliteUpdateStore, tmp_path: Path
) -> None:
    """capture= an object with record_hook (an Outbox, a CaptureRule) runs that hook in the record transaction;
    something that is not an update store, or a capture that is neither a hook nor gives one, is refused with
    ConfigurationError."""
    captured: list[int] = []

    class Source:
        @property
        def record_hook(self) -> Callable[[Any, Sequence[dict[str, Any]]], None]:
            return lambda conn, new_updates: captured.extend(u["update_id"] for u in new_updates)

    app = WebhookIntake(store, SECRET, capture=Source())
    with serving(app) as port:
        assert post(port, body(update(5)))[0] == 200
    assert captured == [5] and stored_ids(store) == [5]
    with pytest.raises(ConfigurationError, match="is not an update store"):
        WebhookIntake(object(), SECRET)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="capture must be"):
        WebhookIntake(store, SECRET, capture=42)  # type: ignore[arg-type]
