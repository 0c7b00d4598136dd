"""Webhook delivery of the fake Bot API: named threads that POST queued updates to the webhook, at most
``max_connections`` at once; an update leaves the queue only after a 2xx, failures are retried with backoff.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time

from ...retry import exponential
from .updates import Pending
from .webhook import WebhookConfig, WebhookState

__all__ = ["WebhookDelivery", "describe_failure"]


def describe_failure(exc: BaseException) -> str:
    """The ``last_error_message`` Telegram shows for a delivery that got no HTTP answer."""
    if isinstance(exc, ConnectionRefusedError):
        return "Connection refused"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "Read timeout expired"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)):
        return "Connection reset by peer"
    if isinstance(exc, http.client.HTTPException):
        return f"Wrong response from the webhook: {type(exc).__name__}"
    return f"Connection failed: {exc}"


class WebhookDelivery:
    """The delivery threads of one fake. Thread-safe: all state is read and changed under the webhook's
    ``cond``; :meth:`start`/:meth:`stop` are called by the fake's own ``start``/``stop``.
    """

    def __init__(
        self,
        state: WebhookState,
        stopping: threading.Event,
        *,
        retry_delay: float,
        max_retry_delay: float,
        timeout: float,
    ) -> None:
        self.state = state
        self.cond = state.cond
        self.stopping = stopping
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.timeout = timeout
        self._name = "fake-bot-api"
        self._running = False
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads not holding a delivery
        self._seq = 0
        self._conns: set[http.client.HTTPConnection] = set()
        self._conn_lock = threading.Lock()
        state.on_change = self.spawn
        state.updates.on_queued = self.spawn

    def start(self, port: int) -> None:
        """Deliver from now on (threads named after ``port``); starts threads for updates already queued."""
        with self.cond:
            self._name = f"fake-bot-api:{port}-webhook"
            self._running = True
            self.spawn()

    def stop(self) -> None:
        """Stop delivering: cut the connections in flight (their updates stay queued) and join every thread.

        The fake's ``stopping`` event is set before this is called.
        """
        with self.cond:
            self._running = False
            threads, self._threads = self._threads, []
            self.cond.notify_all()
        with self._conn_lock:
            for conn in self._conns:
                if conn.sock is not None:
                    with contextlib.suppress(OSError):
                        conn.sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join()
        with self.cond:
            self._idle = 0

    def spawn(self) -> None:
        """Start a thread for each update that can be delivered now and has no idle thread to take it."""
        with self.cond:
            config = self.state.config
            if not self._running or config is None or config.target is None:
                return
            room = config.max_connections - len(self._threads)
            if room <= 0:
                return
            missing = self.state.free_count(self._idle + room) - self._idle
            for _ in range(min(room, missing)):
                self._seq += 1
                thread = threading.Thread(target=self._run, name=f"{self._name}-{self._seq}", daemon=True)
                self._threads.append(thread)
                self._idle += 1
                thread.start()

    def _run(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            config, item = job
            try:
                self._deliver(config, item)
            finally:
                with self.cond:
                    self._idle += 1

    def _next_job(self) -> tuple[WebhookConfig, Pending] | None:
        with self.cond:
            while self._running and not self.stopping.is_set():
                job = self.state.next_job()
                if job is not None:
                    self._idle -= 1
                    return job
                wait = self.state.retry_at - time.monotonic() if self.state.retry_at else None
                self.cond.wait(None if wait is None or wait <= 0 else wait)
            return None

    def _deliver(self, config: WebhookConfig, item: Pending) -> None:
        assert config.target is not None
        scheme, host, port, path = config.target
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        conn = cls(host, port, timeout=self.timeout)
        headers = {"Content-Type": "application/json"}
        if config.secret is not None:
            headers["X-Telegram-Bot-Api-Secret-Token"] = config.secret
        error: str | None
        try:
            conn.connect()
            with self._conn_lock:
                stopping = self.stopping.is_set()  # checked under the lock stop() cuts connections with
                if not stopping:
                    self._conns.add(conn)
            if stopping:
                self.state.release(item)
                return
            conn.request("POST", path, body=item.body.encode("utf-8"), headers=headers)
            response = conn.getresponse()
            response.read()
            ok = 200 <= response.status < 300
            error = None if ok else f"Wrong response from the webhook: {response.status} {response.reason}"
        except (OSError, http.client.HTTPException) as exc:
            if self.stopping.is_set():
                self.state.release(item)
                return
            error = describe_failure(exc)
        finally:
            with self._conn_lock:
                self._conns.discard(conn)
            conn.close()
        self.state.finish(config, item, error, self._backoff)

    def _backoff(self, failures: int) -> float:
        return exponential(failures, self.retry_delay, self.max_retry_delay)
