"""The library's own HTTP serving: each connection on a named thread of its own (capped), each request bounded as a
whole, and the server of a fence's ``metrics=`` address.

A client that sends a byte a second, or connects and says nothing, holds only its own thread, and only until its
bound; the next client, a liveness probe, is answered at once. Loaded only by a fence that serves HTTP itself.
"""

from __future__ import annotations

import http.server
import io
import itertools
import logging
import socket
import threading
import time
from typing import Any, Protocol

from .errors import ConfigurationError

__all__ = ["ConnectionThreads", "DeadlineReader", "MetricsServer", "WholeRequestBound"]

log = logging.getLogger("telegram_fence.http")

_TEXT = "text/plain; charset=utf-8"


class DeadlineReader(io.RawIOBase):
    """The reading side of ``sock``, ending at ``deadline`` (``time.monotonic()``): each read waits at most what
    is left, and a read once it passed raises :class:`TimeoutError` (as one silent past its bound does)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took longer than its bound")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class WholeRequestBound:
    """A mixin for a ``socketserver.StreamRequestHandler`` subclass: everything read from the connection
    (request line, headers, body) must arrive within :attr:`request_bound` seconds of the connection being taken;
    a later read raises :class:`TimeoutError` and the connection is closed. Writes wait at most what is left
    of the bound when the last read was made (a client that stops reading cannot hold the thread either)."""

    request_bound: float = 5.0
    connection: socket.socket
    rfile: Any
    rbufsize: int

    def setup(self) -> None:
        super().setup()  # type: ignore[misc]
        self.connection.settimeout(self.request_bound)
        made, deadline = self.rfile, time.monotonic() + self.request_bound
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, deadline),
                                       self.rbufsize if self.rbufsize > 0 else io.DEFAULT_BUFFER_SIZE)
        made.close()  # (the socket is really closed only once every file made from it is)


class ConnectionThreads:
    """A mixin placed before a ``socketserver.TCPServer`` subclass: each accepted connection is served on a
    thread of its own named ``{thread_name}-N``; past :attr:`max_connections` at once, a new connection is closed
    at once (the client tries again; those served go on). :meth:`join_connections` waits for them. Call
    :meth:`init_connections` in the server's ``__init__``."""

    thread_name = "fence-http-request"
    max_connections = 64

    def init_connections(self) -> None:
        self._serial = itertools.count(1)
        self._live: set[threading.Thread] = set()
        self._live_lock = threading.Lock()
        self._warned = -10.0  # when the last "too many connections" warning was logged (monotonic)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._live_lock:
            full = len(self._live) >= self.max_connections
            if not full:
                thread = threading.Thread(target=self._serve_one, args=(request, client_address),
                                          name=f"{self.thread_name}-{next(self._serial)}", daemon=True)
                self._live.add(thread)
        if full:
            now = time.monotonic()
            if now - self._warned >= 10.0:  # at most one warning each 10 s, whatever the flood
                self._warned = now
                log.warning("%d connections already served at once; closing new ones (first from %s)",
                            self.max_connections, client_address[0] if client_address else "?")
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        thread.start()

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)  # type: ignore[attr-defined]
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)  # type: ignore[attr-defined]
            with self._live_lock:
                self._live.discard(threading.current_thread())

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (timed out, reset) is logged at DEBUG: it is the client's, not the server's."""
        log.debug("a connection from %s ended with an error", client_address[0] if client_address else "?",
                  exc_info=True)

    def live_threads(self) -> list[threading.Thread]:
        """The connection threads still serving."""
        with self._live_lock:
            return list(self._live)

    def join_connections(self, deadline: float) -> bool:
        """Wait until ``deadline`` (``time.monotonic()``) for every connection thread; ``True`` when all ended."""
        done = True
        for thread in self.live_threads():
            thread.join(max(0.0, deadline - time.monotonic()))
            done = done and not thread.is_alive()
        return done


_metrics_log = logging.getLogger("telegram_fence.metrics_server")


class Answering(Protocol):
    """What the server serves: ``(status, content type, body)`` for a path, or ``None`` (404)."""

    def answer(self, path: str) -> tuple[int, str, bytes] | None: ...


class _MetricsHandler(WholeRequestBound, http.server.BaseHTTPRequestHandler):
    endpoints: Answering  # set on the subclass each server makes
    request_bound = 5.0  # seconds a whole request may take to arrive: a slow client holds its thread at most this
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _serve(self, *, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        answer = self.endpoints.answer(path)
        if answer is None:
            answer = (404, _TEXT, b"not found; try /metrics, /livez or /readyz\n")
        status, content_type, data = answer
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        _metrics_log.debug("metrics request: " + format, *args)


class _MetricsHTTPServer(ConnectionThreads, http.server.HTTPServer):
    thread_name = "fence-metrics-request"
    max_connections = 32
    allow_reuse_address = True
    request_queue_size = 64  # a burst of connections waits in the kernel's queue, not for SYN retransmits

    def __init__(self, address: tuple[str, int], handler: type[_MetricsHandler]) -> None:
        self.init_connections()
        super().__init__(address, handler)


class MetricsServer:
    """Serves ``endpoints``' answers to ``GET``/``HEAD`` on ``host:port`` (port 0: any free one, see :attr:`port`):
    the thread ``fence-metrics`` accepts, each connection has a thread ``fence-metrics-request-N`` (at most 32) and
    5 s to arrive whole. The socket is bound when made (:class:`ConfigurationError` naming ``metrics=`` when it
    cannot be); :meth:`stop` ends and joins every thread."""

    def __init__(self, endpoints: Answering, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("_FamilyServer", (_MetricsHTTPServer,), {"address_family": family})
        handler = type("_BoundHandler", (_MetricsHandler,), {"endpoints": endpoints})
        try:
            self._server = server_class((host, port), handler)
        except OSError as exc:
            raise ConfigurationError(
                f"metrics=({host!r}, {port}): cannot listen there ({exc.strerror or exc}); choose another address, "
                "or stop what listens on it"
            ) from exc
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._serve, name="fence-metrics", daemon=True)

    def _serve(self) -> None:
        try:
            self._server.serve_forever(poll_interval=0.5)
        except Exception:
            _metrics_log.critical("the metrics server crashed; /metrics, /livez and /readyz no longer answer",
                                  exc_info=True)

    def start(self) -> None:
        """Begin serving on the ``fence-metrics`` thread."""
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop serving, close the socket and join every thread (bounded by ``timeout`` in all); ``True`` when they
        ended. Idempotent."""
        deadline = time.monotonic() + timeout
        if self._thread.ident is not None and self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout)
        self._server.server_close()
        connections = self._server.join_connections(deadline)
        return connections and not self._thread.is_alive()

    @property
    def url(self) -> str:
        """``http://host:port`` of the listening socket (no trailing slash)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"
