"""What the library's own HTTP servers share (the ``metrics=`` port, ``run_webhook``'s listener): each connection
on a named thread of its own, at most :attr:`ConnectionThreads.max_connections` at once, and each request bounded
as a whole (request line, headers and body together), not per ``recv``.

So a client that sends a byte a second, or connects and says nothing, holds only its own thread, and only until
its bound; the next client, a liveness probe, is answered at once. Imports only the standard library.
"""

from __future__ import annotations

import io
import itertools
import logging
import socket
import threading
import time
from typing import Any

__all__ = ["ConnectionThreads", "DeadlineReader", "WholeRequestBound"]

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
