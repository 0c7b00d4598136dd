"""Deliveries per second the webhook intake sustains: each delivery committed on its request's thread, then 200.

Run by hand (never from the test suite), on a machine that is otherwise quiet::

    python3 bench/webhook_bench.py                        # 3,000 deliveries per run, 5 rounds
    python3 bench/webhook_bench.py --rounds 7 --http --off --dir /var/tmp
    python3 bench/webhook_bench.py --bare --rounds 3            # vs a bare WSGI app, 40 connections

Client threads (1, 10 and 40 of them) call the :class:`WebhookIntake` directly (secret check, body read, JSON
parse, record and commit), on a fresh SQLite file at ``synchronous="FULL"``. Printed: the median and the best of
the rounds and the CPU time this process spent per delivery. ``commit cost`` is one single-update commit on one
thread, measured alone: what one fsync costs here. ``--off`` adds ``synchronous="OFF"`` (no fsync: the ceiling the
interpreter alone sets), alternating with FULL, and the ratio of the medians; ``--http`` adds the intake behind
waitress (``threads`` = clients), real HTTP from clients in a child process, one kept-alive connection each.
``--bare`` runs only the comparison with a bare WSGI app behind the same waitress (``--conns`` connections, 40 by
default): the bare app, the intake alone and a running fence's ``webhook_app`` (it runs a trivial handler),
alternating.
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
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from telegram_fence import SqliteUpdateStore
from telegram_fence.ingress.webhook import WebhookIntake

SECRET = "bench-secret-token"
CONCURRENCY = (1, 10, 40)


def payload(update_id: int) -> bytes:
    return json.dumps({
        "update_id": update_id,
        "message": {"message_id": update_id, "date": 1_700_000_000, "chat": {"id": update_id % 500, "type": "private"},
                    "from": {"id": update_id % 500, "is_bot": False, "first_name": "u"}, "text": "hello"},
    }).encode()


def run_clients(count: int, clients: int, send: Callable[[int, Any], object], setup: Callable[[], Any],
                took: list[float] | None = None) -> float:
    """``count`` deliveries split over ``clients`` threads; returns deliveries per second (``took``: each
    delivery's seconds, from its send to its answer, appended)."""
    share = [list(range(1 + i, count + 1, clients)) for i in range(clients)]
    ready = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def worker(ids: list[int]) -> None:
        state = setup()
        ready.wait()
        try:
            for update_id in ids:
                began = time.perf_counter()
                send(update_id, state)
                if took is not None:
                    took.append(time.perf_counter() - began)
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


def _environ(body: bytes) -> dict[str, Any]:
    return {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
            "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": SECRET}


def bench_wsgi(directory: str, count: int, clients: int, synchronous: str = "FULL") -> float:
    """Client threads calling the application directly (no HTTP); deliveries per second."""
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
        app.close()
        store.close()


def serve(app: Any, threads: int) -> tuple[Any, int, threading.Thread]:
    from waitress.server import create_server  # type: ignore[import-untyped]

    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "Task queue depth is N" on every burst
    server = create_server(app, host="127.0.0.1", port=0, threads=max(4, threads), connection_limit=200,
                           channel_timeout=30, clear_untrusted_proxy_headers=True)
    port = int(server.effective_port)  # type: ignore[union-attr]
    thread = threading.Thread(target=server.run, name="bench-waitress", daemon=True)
    thread.start()
    return server, port, thread


def http_clients(port: int, count: int, clients: int, took: list[float] | None = None) -> float:
    """``count`` deliveries to ``127.0.0.1:port`` from ``clients`` kept-alive connections; deliveries/s (``took``:
    each one's seconds to its answer)."""
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

    return run_clients(count, clients, send, setup, took)


def bench_http(directory: str, count: int, clients: int) -> float:
    """The server in this process, the clients in a child process (they do not share this interpreter lock)."""
    return bench_http_app(make_intake, directory, count, clients)


def bare_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """The yardstick: a WSGI app that reads the body and answers 200, storing nothing."""
    stream = environ["wsgi.input"]
    stream.read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", "5")])
    return [b"hello"]


def bench_http_app(make: Callable[[str], tuple[Any, Callable[[], None]]], directory: str, count: int,
                   clients: int) -> float:
    """``make(directory) -> (app, close)`` served by waitress; the clients in a child process; deliveries/s."""
    app, close = make(directory)
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
        close()


def make_bare(directory: str) -> tuple[Any, Callable[[], None]]:
    return bare_app, lambda: None


def make_intake(directory: str) -> tuple[Any, Callable[[], None]]:
    store = fresh_store(directory, "bare-intake.db")
    app = WebhookIntake(store, SECRET)

    def close() -> None:
        app.close()
        store.close()

    return app, close


def make_fenced(directory: str) -> tuple[Any, Callable[[], None]]:
    """A running fence's ``webhook_app``, its handler doing nothing."""
    import telebot

    from telegram_fence import Fence
    from telegram_fence.testing import FakeBotAPI

    # The fence's webhook watch asks getWebhookInfo: a fake Bot API on this machine answers it (webhook set), so
    # the figure measures only this machine.
    api = FakeBotAPI(token="123:bench").start()
    api.install()
    bot = telebot.TeleBot("123:bench", threaded=False)
    bot.set_webhook(url="https://bench.example.org/hook", secret_token=SECRET)
    store = fresh_store(directory, "bare-fence.db")
    fence = Fence(bot, store)
    fence.handler(lambda update: None)
    app = fence.webhook_app(SECRET)
    fence.start()

    def close() -> None:
        fence.stop()
        fence.join(10)
        store.close()
        api.uninstall()
        api.stop()

    return app, close


def compare_bare(directory: str, count: int, rounds: int, clients: int) -> None:
    """Behind waitress at ``clients`` connections: a bare app, the intake alone and a fence's intake, alternating."""
    variants = {"bare WSGI app": make_bare, "WebhookIntake": make_intake, "Fence.webhook_app": make_fenced}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_no in range(rounds):
        for name in names if round_no % 2 == 0 else names[::-1]:
            rates[name].append(bench_http_app(variants[name], directory, count, clients))
    base = statistics.median(rates["bare WSGI app"])
    print(f"\nHTTP behind waitress, {clients} connections, each run against a bare app")
    for name in names:
        median = statistics.median(rates[name])
        runs = ", ".join(f"{r:,.0f}" for r in rates[name])
        print(f"{name:<22} {median:>8,.0f}/s median  ({runs})  {median / base:.2f}x the bare app")


def commit_cost(directory: str, count: int = 300) -> float:
    """Microseconds of one single-update commit at FULL on one thread, nothing else running (median)."""
    store = fresh_store(directory, "cost.db")
    samples = []
    try:
        for update_id in range(1, count + 1):
            started = time.perf_counter()
            store.record([json.loads(payload(update_id))], 0)
            samples.append(time.perf_counter() - started)
    finally:
        store.close()
    return statistics.median(samples) * 1e6


Scenario = Callable[[str, int, int], float]


def measure(scenario: Scenario, directory: str, count: int, clients: int) -> tuple[float, float]:
    """(deliveries per second, CPU microseconds of this process per delivery) of one run."""
    before = time.process_time()
    rate = scenario(directory, count, clients)
    return rate, (time.process_time() - before) / count * 1e6


def compare(label: str, variants: dict[str, Scenario], directory: str, count: int, rounds: int) -> None:
    """Run the variants alternately (the order flips each round) and print their figures and ratios."""
    names = list(variants)
    results: dict[str, dict[int, list[tuple[float, float]]]] = {n: {c: [] for c in CONCURRENCY} for n in names}
    for clients in CONCURRENCY:
        for round_no in range(rounds):
            order = names if round_no % 2 == 0 else names[::-1]
            for name in order:
                results[name][clients].append(measure(variants[name], directory, count, clients))
    print(f"\n{label}")
    print(f"{'':<40}" + "".join(f"{f'{c} conn.':>22}" for c in CONCURRENCY))
    for name in names:
        cells = []
        for clients in CONCURRENCY:
            rates = [rate for rate, _ in results[name][clients]]
            cpu = statistics.median(cpu for _, cpu in results[name][clients])
            cells.append(f"{statistics.median(rates):>8,.0f} ({max(rates):>6,.0f}) {cpu:>4.0f}us")
        print(f"{name + ' /s median (best) cpu':<40}" + "".join(f"{cell:>22}" for cell in cells))
    if len(names) == 2:
        base, other = names
        ratios = []
        for clients in CONCURRENCY:
            medians = [statistics.median(r for r, _ in results[n][clients]) for n in (other, base)]
            ratios.append(f"{medians[0] / medians[1]:.1f}x")
        print(f"{'ratio of the medians':<40}" + "".join(f"{r:>22}" for r in ratios))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--client"]:  # the client process of bench_http
        port, count, clients = (int(value) for value in argv[1:4])
        took: list[float] = []
        cpu = time.process_time()
        rate = http_clients(port, count, clients, took)
        cpu = time.process_time() - cpu
        took.sort()
        print(f"reply latency p50 {took[len(took) // 2] * 1e3:.2f} ms, p99 {took[len(took) * 99 // 100] * 1e3:.2f} ms; "
              f"client CPU {cpu / count * 1e6:.0f} us per delivery")
        print(rate)
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=3000, help="deliveries per run (default 3000)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per figure (default 5)")
    parser.add_argument("--http", action="store_true", help="also the intake over HTTP behind waitress")
    parser.add_argument("--off", action="store_true", help="also synchronous=OFF, alternating with FULL")
    parser.add_argument("--bare", action="store_true",
                        help="only: a bare WSGI app, the intake and a fence's intake behind waitress (--conns)")
    parser.add_argument("--conns", type=int, default=40, help="connections for --bare (default 40)")
    parser.add_argument("--dir", default=None, help="directory for the database files (default: a temp dir)")
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="webhook-bench-", dir=args.dir)
    try:
        print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
              f"{args.deliveries} deliveries per run, {args.rounds} alternating rounds, synchronous=FULL")
        print(f"commit cost: {commit_cost(directory):.0f} us per single-update commit (one thread, alone)")
        if args.bare:
            compare_bare(directory, args.deliveries, args.rounds, args.conns)
            print(f"\nload after: {os.getloadavg()[0]:.1f}")
            return 0
        variants: dict[str, Scenario] = {"synchronous=FULL": bench_wsgi}
        if args.off:
            variants["synchronous=OFF"] = lambda d, n, c: bench_wsgi(d, n, c, synchronous="OFF")
        compare("WSGI calls from client threads (no HTTP)", variants, directory, args.deliveries, args.rounds)
        if args.http:
            compare("HTTP behind waitress (clients in a child process)", {"synchronous=FULL": bench_http},
                    directory, args.deliveries, args.rounds)
        print(f"\nload after: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
