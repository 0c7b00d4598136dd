"""The HTTP front of the fake Bot API: a threaded server on ``127.0.0.1`` with named, joined threads, and the parsing
of request bodies."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import HTTP
from email.utils import collapse_rfc2231_value
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

from .answers import ApiError, Response, UploadedFile, error_response, reason

__all__ = ["Drop", "HttpServer", "parse_body"]


class Drop(Exception):
    """Close the connection without an answer."""


class HttpServer(ThreadingHTTPServer):
    """One run of the fake's HTTP server: serving from the constructor on, ended by :meth:`stop`.

    ``dispatch`` answers each request; ``on_error`` receives exceptions ``dispatch`` raised (the request is
    answered 500); ``stopping`` is set by the owner before :meth:`stop` so that answers close their connections.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, dispatch: Callable[[str, Any, bytes, Any], Response],
                 on_error: Callable[[BaseException], None],
                 stopping: threading.Event) -> None:
        self.dispatch = dispatch
        self.on_error = on_error
        self.stopping = stopping
        self._conns: dict[Any, threading.Thread] = {}
        self._conn_lock = threading.Lock()
        self._conn_seq = itertools.count(1)
        super().__init__(("127.0.0.1", port), _Handler)
        self.port: int = self.server_address[1]
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fake-bot-api:{self.port}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop accepting; requests in progress get ``timeout`` seconds to answer (idle connections end at once),
        then every connection is cut and every thread joined."""
        self.shutdown()
        self._thread.join()
        self.server_close()
        for how, seconds in ((socket.SHUT_RD, timeout), (socket.SHUT_RDWR, 1.0)):
            with self._conn_lock:
                conns = dict(self._conns)
            for sock in conns:
                with contextlib.suppress(OSError):
                    sock.shutdown(how)
            deadline = time.monotonic() + seconds
            for thread in conns.values():
                thread.join(max(0.0, deadline - time.monotonic()))

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                                  name=f"fake-bot-api:{self.port}-conn-{next(self._conn_seq)}", daemon=True)
        with self._conn_lock:
            self._conns[request] = thread
        thread.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._conn_lock:
                self._conns.pop(request, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients vanish mid-request in fault tests (timeouts, drops): not worth a traceback


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: HttpServer
    server_version = "FakeBotAPI"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        owner = self.server
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length > 0 else b""
            status, payload, ctype, headers = owner.dispatch(self.path, self.headers, body, self.connection)
        except (Drop, OSError):
            # A scripted drop, or the client went away while we read or waited.
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        except Exception as exc:
            # A bug in the fake (or a request it cannot parse): answer 500 and keep it for the test to see.
            owner.on_error(exc)
            self.close_connection = True
            status, payload, ctype, headers = error_response(ApiError(500, f"Internal Server Error: {exc!r}"))
        if owner.stopping.is_set():
            self.close_connection = True
        head = [f"HTTP/1.1 {status} {reason(status)}", f"Content-Type: {ctype}", f"Content-Length: {len(payload)}"]
        head.extend(f"{k}: {v}" for k, v in headers)
        if self.close_connection:
            head.append("Connection: close")
        try:
            self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
        except OSError:
            self.close_connection = True

    do_GET = do_POST

def parse_body(content_type: str, body: bytes) -> dict[str, Any]:
    """The parameters of a request body (JSON object, form or multipart; other types give none).

    File parts of a multipart body become :class:`UploadedFile`; raises the 400 for JSON that is not an object.
    """
    if not body:
        return {}
    ctype = content_type.split(";", 1)[0].strip().lower()
    if ctype == "application/json":
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise ApiError(400, "Bad Request: can't parse JSON body") from exc
        if not isinstance(data, dict):
            raise ApiError(400, "Bad Request: JSON body must be an object")
        return data
    if ctype == "application/x-www-form-urlencoded":
        return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    if ctype == "multipart/form-data":
        return _parse_multipart(content_type, body)
    return {}


def _parse_multipart(content_type: str, body: bytes) -> dict[str, Any]:
    parser = BytesParser(EmailMessage, policy=HTTP)
    message = parser.parsebytes(b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    params: dict[str, Any] = {}
    for part in message.iter_parts():
        raw_name = part.get_param("name", header="content-disposition")
        name = collapse_rfc2231_value(raw_name) if isinstance(raw_name, tuple) else raw_name
        if not name:
            continue
        payload = part.get_payload(decode=True)
        raw = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        text = raw.decode("utf-8", "replace") if filename is None else None
        params[name] = UploadedFile(name, filename, raw, part.get_content_type()) if text is None else text
    return params

