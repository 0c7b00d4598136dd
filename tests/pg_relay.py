"""A TCP relay to the PostgreSQL server that a test controls: it can stop taking new connections, or freeze (a
server that accepted the session and stopped answering, while its host's kernel still acknowledges)."""

from __future__ import annotations

import socket
import threading
from contextlib import suppress


class Relay:
    """Relays 127.0.0.1:``port`` to ``(host, target_port)``, one pair of threads per connection.

    ``refuse_new()`` closes the listening socket (new connections are refused; open ones go on). ``freeze()``
    stops forwarding on every connection, open or new (a new one is accepted and never answered), and keeps every
    socket open; ``thaw()`` forwards again. ``close()`` closes everything and joins every thread.
    """

    def __init__(self, host: str, target_port: int) -> None:
        self._target = (host, target_port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._start(self._accept, "test-relay")

    def _start(self, target: object, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _addr = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._socks.append(client)
            if not self._flowing.is_set():
                continue  # frozen: accepted, never answered
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks.append(upstream)
            self._start(self._pipe, "test-relay-pipe", client, upstream)
            self._start(self._pipe, "test-relay-pipe", upstream, client)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()  # frozen: what arrives is held, nothing is answered
                if self._closed:
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def refuse_new(self) -> None:
        with suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept() in progress (close alone does not)
        self._server.close()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self.refuse_new()
        self._flowing.set()
        with self._lock:
            socks, threads = list(self._socks), list(self._threads)
        for sock in socks:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in threads:
            thread.join(5)
