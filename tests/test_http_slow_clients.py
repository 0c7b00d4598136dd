"""The library's own HTTP servers (the ``metrics=`` port, ``run_webhook``'s listener) answer at once while slow
or silent clients hold connections, and cut a request that does not arrive whole within its bound, however
steadily it trickles. Real sockets against a real fence."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
import telebot
from helpers import eventually

from telegram_fence import Fence
from telegram_fence.ingress.webhook import WsgiServer


def _trickle(port: int, stop: threading.Event, interval: float = 1.0) -> socket.socket:
    """A client on ``port`` that sends the start of a request one byte per ``interval`` seconds until ``stop``
    is set or the server closes the connection (on its own thread ``trickle``, joined by the caller's stop)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"G")

    def drip() -> None:
        for byte in b"ET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
            if stop.wait(interval):
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                return

    threading.Thread(target=drip, name="trickle", daemon=True).start()
    return sock


@contextmanager
def _held(port: int, idle: int = 5, slow: int = 2) -> Iterator[list[socket.socket]]:
    """``slow`` clients sending a byte a second and ``idle`` clients that connected (one sent a whole request
    line asking to keep the connection alive, then nothing more) and say nothing; closed at the end."""
    stop = threading.Event()
    with ExitStack() as stack:
        stack.callback(stop.set)
        socks = [_trickle(port, stop) for _ in range(slow)]
        for n in range(idle):
            sock = socket.create_connection(("127.0.0.1", port))
            if n == 0:
                sock.sendall(b"GET /livez HTTP/1.1\r\nConnection: keep-alive\r\n")
            socks.append(sock)
        for sock in socks:
            stack.callback(sock.close)
        time.sleep(0.3)  # the server took every connection (each is on its own thread now, or waiting in line)
        yield socks


def _timed_get(url: str) -> tuple[int, float]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as answer:
        answer.read()
        return answer.status, time.monotonic() - started


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (a read gives end of file or a reset), ``None`` if not in time."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(1024):
            pass
    except TimeoutError:
        return None
    except OSError:
        pass
    return time.monotonic() - started


def test_livez_answers_within_a_second_while_slow_and_idle_clients_hold_the_metrics_port(
    bot: telebot.TeleBot, db: str
) -> None:
    """Two clients sending a byte a second and five silent ones keep neither ``/livez`` nor ``/metrics`` waiting."""
    fence = Fence(bot, db, metrics=("127.0.0.1", 0))
    fence.start()
    try:
        assert fence.metrics_url is not None
        port = int(fence.metrics_url.rsplit(":", 1)[1])
        with _held(port):
            for path in ("/livez", "/livez", "/metrics", "/livez"):
                status, took = _timed_get(fence.metrics_url + path)
                assert status == 200 and took < 1.0, (path, took)
    finally:
        fence.stop()
        assert fence.join()


def test_a_request_trickled_to_the_metrics_port_is_cut_at_its_whole_request_bound(
    bot: telebot.TeleBot, db: str
) -> None:
    """A client sending a byte every half second (each read well within any per-read timeout) is disconnected
    once 5 s passed since it connected, not served for as long as it keeps dripping."""
    fence = Fence(bot, db, metrics=("127.0.0.1", 0))
    fence.start()
    try:
        assert fence.metrics_url is not None
        stop = threading.Event()
        sock = _trickle(int(fence.metrics_url.rsplit(":", 1)[1]), stop, interval=0.5)
        try:
            took = _closed_within(sock, 9.0)
            assert took is not None and 4.0 < took < 8.0, took
        finally:
            stop.set()
            sock.close()
    finally:
        fence.stop()
        assert fence.join()


def test_the_webhook_listener_takes_a_delivery_at_once_while_slow_clients_hold_it_and_cuts_them(
    bot: telebot.TeleBot, db: str
) -> None:
    """``run_webhook``'s server stores a delivery within a second while slow and silent clients hold
    connections, and cuts a trickling client once its whole-request bound (``request_timeout``) passed."""
    fence = Fence(bot, db)
    app = fence.webhook_app("s3cret")
    fence.start()
    server = WsgiServer(app, "127.0.0.1", 0, request_timeout=2.0)
    server.start()
    try:
        with _held(server.port) as held:
            body = json.dumps({"update_id": 7, "message": {"message_id": 1, "date": 0, "text": "hi",
                                                            "chat": {"id": 5, "type": "private"}}}).encode()
            request = urllib.request.Request(server.url, data=body, method="POST", headers={
                "Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": "s3cret"})
            started = time.monotonic()
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert answer.status == 200
            assert time.monotonic() - started < 1.0
            took = _closed_within(held[0], 5.0)
            assert took is not None and took < 3.0, took
    finally:
        server.stop()
        assert server.join(10)
        app.close()
        fence.stop()
        assert fence.join()


def _serving() -> list[str]:
    """The metrics port's connection threads alive now."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("fence-metrics-request-"))


def test_the_metrics_port_serves_at_most_32_connections_at_once_and_closes_the_next(
    bot: telebot.TeleBot, db: str
) -> None:
    """With 32 silent clients connected, a 33rd connection is closed at once (no thread is made for it); once
    they leave, ``/livez`` answers again."""
    fence = Fence(bot, db, metrics=("127.0.0.1", 0))
    fence.start()
    try:
        assert fence.metrics_url is not None
        port = int(fence.metrics_url.rsplit(":", 1)[1])
        with _held(port, idle=32, slow=0):
            assert eventually(lambda: len(_serving()) == 32)
            extra = socket.create_connection(("127.0.0.1", port))
            try:
                took = _closed_within(extra, 3.0)
                assert took is not None and took < 1.0, took
            finally:
                extra.close()
            assert len(_serving()) == 32, _serving()
        assert eventually(lambda: len(_serving()) < 32)  # the clients left: their threads notice and end
        status, _took = _timed_get(fence.metrics_url + "/livez")
        assert status == 200
    finally:
        fence.stop()
        assert fence.join()


def test_a_webhook_body_trickled_past_the_bound_is_answered_400_without_a_traceback(
    bot: telebot.TeleBot, db: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A delivery whose headers came but whose body drips past ``request_timeout`` is answered 400 naming why,
    nothing is stored, and nothing is printed (a slow client is the client's affair, not a server error)."""
    fence = Fence(bot, db)
    app = fence.webhook_app("s3cret")
    fence.start()
    server = WsgiServer(app, "127.0.0.1", 0, request_timeout=1.0)
    server.start()
    try:
        sock = socket.create_connection(("127.0.0.1", server.port))
        stop = threading.Event()
        try:
            sock.sendall(b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"X-Telegram-Bot-Api-Secret-Token: s3cret\r\nContent-Length: 100\r\n\r\n{")

            def drip() -> None:
                while not stop.wait(0.2):
                    try:
                        sock.send(b" ")
                    except OSError:
                        return

            dripping = threading.Thread(target=drip, name="drip", daemon=True)
            dripping.start()
            sock.settimeout(10)
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(1024)
                if not chunk:
                    break
                answer += chunk
        finally:
            stop.set()
            sock.close()
        assert answer.startswith(b"HTTP/1.0 400 "), answer
        assert fence.stats()["pending"] == 0
    finally:
        server.stop()
        assert server.join(10)
        app.close()
        fence.stop()
        assert fence.join()
    assert "Traceback" not in capfd.readouterr().err
