"""Serving the fence's metrics and health over HTTP: ``GET /metrics``, ``/livez``, ``/readyz`` (``HealthService``: one
fence's answers and its server).

``runtime.health`` and the server (``http_serving``) load only when first used.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..http_serving import WsgiServer

__all__ = ["PATHS", "Answer", "HealthService"]

log = logging.getLogger("telegram_fence.metrics")

#: The paths :class:`HealthService` answers.
PATHS = ("/metrics", "/livez", "/readyz")

#: ``(HTTP status, Content-Type, body)``
Answer = tuple[int, str, bytes]

_TEXT = "text/plain; charset=utf-8"


class HealthService:
    """The answers of ``/metrics``, ``/livez`` and ``/readyz`` for one fence (also mounted by ``webhook_app`` and
    ``health_app``), built from ``snapshot()`` (its ``stats()``); ``vitals()`` is the part liveness reads, without
    the store (so ``/livez`` answers while the store is locked). ``/livez`` and ``/readyz`` answer 200 ``ok`` or 503
    with the reasons, one per line. No answer writes to the store, and each comes within about ``answer_timeout``
    seconds whatever holds the store's locks: the reads get half of it (one still waiting fails: not ready), the
    write check the rest (at least a tenth). Safe from any thread, but :meth:`bind`, :meth:`start` and :meth:`stop`:
    the server of ``address`` (``metrics=``), the owner's.
    """

    def __init__(self, snapshot: Callable[[], Mapping[str, Any]], store: object, *, workers: int,
                 polling: Callable[[], bool], max_progress_age: float, version: str,
                 vitals: Callable[[], Mapping[str, Any]], address: tuple[str, int] | None = None,
                 answer_timeout: float = 1.0) -> None:
        self._snapshot, self._vitals, self._store = snapshot, vitals, store
        self._workers, self._polling, self._version = workers, polling, version
        self._max_progress_age, self._answer_timeout = max_progress_age, answer_timeout
        self._address = address
        self._server: WsgiServer | None = None

    def bind(self) -> None:
        """Bind ``address`` when one was given; raises :class:`ConfigurationError` when it cannot be bound."""
        if self._address is not None and self._server is None:
            from ..http_serving import WsgiServer  # (only a fence given metrics= loads it)

            host, port = self._address
            self._server = WsgiServer(self.wsgi, host, port, request_timeout=5.0, max_connections=32,
                                      names=("fence-metrics", "fence-metrics-request"), option="metrics")

    def start(self, announce: logging.Logger) -> None:
        """Serve on the bound address (nothing without one), saying where on ``announce``."""
        if self._server is not None:
            self._server.start()
            announce.info("serving /metrics, /livez and /readyz", extra={"url": self._server.url})

    def stop(self, timeout: float) -> bool:
        """Stop serving and join (bounded by ``timeout``); ``True`` when nothing is left running."""
        if self._server is None:
            return True
        self._server.stop()
        return self._server.join(timeout)

    @property
    def url(self) -> str | None:
        """``http://host:port`` where the address serves, once bound (the port chosen when 0 was given)."""
        return None if self._server is None else self._server.url

    def answer(self, path: str) -> Answer | None:
        """The answer to ``GET path``, or ``None`` when the path is not one of :data:`PATHS`. Never raises: a
        failure while answering is a 503 naming it."""
        if path not in PATHS:
            return None
        try:
            from .health import CONTENT_TYPE, bounded_reads, check_write, exposition, liveness, readiness

            if path == "/livez":
                return _health(liveness(self._vitals(), polling=self._polling()))
            started = time.monotonic()
            with bounded_reads(self._store, self._answer_timeout / 2):
                stats = self._snapshot()
            live = liveness(stats, polling=self._polling())
            left = max(self._answer_timeout / 10, started + self._answer_timeout - time.monotonic())
            with bounded_reads(self._store, left):
                write_error = check_write(self._store, left)
            ready = readiness(stats, live, write_error=write_error, max_progress_age=self._max_progress_age)
            if path == "/readyz":
                return _health(ready)
            text = exposition(stats, live=not live, ready=not ready, workers=self._workers, version=self._version)
            return 200, CONTENT_TYPE, text.encode("utf-8")
        except Exception as exc:  # an answer, never a dropped connection: the scraper sees why
            log.error("answering %s failed", path, exc_info=True)
            return 503, _TEXT, f"answering {path} failed: {type(exc).__name__}: {exc}\n".encode()

    def wsgi(self, environ: Mapping[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """A WSGI application (PEP 3333) answering :data:`PATHS` (404 elsewhere, 405 for a method but GET/HEAD)."""
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        answer = self.answer(str(environ.get("PATH_INFO", "")))
        if answer is None:
            answer = (404, _TEXT, b"not found; try /metrics, /livez or /readyz\n")
        elif method not in ("GET", "HEAD"):
            answer = (405, _TEXT, b"only GET and HEAD\n")
        status, content_type, body = answer
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if status == 405:
            headers.append(("Allow", "GET, HEAD"))
        start_response(f"{status} {HTTPStatus(status).phrase}", headers)
        return [b""] if method == "HEAD" else [body]


def _health(reasons: list[str]) -> Answer:
    """200 ``ok``, or 503 with the reasons, one per line."""
    if not reasons:
        return 200, _TEXT, b"ok\n"
    return 503, _TEXT, "".join(f"{reason}\n" for reason in reasons).encode("utf-8")
