"""A private certificate authority made with ``openssl`` and a TLS front for the fake Bot API, for the tests.

:func:`make_ca` writes a CA and a server certificate for ``127.0.0.1`` into a directory.
:class:`TlsFront` listens with TLS on ``127.0.0.1`` and passes every request to a plain-HTTP server (the
fake Bot API), answering with its answer; a method listed in ``break_after`` is passed on (so the server
acts on it) and then the TLS stream is broken with bytes that are not TLS, as a faulty middlebox would.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

OPENSSL = "/usr/bin/openssl"


@dataclass(frozen=True)
class Authority:
    """Files of a private CA and of the server certificate it signed (PEM)."""

    ca: Path
    cert: Path
    key: Path


def make_ca(directory: Path) -> Authority:
    """Create a CA and a certificate for 127.0.0.1/localhost signed by it, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run([OPENSSL, *args], check=True, capture_output=True, cwd=directory, timeout=60)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=telegram_fence test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return Authority(directory / "ca.pem", directory / "server.pem", directory / "server.key")


class TlsFront:
    """TLS on 127.0.0.1 in front of ``backend_port`` (plain HTTP). Use as a context manager.

    ``api_url`` is telebot's URL template through the front. ``break_after``: Bot API methods whose
    request is passed on and then answered with bytes that are not TLS (the request was carried out);
    ``times`` bounds how many calls are broken so (``None``: all of them).
    """

    def __init__(
        self, authority: Authority, backend_port: int, *, break_after: tuple[str, ...] = (), times: int | None = None
    ) -> None:
        self.break_after = set(break_after)
        self.times = times  # how many calls to break (None: every one)
        self.broken: list[str] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(authority.cert, authority.key)
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _pass(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                upstream = http.client.HTTPConnection("127.0.0.1", backend_port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                    status, kept = answer.status, answer.getheaders()
                finally:
                    upstream.close()
                method = self.path.split("?", 1)[0].rsplit("/", 1)[-1]
                if method in front.break_after and (front.times is None or len(front.broken) < front.times):
                    front.broken.append(method)
                    self.wfile.flush()
                    os.write(self.connection.fileno(), b"HTTP/1.1 200 OK\r\n\r\nnot a TLS record at all" * 4)
                    self.close_connection = True
                    return
                self.send_response(status)
                for name, value in kept:
                    if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self) -> tuple[socket.socket, Any]:
                sock, address = super().get_request()
                sock.settimeout(30)
                try:
                    return context.wrap_socket(sock, server_side=True), address
                except (ssl.SSLError, OSError):
                    sock.close()
                    raise

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client refusing our certificate is what some tests are about

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="tls-front", daemon=True)

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.port}/bot{{0}}/{{1}}"

    def __enter__(self) -> TlsFront:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
