"""Plain telebot polling vs. the same bot under Fence, side by side, against the fake Bot API server.

    python bench/throughput.py                       # trivial + echo, 3 alternating pairs each
    python bench/throughput.py --pairs 5 --n 20000 --echo-n 2000

The fake server runs in this process; each bot runs in its own child process (so its peak RSS is
its own), polling updates that were all pushed before it started (the whole backlog waits at
"Telegram"). Two handlers:

- trivial: counts the message;
- echo: replies with one ``sendMessage``, which the fake server answers after 20 ms (the round trip
  a real bot sees); updates spread over 50 chats.

Prints each run, then per handler the median rates, the median of the per-pair ratios, and peak RSS.

``--store postgres`` runs the fenced bot on ``PostgresUpdateStore`` (a new table per run, dropped
afterwards) on the server named by ``--dsn`` (default: ``TELEGRAM_FENCE_PG_DSN``)::

    python bench/throughput.py --store postgres --dsn "host=127.0.0.1 user=postgres dbname=test"

The fenced bot journals its calls (``journal_calls=True``, the default); ``--no-journal`` turns that off.
It keeps telebot's conversations in the store (the default); ``--no-states`` runs it with ``states=False``.

The children read compiled bytecode (a temporary ``PYTHONPYCACHEPREFIX``, written by one unrecorded run of each
bot first), as an installed wheel has telegram_fence and as telebot and psycopg are read from site-packages:
with ``PYTHONDONTWRITEBYTECODE=1`` and a source checkout every fenced child would compile telegram_fence again,
and the compiler's leftovers (≈ 0.8 MB here) would count in the fence's peak RSS. ``--source`` measures that way
instead (as this script did before; ``bench/pg_memory.py`` does the same).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bytecode import cache_dir, child_env  # bench/ is the script's path


def open_store(db: str) -> object:
    """The fenced bot's store: a SQLite path as it is, or ``postgres:DSN|TABLE`` for PostgreSQL."""
    if not db.startswith("postgres:"):
        return db
    from telegram_fence.store.postgres import PostgresUpdateStore

    dsn, _, table = db[len("postgres:"):].rpartition("|")
    return PostgresUpdateStore(dsn, table=table, create_table=False)


def child(mode: str, handler: str, api_url: str, token: str, n: int, workers: int, db: str) -> None:
    import telebot

    from telegram_fence.telegram import set_api_server

    set_api_server(api_url)
    bot = telebot.TeleBot(token, threaded=False)
    done = threading.Event()
    count = [0]

    if handler == "echo":

        @bot.message_handler(func=lambda m: True)
        def echo(message: telebot.types.Message) -> None:
            bot.send_message(message.chat.id, message.text)
            count[0] += 1
            if count[0] >= n:
                done.set()
    else:

        @bot.message_handler(func=lambda m: True)
        def trivial(message: telebot.types.Message) -> None:
            count[0] += 1
            if count[0] >= n:
                done.set()

    if mode == "plain":
        # count is bumped by one thread at a time here: telebot runs handlers inline.
        # Timed to the moment the last handler finished: polling itself only returns after its last
        # long poll, which would charge plain telebot an idle second.
        finished = [0.0]

        def stopper() -> None:
            done.wait()
            finished[0] = time.perf_counter()
            bot.stop_polling()

        threading.Thread(target=stopper, daemon=True).start()
        start, cpu = time.perf_counter(), time.process_time()
        bot.polling(non_stop=True, interval=0, timeout=5, long_polling_timeout=1)
        elapsed = finished[0] - start
        used = time.process_time() - cpu
    else:
        from telegram_fence import Fence

        lock = threading.Lock()
        inner = bot.message_handlers[0]["function"]

        def counted(message: telebot.types.Message) -> None:
            with lock:
                inner(message)

        if handler == "trivial":
            bot.message_handlers[0]["function"] = counted
        else:
            # the echo reply runs unlocked (that is the point of the pool); only the count is locked
            def echo_locked(message: telebot.types.Message) -> None:
                bot.send_message(message.chat.id, message.text)
                with lock:
                    count[0] += 1
                    if count[0] >= n:
                        done.set()

            bot.message_handlers[0]["function"] = echo_locked
        journal = os.environ.get("TF_BENCH_JOURNAL", "1") != "0"
        states = os.environ.get("TF_BENCH_STATES", "1") != "0"
        options: dict[str, object] = {} if workers <= 0 else {"workers": workers}
        fence = Fence(bot, open_store(db), long_poll_timeout=1, journal_calls=journal,
                      states=None if states else False, **options)
        start, cpu = time.perf_counter(), time.process_time()
        fence.start()
        done.wait()
        elapsed = time.perf_counter() - start
        used = time.process_time() - cpu
        fence.stop()
        fence.join(10)
    # CPU of the whole process (every thread) per update while it ran: steadier than the rate on a loaded machine
    print(json.dumps({"elapsed": elapsed, "rate": n / elapsed, "rss_mb": peak_rss_mb(), "cpu_us": used * 1e6 / n}))


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM). Not ru_maxrss: on Linux that keeps the high-water mark of the
    forked parent across exec, so every child would report the size of the process that started it."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run_one(mode: str, handler: str, n: int, chats: int, workers: int, dsn: str | None = None) -> dict[str, float]:
    from telegram_fence.testing import FakeBotAPI

    latency = {"sendMessage": 0.02} if handler == "echo" else {}
    table = None
    with tempfile.TemporaryDirectory() as tmp, FakeBotAPI(max_long_poll=1.0, latency=latency) as api:
        db = os.path.join(tmp, "bench.db")
        if dsn is not None and mode == "fence":
            import uuid

            from telegram_fence.store.postgres import PostgresUpdateStore

            table = f"tf_throughput_{uuid.uuid4().hex[:10]}"
            PostgresUpdateStore(dsn, table=table).close()
            db = f"postgres:{dsn}|{table}"
        api.push_messages(n, chats=list(range(1, chats + 1)), text="m{i}")
        try:
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, handler, api.api_url, api.token, str(n), str(workers), db],
                check=True, capture_output=True, text=True, timeout=1800, env=_child_env(),
            )
        finally:
            if table is not None:
                from pg_cleanup import drop_store  # bench/ is the script's path

                drop_store(str(dsn), table)
    return json.loads(out.stdout.strip().splitlines()[-1])


#: where the children keep their bytecode (``None``: as this process has it, ``--source``); set by :func:`main`
_PYCACHE: str | None = None


def _child_env() -> dict[str, str]:
    """The children's environment: this one, with compiled bytecode kept in :data:`_PYCACHE` whatever
    ``PYTHONDONTWRITEBYTECODE`` says (unless ``--source``)."""
    return child_env(_PYCACHE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000, help="updates for the trivial handler")
    parser.add_argument("--echo-n", type=int, default=2000, help="updates for the echo handler")
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--workers", type=int, default=0, help="the fence's workers= (default: its own default)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--handlers", default="trivial,echo")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                        help="the fenced bot's store (default sqlite)")
    parser.add_argument("--dsn", default=os.environ.get("TELEGRAM_FENCE_PG_DSN"),
                        help="PostgreSQL connection string for --store postgres (default: $TELEGRAM_FENCE_PG_DSN)")
    parser.add_argument("--no-journal", action="store_true", help="run the fenced bot with journal_calls=False")
    parser.add_argument("--no-states", action="store_true",
                        help="run the fenced bot with states=False (telebot's own conversation storage)")
    parser.add_argument("--source", action="store_true",
                        help="let the children compile telegram_fence from source when PYTHONDONTWRITEBYTECODE is set "
                             "(the default reads bytecode, as an installed wheel has it)")
    parser.add_argument("--child", nargs=7, metavar="ARG")
    args = parser.parse_args()
    if args.no_journal:
        os.environ["TF_BENCH_JOURNAL"] = "0"  # read by the children
    if args.no_states:
        os.environ["TF_BENCH_STATES"] = "0"
    if args.store == "postgres" and not args.dsn:
        parser.error("--store postgres needs --dsn (or TELEGRAM_FENCE_PG_DSN)")
    dsn = args.dsn if args.store == "postgres" else None
    if args.child:
        mode, handler, api_url, token, n, workers, db = args.child
        child(mode, handler, api_url, token, int(n), int(workers), db)
        return
    global _PYCACHE
    pycache = cache_dir("tf-throughput-pyc-")
    _PYCACHE = None if args.source else pycache.name
    if _PYCACHE is not None:  # one unrecorded run of each bot: it writes the bytecode the recorded runs read
        for handler in args.handlers.split(","):
            for mode in ("plain", "fence"):
                run_one(mode, handler, 50, args.chats, args.workers, dsn if mode == "fence" else None)
    for handler in args.handlers.split(","):
        n = args.n if handler == "trivial" else args.echo_n
        ratios, plain_rates, fence_rates, plain_rss, fence_rss, cpu_ratios = [], [], [], [], [], []
        for pair in range(args.pairs):
            plain = run_one("plain", handler, n, args.chats, args.workers)
            fenced = run_one("fence", handler, n, args.chats, args.workers, dsn)
            ratios.append(fenced["rate"] / plain["rate"])
            plain_rates.append(plain["rate"])
            fence_rates.append(fenced["rate"])
            plain_rss.append(plain["rss_mb"])
            fence_rss.append(fenced["rss_mb"])
            cpu_ratios.append(fenced["cpu_us"] / plain["cpu_us"])
            print(f"{handler:8s} pair {pair + 1}: plain {plain['rate']:8.0f}/s {plain['rss_mb']:5.1f} MB "
                  f"{plain['cpu_us']:5.1f} µs CPU | fence {fenced['rate']:8.0f}/s {fenced['rss_mb']:5.1f} MB "
                  f"{fenced['cpu_us']:5.1f} µs CPU | ratio {ratios[-1]:.2f}", flush=True)
        journal = "off" if args.no_journal else "on"
        workers = args.workers or "default"
        print(f"{handler:8s} store={args.store} journal={journal} N={n} chats={args.chats} workers={workers}: "
              f"plain median {statistics.median(plain_rates):.0f}/s, "
              f"fence median {statistics.median(fence_rates):.0f}/s, "
              f"median ratio {statistics.median(ratios):.2f}x, CPU per update {statistics.median(cpu_ratios):.2f}x "
              f"plain's; peak RSS plain {max(plain_rss):.1f} MB, "
              f"fence {max(fence_rss):.1f} MB (+{max(fence_rss) - max(plain_rss):.1f} MB)", flush=True)


if __name__ == "__main__":
    main()
