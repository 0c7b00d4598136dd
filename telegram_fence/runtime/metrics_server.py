"""The HTTP server of a fence's ``metrics=`` address: :class:`MetricsServer` serves an object's answers to
``GET``/``HEAD`` (the standard library's ``http.server``): the thread ``fence-metrics`` accepts, each connection is
served on a thread of its own (``fence-metrics-request-N``, at most 32 at once) and each request must arrive whole
within 5 s, so slow or silent clients never keep ``/livez`` from answering. :meth:`MetricsServer.stop` ends and
joins them all.

Imported only by a fence given ``metrics=`` (see :class:`~.metrics_http.HealthService`). May import ``errors``,
``http_serving`` and the standard library.
"""

from __future__ import annotations

import http.server
import logging
import socket
import threading
import time
from typing import Any, Protocol

from ..errors import ConfigurationError
from ..http_serving import ConnectionThreads, WholeRequestBound

__all__ = ["MetricsServer"]

log = logging.getLogger("telegram_fence.metrics_server")

_TEXT = "text/plain; charset=utf-8"


class Answering(Protocol):
    """What the server serves: ``(status, content type, body)`` for a path, or ``None`` (404)."""

    def answer(self, path: str) -> tuple[int, str, bytes] | None: ...


class _Handler(WholeRequestBound, http.server.BaseHTTPRequestHandler):
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
        log.debug("metrics request: " + format, *args)


class _Server(ConnectionThreads, http.server.HTTPServer):
    thread_name = "fence-metrics-request"
    max_connections = 32
    allow_reuse_address = True
    request_queue_size = 64  # a burst of connections waits in the kernel's queue, not for SYN retransmits

    def __init__(self, address: tuple[str, int], handler: type[_Handler]) -> None:
        self.init_connections()
        super().__init__(address, handler)


class MetricsServer:
    """Serves ``endpoints`` (an :class:`~.metrics_http.Endpoints`) on ``host:port`` (port 0: any free port, see
    :attr:`port`).

    The socket is bound when the object is made (:class:`ConfigurationError` naming ``metrics=`` there when the
    address is taken or cannot be bound, chained from the ``OSError``); :meth:`start`
    begins serving on the thread ``fence-metrics``; :meth:`stop` ends it and joins it and the connection threads
    (within about half a second, plus the requests in progress, each bounded). Not shared: the fence owns one.
    """

    def __init__(self, endpoints: Answering, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("_FamilyServer", (_Server,), {"address_family": family})
        handler = type("_BoundHandler", (_Handler,), {"endpoints": endpoints})
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
            log.critical("the metrics server crashed; /metrics, /livez and /readyz no longer answer", exc_info=True)

    def start(self) -> None:
        """Begin serving on the ``fence-metrics`` thread."""
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop serving, close the socket and join the thread and the connection threads (bounded by
        ``timeout`` in all); ``True`` when they ended. Idempotent. Not for a signal handler (it waits for the
        serving loop)."""
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
