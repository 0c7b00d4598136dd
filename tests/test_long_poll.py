"""The poller's own getUpdates connection: the same answers and the same errors as telebot's call."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from telebot import apihelper
from tls_helpers import Authority, TlsFront, make_ca

from telegram_fence import telegram
from telegram_fence.errors import Ambiguous, Conflict, Fatal, RetryAfter, TelegramError, Transient, Unauthorized
from telegram_fence.ingress.long_poll import LongPoll, UpdateBatch, get_updates
from telegram_fence.testing import FakeBotAPI


def direct(api: FakeBotAPI, connection: LongPoll, offset: int = 0) -> list[dict[str, Any]]:
    return get_updates(api.token, offset, long_poll_timeout=0.01, connection=connection)


def test_the_direct_call_returns_what_telebots_call_returns_and_keeps_the_answer(fake_bot_api: FakeBotAPI) -> None:
    """Same dicts as through telebot; the batch carries the answer's bytes; an offset confirms."""
    ids = fake_bot_api.push_messages(3, chats=[1, 2], text="é {i}")
    connection = LongPoll()
    batch = direct(fake_bot_api, connection)
    assert isinstance(batch, UpdateBatch)
    assert batch == get_updates(fake_bot_api.token, 0, long_poll_timeout=0.01)
    assert [u["update_id"] for u in batch] == ids
    assert json.loads(batch.body) == {"ok": True, "result": list(batch)}
    assert direct(fake_bot_api, connection, ids[-1] + 1) == []
    assert fake_bot_api.confirmed_offset == ids[-1] + 1
    connection.close()


def test_allowed_updates_and_limit_reach_the_server(fake_bot_api: FakeBotAPI) -> None:
    """The request carries the same parameters telebot would send."""
    fake_bot_api.push_messages(3)
    fake_bot_api.push_update({"callback_query": {"id": "c1", "from": {"id": 1, "is_bot": False, "first_name": "A"},
                                                 "chat_instance": "x"}})
    connection = LongPoll()
    assert len(get_updates(fake_bot_api.token, 0, limit=2, long_poll_timeout=0.01, connection=connection)) == 2
    only = get_updates(fake_bot_api.token, 0, long_poll_timeout=0.01, allowed_updates=["callback_query"],
                       connection=connection)
    assert [kind for update in only for kind in update if kind != "update_id"] == ["callback_query"]
    connection.close()


@pytest.mark.parametrize(
    ("fault", "expected", "check"),
    [
        (lambda api: api.fail("getUpdates", 409), Conflict, lambda e: e.error_code == 409),
        (lambda api: api.fail("getUpdates", 429, retry_after=7), RetryAfter, lambda e: e.seconds == 7),
        (lambda api: api.fail("getUpdates", 401), Unauthorized, lambda e: e.error_code == 401),
        (lambda api: api.fail("getUpdates", 500), Ambiguous, lambda e: e.error_code == 500),
        (lambda api: api.fail("getUpdates", 502, html=True), Ambiguous, lambda e: e.error_code == 502),
        (lambda api: api.fail("getUpdates", 429, retry_after=3, html=True), RetryAfter, lambda e: e.seconds == 3),
        (lambda api: api.malformed("getUpdates"), Ambiguous, lambda e: "not valid JSON" in str(e)),
        (lambda api: api.malformed("getUpdates", body=b'{"result": []}'), Ambiguous, lambda e: "'ok'" in str(e)),
        (lambda api: api.drop("getUpdates", times=2), Ambiguous, lambda e: True),
    ],
    ids=["409", "429", "401", "500", "502-html", "429-html", "not-json", "no-ok", "dropped"],
)
def test_every_failure_is_classified_as_through_telebot(
    fake_bot_api: FakeBotAPI,
    fault: Callable[[FakeBotAPI], None],
    expected: type[TelegramError],
    check: Callable[[Any], bool],
) -> None:
    """Each fault gives the error the poller's policy expects, without the token in its text."""
    fake_bot_api.push_messages(1)
    connection = LongPoll()
    assert len(direct(fake_bot_api, connection)) == 1  # the connection is warm: faults hit a reused one
    fault(fake_bot_api)
    with pytest.raises(expected) as info:
        direct(fake_bot_api, connection)
    assert check(info.value)
    assert info.value.method == "getUpdates"
    assert fake_bot_api.token not in str(info.value)
    assert len(direct(fake_bot_api, connection)) == 1  # and the next call works again
    connection.close()


def test_a_server_that_is_down_is_transient(fake_bot_api: FakeBotAPI) -> None:
    """Connection refused: nothing was sent, so the poller just backs off."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    previous = telegram.set_api_server(f"http://127.0.0.1:{port}/bot{{0}}/{{1}}")
    try:
        with pytest.raises(Transient):
            direct(fake_bot_api, LongPoll())
    finally:
        telegram.set_api_server(*previous)


@pytest.fixture
def closing_server() -> Iterator[tuple[str, list[int]]]:
    """An HTTP server that answers keep-alive but hangs up after every answer (a stale connection)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[int] = []
    stop = threading.Event()
    body = json.dumps({"ok": True, "result": [{"update_id": 5, "message": {"message_id": 1}}]}).encode()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                accepted.append(1)
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    request += chunk
                if request:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    thread = threading.Thread(target=serve, name="closing-server", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/bot{{0}}/{{1}}"
    yield url, accepted
    stop.set()
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (a close alone leaves it blocked on Linux)
    listener.close()
    thread.join(5)
    assert not thread.is_alive()


def test_a_kept_alive_connection_the_server_closed_is_replaced_without_an_error(
    closing_server: tuple[str, list[int]],
) -> None:
    """The request that finds the old connection closed is sent again on a new one."""
    url, accepted = closing_server
    previous = telegram.set_api_server(url)
    try:
        connection = LongPoll()
        for _ in range(3):
            batch = get_updates("123:" + "a" * 35, 0, long_poll_timeout=0.01, connection=connection)
            assert [u["update_id"] for u in batch] == [5]
        assert len(accepted) == 3
        connection.close()
    finally:
        telegram.set_api_server(*previous)


def test_direct_polling_steps_aside_for_proxies_and_custom_senders(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where telebot is set up to send requests its own way, getUpdates goes through telebot."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert telegram.direct_polling_allowed()
    with monkeypatch.context() as patched:
        patched.setenv("NO_PROXY", "localhost")  # names hosts to reach directly, no proxy
        assert telegram.direct_polling_allowed()
    with monkeypatch.context() as patched:
        patched.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
        assert not telegram.direct_polling_allowed()
    with monkeypatch.context() as patched:
        patched.setattr(apihelper, "proxy", {"https": "socks5://proxy.invalid:1080"})
        assert not telegram.direct_polling_allowed()
    with monkeypatch.context() as patched:
        patched.setattr(apihelper, "CUSTOM_REQUEST_SENDER", lambda *a, **k: None)
        assert not telegram.direct_polling_allowed()
    assert telegram.direct_polling_allowed()


def test_only_http_and_https_addresses_are_accepted() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        LongPoll().get("ftp://example.org/x", 1.0)


# --- TLS: the trust requests and telebot use -----------------------------------


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def no_ca_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    return monkeypatch


@pytest.mark.parametrize("variable", ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_the_direct_connection_trusts_the_ca_bundle_requests_would_use(
    fake_bot_api: FakeBotAPI, authority: Authority, no_ca_env: pytest.MonkeyPatch, variable: str
) -> None:
    """A Bot API server behind a private CA works directly when the environment names the CA, as with telebot:
    the poller's own connection reads these variables, not only certifi's bundle."""
    no_ca_env.setenv(variable, str(authority.ca))
    ids = fake_bot_api.push_messages(2)
    with TlsFront(authority, fake_bot_api.port) as front, telegram.api_server(front.api_url):
        assert [u["update_id"] for u in get_updates(fake_bot_api.token, 0, long_poll_timeout=0.01)] == ids
        connection = LongPoll()
        try:
            assert [u["update_id"] for u in direct(fake_bot_api, connection)] == ids
        finally:
            connection.close()


def test_requests_precedence_decides_between_the_two_variables(
    fake_bot_api: FakeBotAPI, authority: Authority, no_ca_env: pytest.MonkeyPatch
) -> None:
    """REQUESTS_CA_BUNDLE wins over CURL_CA_BUNDLE, as in requests: a wrong first bundle fails both paths alike."""
    import certifi

    no_ca_env.setenv("REQUESTS_CA_BUNDLE", certifi.where())
    no_ca_env.setenv("CURL_CA_BUNDLE", str(authority.ca))
    with TlsFront(authority, fake_bot_api.port) as front, telegram.api_server(front.api_url):
        with pytest.raises(TelegramError) as through_telebot:
            get_updates(fake_bot_api.token, 0, long_poll_timeout=0.01)
        connection = LongPoll()
        with pytest.raises(TelegramError) as direct_call:
            direct(fake_bot_api, connection)
    assert type(through_telebot.value) is type(direct_call.value) is Fatal
    assert "certificate verification failed" in str(direct_call.value)


def test_an_untrusted_certificate_is_fatal_on_the_direct_connection(
    fake_bot_api: FakeBotAPI, authority: Authority, no_ca_env: pytest.MonkeyPatch
) -> None:
    """A certificate that fails verification is Fatal, naming the problem and the variable to set, not Transient."""
    with TlsFront(authority, fake_bot_api.port) as front, telegram.api_server(front.api_url):
        connection = LongPoll()
        with pytest.raises(Fatal) as info:
            direct(fake_bot_api, connection)
    assert "certificate verification failed" in str(info.value) and "REQUESTS_CA_BUNDLE" in str(info.value)
    assert fake_bot_api.token.split(":")[1] not in str(info.value)


def test_a_ca_bundle_that_cannot_be_read_is_fatal_and_named(
    fake_bot_api: FakeBotAPI, authority: Authority, no_ca_env: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A bundle path that does not exist ends the call with a Fatal error naming the variable, on both paths."""
    no_ca_env.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with TlsFront(authority, fake_bot_api.port) as front, telegram.api_server(front.api_url):
        with pytest.raises(Fatal, match="REQUESTS_CA_BUNDLE"):
            direct(fake_bot_api, LongPoll())
        with pytest.raises(Fatal, match="REQUESTS_CA_BUNDLE"):
            get_updates(fake_bot_api.token, 0, long_poll_timeout=0.01)


def test_a_fence_behind_a_private_ca_polls_with_the_bundle_and_ends_without_it(
    fake_bot_api: FakeBotAPI, authority: Authority, no_ca_env: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """With REQUESTS_CA_BUNDLE the fence handles updates over TLS; without it run() ends at once with exit code 1
    and an ended_reason naming the certificate, instead of retrying forever."""
    import telebot

    from telegram_fence.runtime.fence import EXIT_POLLER_ENDED, Fence

    bot = telebot.TeleBot(fake_bot_api.token, threaded=False)
    handled: list[int] = []
    ids = fake_bot_api.push_messages(3)
    with TlsFront(authority, fake_bot_api.port) as front, telegram.api_server(front.api_url):
        assert telegram.direct_polling_allowed()
        ended: list[str] = []
        fence = Fence(bot, str(tmp_path / "a.db"), long_poll_timeout=0.3, on_ended=ended.append)
        fence.handler(lambda update: None)
        codes: list[int] = []
        runner = threading.Thread(target=lambda: codes.append(fence.run()), name="test-fence-run")
        runner.start()
        runner.join(20)
        if runner.is_alive():  # still retrying: stop it so the test fails instead of hanging
            fence.stop()
            runner.join(20)
        assert codes == [EXIT_POLLER_ENDED]
        assert ended == [fence.ended_reason]
        assert fence.ended_reason is not None and "certificate verification failed" in fence.ended_reason

        no_ca_env.setenv("REQUESTS_CA_BUNDLE", str(authority.ca))
        fence = Fence(bot, str(tmp_path / "b.db"), long_poll_timeout=0.3, shutdown_timeout=3.0)
        fence.handler(lambda update: handled.append(update.update_id))
        fence.start()
        try:
            assert fake_bot_api.wait_for(lambda: len(handled) == 3, timeout=10)
        finally:
            fence.stop()
            assert fence.join(10)
    assert sorted(handled) == ids and fence.ended_reason is None


# --- oversize answers (hostile input) ---------------------------------------------------


def test_an_answer_larger_than_the_limit_is_fatal_not_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A getUpdates answer above MAX_ANSWER_BYTES ends the call with a Fatal error saying so; one below is read.

    Before, the whole answer was read into memory whatever its size (a hostile server could exhaust it).
    """
    from hostile_api import TOKEN, HostileAPI, answer, message

    from telegram_fence.ingress import long_poll

    monkeypatch.setattr(long_poll, "MAX_ANSWER_BYTES", 1_000_000)
    with HostileAPI() as server, telegram.api_server(server.api_url):
        server.script(answer([message(1, text="x" * 900_000)]), answer([message(2, text="x" * 1_100_000)]))
        connection = LongPoll()
        assert [u["update_id"] for u in get_updates(TOKEN, 0, long_poll_timeout=0.01, connection=connection)] == [1]
        with pytest.raises(Fatal, match="larger than 1000000 bytes"):
            get_updates(TOKEN, 2, long_poll_timeout=0.01, connection=connection)
        connection.close()


# --- answers nesting too deep ----------------------------------------------


def deep(depth: int) -> str:
    """A JSON array nested ``depth`` levels deep."""
    return "[" * depth + "]" * depth


def test_read_answer_reads_item_by_item_what_pythons_reader_cannot_read_whole() -> None:
    """An answer with one update nesting 100000 levels deep is read item by item: the others as Python reads
    them, the deep one as an UnreadableUpdate holding only its update_id; one without an id becomes None.
    """
    from telegram_fence.ingress.long_poll import UNREADABLE_REASON, read_answer
    from telegram_fence.updates import UnreadableUpdate

    body = ('{"ok":true, "result":[{"update_id":1,"message":{"text":"a \\" ] }"}}, '
            f'{{"deep":{deep(100_000)},"update_id":2}},{{"x":{deep(100_000)}}},{{"update_id":3}}]}}')
    with pytest.raises(RecursionError):
        json.loads(body)
    answer = read_answer(body.encode())
    assert answer["ok"] is True
    first, second, third, fourth = answer["result"]
    assert first == {"update_id": 1, "message": {"text": 'a " ] }'}} and fourth == {"update_id": 3}
    assert isinstance(second, UnreadableUpdate) and second == {"update_id": 2} and second.reason == UNREADABLE_REASON
    assert third is None
    assert read_answer(b'{"ok":true,"result":[]}') == {"ok": True, "result": []}


@pytest.mark.parametrize(
    "body",
    [
        f'{{"ok":true,"result":[],"junk":{deep(100_000)}}}',  # too deep outside the items
        deep(100_000),  # not an object at all
        f'{{"ok":true,"result":[{{"update_id":1,"d":{deep(100_000)}}}]',  # cut short
        f'{{"ok":true,"result":[{{"update_id":1,"d":{deep(100_000)}}}]}} trailing',
    ],
    ids=["deep-outside-the-items", "not-an-object", "cut-short", "trailing-data"],
)
def test_an_answer_too_deep_to_read_at_all_is_ambiguous(body: str) -> None:
    """A deep answer that cannot be read item by item is Ambiguous on both paths (retried, nothing confirmed)."""
    from hostile_api import TOKEN, HostileAPI

    with HostileAPI() as server, telegram.api_server(server.api_url):
        server.script(body.encode(), body.encode())
        connection = LongPoll()
        with pytest.raises(Ambiguous, match="not valid JSON"):
            get_updates(TOKEN, 0, long_poll_timeout=0.01, connection=connection)
        connection.close()
        with pytest.raises(Ambiguous, match="not valid JSON"):
            get_updates(TOKEN, 0, long_poll_timeout=0.01)


@pytest.mark.parametrize("path", ["direct", "telebot"])
def test_an_update_too_deep_to_read_comes_back_alone_as_unreadable(path: str) -> None:
    """On either path an answer holding one update too deep to read gives the others as dicts and that one as
    an UnreadableUpdate; the direct batch then carries no answer bytes (they must not be stored).
    """
    from hostile_api import TOKEN, HostileAPI, message

    from telegram_fence.updates import UnreadableUpdate

    body = ('{"ok":true,"result":[' + json.dumps(message(5)) + f',{{"update_id":6,"d":{deep(100_000)}}},'
            + json.dumps(message(7)) + "]}")
    with HostileAPI() as server, telegram.api_server(server.api_url):
        server.script(body.encode())
        connection = LongPoll() if path == "direct" else None
        batch = get_updates(TOKEN, 0, long_poll_timeout=0.01, connection=connection)
        if connection is not None:
            connection.close()
    assert [u["update_id"] for u in batch] == [5, 6, 7]
    assert batch[0] == message(5) and batch[2] == message(7)
    assert isinstance(batch[1], UnreadableUpdate) and not isinstance(batch, UpdateBatch)


def test_abort_ends_a_connect_that_hangs() -> None:
    """A stop while the poller's connect hangs (the server's accept queue is full, so its SYNs go unanswered) ends
    the call at once instead of after the connect timeout."""
    import socket
    import threading
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue; Linux then drops the next SYN
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.1)
    probe = socket.socket()
    probe.settimeout(0.3)
    try:
        probe.connect(("127.0.0.1", port))
        pytest.skip("this kernel answers a connect with a full accept queue")
    except OSError:
        pass
    finally:
        probe.close()
    connection = LongPoll(connect_timeout=30.0)
    raised: list[BaseException] = []

    def call() -> None:
        try:
            connection.get(f"http://127.0.0.1:{port}/botX/getUpdates", timeout=30.0)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=call, name="test-long-poll")
    thread.start()
    time.sleep(0.3)
    began = time.monotonic()
    connection.abort()
    thread.join(5)
    try:
        assert not thread.is_alive(), "the aborted connect still hangs"
        assert time.monotonic() - began < 1.0
        assert raised and isinstance(raised[0], OSError)
    finally:
        connection.close()
        for filler in fillers:
            filler.close()
        server.close()
