"""``WsgiServer``: a small threaded WSGI server from the standard library, for ``Fence.run_webhook``.

``wsgiref`` with one named thread per connection (``fence-webhook-request-N``, at most 256 at once), Nagle's
algorithm off (with it, headers and body written separately wait ≈ 40 ms for a delayed ACK), a bound on each
whole request (request line, headers and body: ``request_timeout``) so a slow or silent client holds only its own
thread and only that long, and a serving thread (``fence-webhook-server``) that :meth:`WsgiServer.stop` ends and
:meth:`WsgiServer.join` waits for. One request per connection (HTTP/1.0 style): enough for a small bot; behind a
busy bot put waitress or gunicorn (see ``docs/webhook.md``).

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
    disable_nagle_algorithm = True
    request_bound = 30.0  # seconds a whole request may take to arrive (set per server from request_timeout)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook request: " + format, *args)


class _ThreadingWSGIServer(ConnectionThreads, WSGIServer):
    thread_name = "fence-webhook-request"
    max_connections = 256
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int]) -> None:
        self.init_connections()
        super().__init__(address, _Handler)


class WsgiServer:
    """Serve ``app`` on ``host:port`` (port 0: any free port, read :attr:`port`).

    The socket is bound when the object is made (an address in use, or one that cannot be bound, raises
    :class:`~telegram_fence.errors.ConfigurationError` naming ``listen=`` there, chained from the ``OSError``);
    :meth:`start` begins accepting. :meth:`stop` is safe from any thread and from a signal handler.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 8080, *, request_timeout: float = 30.0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("_Server", (_ThreadingWSGIServer,), {"address_family": family})
        handler_timeout = float(request_timeout)
        try:
            self._server: _ThreadingWSGIServer = server_class((host, port))
        except OSError as exc:
            raise ConfigurationError(
                f"listen=({host!r}, {port}): cannot listen there ({exc.strerror or exc}); choose another address, "
                "or stop what listens on it"
            ) from exc
        self._server.RequestHandlerClass = type("_TimedHandler", (_Handler,), {"request_bound": handler_timeout})
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
            self._stop.set()
        finally:
            server.server_close()  # no new connections; those accepted go on

    def start(self) -> None:
        """Begin accepting connections on the ``fence-webhook-server`` thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting (within 0.2 s); requests in progress go on (see :meth:`join`). Idempotent,
        returns at once."""
        self._stop.set()

    def join(self, timeout: float = 10.0) -> bool:
        """Wait (bounded by ``timeout``) for the serving thread, then for every request thread.

        Returns ``True`` when all ended. Call :meth:`stop` first.
        """
        deadline = time.monotonic() + timeout
        if self._thread.ident is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        else:
            self._server.server_close()
        done = not self._thread.is_alive()
        return self._server.join_connections(deadline) and done

    @property
    def url(self) -> str:
        """``http://host:port/`` of the listening socket (for tests and logs)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"
