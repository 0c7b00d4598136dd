"""Deliveries per second the webhook intake sustains (synchronous=FULL), against one commit per delivery.

Run by hand (never from the test suite)::

    python3 bench/webhook_bench.py                      # 3,000 deliveries per figure, best of 3
    python3 bench/webhook_bench.py --deliveries 5000 --repeat 5 --dir /var/tmp

Each figure runs on a fresh SQLite file (``synchronous="FULL"``: one fsync per commit) with
``--deliveries`` distinct updates sent by 1, 10 and 40 concurrent clients:

- ``single-commit writes``: each client thread calls ``store.record([update], 0)``: one commit per
  update, no HTTP. What a one-commit-per-request intake could reach at best.
- ``intake, WSGI calls``: each client thread calls the :class:`WebhookIntake` WSGI app directly (no
  HTTP): secret check, JSON parse, group commit. Run again with ``synchronous="OFF"`` (no fsync) for
  the ceiling the interpreter alone sets.
- ``one commit per request, HTTP``: a minimal WSGI app that parses and records each delivery in its
  own commit, behind the same server and client as the next line.
- ``intake, HTTP``: the :class:`WebhookIntake` behind waitress (``threads`` = clients, keep-alive),
  real HTTP from ``http.client`` clients in a child process, one kept-alive connection per client.

The best of ``--repeat`` runs is printed (noise only ever slows a run down), with the CPU time this
process spent per delivery in that run (for the HTTP lines: the server side only, setup included).
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from telegram_fence import SqliteUpdateStore, WebhookIntake

SECRET = "bench-secret-token"
CONCURRENCY = (1, 10, 40)


def payload(update_id: int) -> bytes:
    return json.dumps({
        "update_id": update_id,
        "message": {"message_id": update_id, "date": 1_700_000_000, "chat": {"id": update_id % 500, "type": "private"},
                    "from": {"id": update_id % 500, "is_bot": False, "first_name": "u"}, "text": "hello"},
    }).encode()


def run_clients(count: int, clients: int, send: Callable[[int, Any], object], setup: Callable[[], Any]) -> float:
    """``count`` deliveries split over ``clients`` threads; returns deliveries per second."""
    share = [list(range(1 + i, count + 1, clients)) for i in range(clients)]
    ready = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def worker(ids: list[int]) -> None:
        state = setup()
        ready.wait()
        try:
            for update_id in ids:
                send(update_id, state)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(ids,), name=f"bench-client-{i}") for i, ids in enumerate(share)]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return count / elapsed


def fresh_store(directory: str, name: str, synchronous: str = "FULL") -> SqliteUpdateStore:
    path = os.path.join(directory, name)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    return SqliteUpdateStore(path, synchronous=synchronous)


def bench_single(directory: str, count: int, clients: int) -> float:
    store = fresh_store(directory, "single.db")
    bodies = {i: json.loads(payload(i)) for i in range(1, count + 1)}
    try:
        return run_clients(count, clients, lambda i, _: store.record([bodies[i]], 0), lambda: None)
    finally:
        store.close()


def _environ(body: bytes) -> dict[str, Any]:
    return {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
            "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": SECRET}


def bench_wsgi(directory: str, count: int, clients: int, synchronous: str = "FULL") -> float:
    store = fresh_store(directory, "wsgi.db", synchronous)
    app = WebhookIntake(store, SECRET)
    bodies = {i: payload(i) for i in range(1, count + 1)}

    def send(update_id: int, _: Any) -> None:
        statuses: list[str] = []
        b"".join(app(_environ(bodies[update_id]), lambda status, headers: statuses.append(status)))
        if not statuses[0].startswith("200"):
            raise RuntimeError(statuses[0])

    try:
        return run_clients(count, clients, send, lambda: None)
    finally:
        store.close()


def one_commit_app(store: SqliteUpdateStore) -> Callable[..., Iterable[bytes]]:
    """The baseline: parse and record each delivery in its own commit."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        update = json.loads(environ["wsgi.input"].read(length))
        store.record([update], 0)
        start_response("200 OK", [("Content-Length", "0")])
        return [b""]

    return app


def serve(app: Any, threads: int) -> tuple[Any, int, threading.Thread]:
    from waitress.server import create_server  # type: ignore[import-untyped]

    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "Task queue depth is N" on every burst
    server = create_server(app, host="127.0.0.1", port=0, threads=max(4, threads), connection_limit=200,
                           channel_timeout=30, clear_untrusted_proxy_headers=True)
    port = int(server.effective_port)  # type: ignore[union-attr]
    thread = threading.Thread(target=server.run, name="bench-waitress", daemon=True)
    thread.start()
    return server, port, thread


def http_clients(port: int, count: int, clients: int) -> float:
    """``count`` deliveries to ``127.0.0.1:port`` from ``clients`` kept-alive connections; deliveries/s."""
    bodies = {i: payload(i) for i in range(1, count + 1)}
    headers = {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": SECRET}

    def setup() -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def send(update_id: int, conn: http.client.HTTPConnection) -> None:
        conn.request("POST", "/hook", body=bodies[update_id], headers=headers)
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"HTTP {answer.status}")

    return run_clients(count, clients, send, setup)


def bench_http(directory: str, count: int, clients: int, *, group: bool) -> float:
    """The server in this process, the clients in a child process (they do not share this interpreter lock)."""
    store = fresh_store(directory, "http.db")
    app = WebhookIntake(store, SECRET) if group else one_commit_app(store)
    server, port, thread = serve(app, clients)
    try:
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--client", str(port), str(count), str(clients)],
            capture_output=True, text=True, check=True,
        )
        return float(child.stdout.strip().splitlines()[-1])
    finally:
        server.close()
        thread.join(5)
        store.close()


SCENARIOS: dict[str, Callable[[str, int, int], float]] = {
    "single-commit writes (no HTTP)": bench_single,
    "intake, WSGI calls (no HTTP)": bench_wsgi,
    "  the same, synchronous=OFF (CPU ceiling)": lambda d, n, c: bench_wsgi(d, n, c, "OFF"),
    "one commit per request, HTTP (waitress)": lambda d, n, c: bench_http(d, n, c, group=False),
    "intake, HTTP (waitress)": lambda d, n, c: bench_http(d, n, c, group=True),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--client"]:  # the client process of bench_http
        port, count, clients = (int(value) for value in argv[1:4])
        print(http_clients(port, count, clients))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=3000, help="deliveries per run (default 3000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is printed (default 3)")
    parser.add_argument("--dir", default=None, help="directory for the database files (default: a temp dir)")
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="webhook-bench-", dir=args.dir)
    try:
        print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {args.deliveries} deliveries per run, "
              f"best of {args.repeat}, synchronous=FULL\n")
        print(f"{'scenario':<44}" + "".join(f"{f'{c} conn.':>12}" for c in CONCURRENCY))
        figures: dict[str, dict[int, float]] = {}
        cpu: dict[str, dict[int, float]] = {}
        for label, scenario in SCENARIOS.items():
            row: dict[int, float] = {}
            cpu[label] = {}
            for c in CONCURRENCY:
                runs = []
                for _ in range(args.repeat):
                    before = time.process_time()
                    rate = scenario(directory, args.deliveries, c)
                    runs.append((rate, (time.process_time() - before) / args.deliveries * 1e6))
                row[c], cpu[label][c] = max(runs)
            figures[label] = row
            print(f"{label:<44}" + "".join(f"{row[c]:>12,.0f}" for c in CONCURRENCY), flush=True)
        print(f"\n{'CPU of this process per delivery (us)':<44}" + "".join(f"{f'{c} conn.':>12}" for c in CONCURRENCY))
        for label, row in cpu.items():
            print(f"{label:<44}" + "".join(f"{row[c]:>12,.0f}" for c in CONCURRENCY))
        single = figures["single-commit writes (no HTTP)"][40]
        per_request = figures["one commit per request, HTTP (waitress)"][40]
        intake = figures["intake, HTTP (waitress)"][40]
        direct = figures["intake, WSGI calls (no HTTP)"][40]
        print(f"\nat 40 connections: intake over HTTP {intake / per_request:.1f}x one commit per request over HTTP, "
              f"{intake / single:.1f}x single-commit writes; intake WSGI calls {direct / single:.1f}x single-commit "
              "writes")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
