"""The library's own HTTP server (the ``metrics=`` address, ``run_webhook``'s listener): a WSGI application served
with each connection on a named thread of its own (capped) and each request bounded as a whole.

A client that sends a byte a second, or connects and says nothing, holds only its own thread, and only until its
bound; the next client, a liveness probe, is answered at once. Loaded only by a fence that serves HTTP itself.
"""

from __future__ import annotations

import io
import itertools
import logging
import socket
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from .errors import ConfigurationError

__all__ = ["DeadlineReader", "WsgiServer"]

log = logging.getLogger("telegram_fence.http")


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


class _Handler(WSGIRequestHandler):
    """Everything read from the connection (request line, headers, body) must arrive within the server's
    ``request_bound`` seconds of the connection being taken; a later read raises :class:`TimeoutError` and the
    connection is closed. Writes wait at most the bound too (a client that stops reading cannot hold the thread)."""

    server: _Server
    disable_nagle_algorithm = True  # else headers and body written apart wait ≈ 40 ms for a delayed ACK

    def setup(self) -> None:
        super().setup()
        bound = self.server.request_bound
        self.connection.settimeout(bound)
        made = self.rfile
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, time.monotonic() + bound),
                                       self.rbufsize if self.rbufsize > 0 else io.DEFAULT_BUFFER_SIZE)
        made.close()  # (the socket is really closed only once every file made from it is)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("request: " + format, *args)


class _Server(WSGIServer):
    """Each accepted connection is served on a thread of its own named ``{thread_name}-N``; past
    ``max_connections`` at once, a new connection is closed at once (the client tries again; those served go on)."""

    allow_reuse_address = True
    request_queue_size = 128  # a burst of connections waits in the kernel's queue, not for SYN retransmits

    def __init__(self, address: tuple[str, int], thread_name: str, max_connections: int, request_bound: float) -> None:
        self.thread_name, self.max_connections, self.request_bound = thread_name, max_connections, request_bound
        self._serial = itertools.count(1)
        self._live: set[threading.Thread] = set()
        self._live_lock = threading.Lock()
        self._warned = -10.0  # when the last "too many connections" warning was logged (monotonic)
        super().__init__(address, _Handler)

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
            self.shutdown_request(request)
            return
        thread.start()

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._live_lock:
                self._live.discard(threading.current_thread())

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (timed out, reset) is logged at DEBUG: it is the client's, not the server's."""
        log.debug("a connection from %s ended with an error", client_address[0] if client_address else "?",
                  exc_info=True)

    def join_connections(self, deadline: float) -> bool:
        """Wait until ``deadline`` (``time.monotonic()``) for every connection thread; ``True`` when all ended."""
        with self._live_lock:
            live = list(self._live)
        for thread in live:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in live)


class WsgiServer:
    """Serve the WSGI ``app`` on ``host:port`` (port 0: any free port, read :attr:`port`) from the thread ``name``;
    each connection on a thread ``{name of requests}-N`` (at most ``max_connections`` at once) with
    ``request_timeout`` seconds to arrive whole. The socket is bound when the object is made
    (:class:`ConfigurationError` naming ``option=`` when it cannot be). :meth:`stop` is safe from any thread and from
    a signal handler."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 8080, *, request_timeout: float = 30.0,
                 names: tuple[str, str] = ("fence-webhook-server", "fence-webhook-request"),
                 max_connections: int = 256, option: str = "listen") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            server_class = type("_FamilyServer", (_Server,), {"address_family": family})
            self._server = server_class((host, port), names[1], max_connections, float(request_timeout))
        except OSError as exc:
            raise ConfigurationError(
                f"{option}=({host!r}, {port}): cannot listen there ({exc.strerror or exc}); choose another address, "
                "or stop what listens on it"
            ) from exc
        self._server.set_app(app)
        self.host = host
        self.port = int(self._server.server_address[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=names[0], daemon=True)

    def _serve(self) -> None:
        server = self._server
        server.timeout = 0.2  # how often the loop looks at the stop event
        try:
            while not self._stop.is_set():
                server.handle_request()
        except Exception:
            log.critical("the HTTP server on %s crashed", self.url, exc_info=True)
        finally:
            server.server_close()  # no new connections; those accepted go on

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting (within 0.2 s); requests in progress go on (see :meth:`join`). Returns at once."""
        self._stop.set()

    def join(self, timeout: float = 10.0) -> bool:
        """After :meth:`stop`: wait up to ``timeout`` for the serving thread and every request thread; whether all
        ended."""
        deadline = time.monotonic() + timeout
        if self._thread.ident is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        else:
            self._server.server_close()
        return self._server.join_connections(deadline) and not self._thread.is_alive()

    @property
    def url(self) -> str:
        """``http://host:port`` of the listening socket (no trailing slash)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"
