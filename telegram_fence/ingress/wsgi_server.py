"""``WsgiServer``: a small threaded WSGI server from the standard library, for ``Fence.run_webhook``.

``wsgiref`` with one thread per connection (``fence-webhook-request-N``, at most 256 at once), Nagle's algorithm off,
and a bound on each whole request (``request_timeout``), so a slow or silent client holds only its own thread and
only that long. One request per connection: behind a busy bot put waitress or gunicorn (``docs/webhook.md``).

Imports: the standard library, ``errors`` and ``http_serving``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from ..errors import ConfigurationError
from ..http_serving import ConnectionThreads, WholeRequestBound

__all__ = ["WsgiServer"]

log = logging.getLogger("telegram_fence.webhook.server")


class _Handler(WholeRequestBound, WSGIRequestHandler):
    disable_nagle_algorithm = True  # else headers and body written apart wait ≈ 40 ms for a delayed ACK

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook request: " + format, *args)


class _Server(ConnectionThreads, WSGIServer):
    thread_name = "fence-webhook-request"
    max_connections = 256
    allow_reuse_address = True
    request_queue_size = 128


class WsgiServer:
    """Serve ``app`` on ``host:port`` (port 0: any free port, read :attr:`port`) from the ``fence-webhook-server``
    thread. The socket is bound when the object is made (:class:`ConfigurationError` naming ``listen=`` when it
    cannot be). :meth:`stop` is safe from any thread and from a signal handler."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 8080, *, request_timeout: float = 30.0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        handler = type("_TimedHandler", (_Handler,), {"request_bound": float(request_timeout)})
        try:
            self._server: _Server = type("_FamilyServer", (_Server,), {"address_family": family})((host, port), handler)
        except OSError as exc:
            raise ConfigurationError(
                f"listen=({host!r}, {port}): cannot listen there ({exc.strerror or exc}); choose another address, "
                "or stop what listens on it"
            ) from exc
        self._server.init_connections()
        self._server.set_app(app)
        self.host = host
        self.port = int(self._server.server_address[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fence-webhook-server", daemon=True)

    def _serve(self) -> None:
        server = self._server
        server.timeout = 0.2  # how often the loop looks at the stop event
        try:
            while not self._stop.is_set():
                server.handle_request()
        except Exception:
            log.critical("the webhook server crashed", exc_info=True)
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
        """``http://host:port/`` of the listening socket."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"
