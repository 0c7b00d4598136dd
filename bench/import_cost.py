"""What ``import telegram_fence`` costs against ``import telebot``, in fresh interpreters, alternating.

    python bench/import_cost.py              # 15 rounds
    python bench/import_cost.py --rounds 31
    python bench/import_cost.py --rounds 9 --only 'Fence'    # the statements whose name matches, and telebot
    python bench/import_cost.py --instructions               # instructions counted under valgrind, once each

Each round starts one fresh ``python`` per statement (in turn, so the machine's drift spreads over all of them) and
times the statement inside it with ``time.perf_counter`` (interpreter start-up excluded). Prints the median of each
and its ratio to ``import telebot``, wall-clock first, then the child's CPU time (``time.process_time``, all its
threads), which a loaded machine's waits for a core do not inflate (the disk's flush, a wait, is in the wall-clock
figure only). ``--instructions`` counts instead what each statement executes (valgrind's callgrind, start-up
subtracted): slow (≈ 50x), but the same figure at any load; its ratios matched the quiet machine's wall-clock ones
(1.34x for ``from telegram_fence import Fence`` at the session's start). The children read compiled bytecode, as an
installed wheel has it (``bench/bytecode.py``; one unrecorded run of each statement writes it first); ``--source``
lets them compile ``telegram_fence`` when ``PYTHONDONTWRITEBYTECODE`` is set, as before.
``from telegram_fence import Fence`` includes telebot itself (the fence parses updates with telebot's types);
``import telegram_fence`` loads the public names on first use only. ``import + Fence(bot, db)`` is what a default
polling bot pays before its first poll: telebot, the fence, and ``Fence(TeleBot(token, threaded=False), path)``
on a new SQLite file (its schema written at ``synchronous=FULL``, so the disk's flush counts); ``+ start/stop``
adds ``start(paused=True)`` (every thread started, nothing fetched), ``stop()`` and ``join()``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys

from bytecode import cache_dir, child_env  # bench/ is the script's path

#: A default fence on a new SQLite file in a temporary folder (removed when the child exits, after the timing).
_BUILD = ("import os, tempfile, telebot\nfrom telegram_fence import Fence\nfolder_ = tempfile.TemporaryDirectory()\n"
          "fence = Fence(telebot.TeleBot('123:abc', threaded=False), os.path.join(folder_.name, 'bot.db'))")

STATEMENTS = {
    "import telebot": "import telebot",
    "import telegram_fence": "import telegram_fence",
    "from telegram_fence import Fence": "from telegram_fence import Fence",
    "Fence + SqliteUpdateStore": "from telegram_fence import Fence, SqliteUpdateStore",
    "everything in __all__": "import telegram_fence as tf\nfor name in tf.__all__: getattr(tf, name)",
    # what a default polling bot pays up to its first poll: telebot, the fence, the fence built on a fresh database
    "import + Fence(bot, db)": _BUILD,
    "import + Fence(bot, db) + start/stop": _BUILD + "\nfence.start(paused=True)\nfence.stop()\nassert fence.join()",
}

_CHILD = ("import time\nstart_, cpu_ = time.perf_counter(), time.process_time()\n{stmt}\n"
          "print((time.perf_counter() - start_) * 1000, (time.process_time() - cpu_) * 1000)\n")


def once(stmt: str, env: dict[str, str]) -> tuple[float, float]:
    """Milliseconds the statement took in a fresh interpreter with ``env``: wall-clock, and the process's CPU."""
    out = subprocess.run([sys.executable, "-c", _CHILD.format(stmt=stmt)], capture_output=True, text=True,
                         check=True, env=env)
    wall, cpu = out.stdout.split()
    return float(wall), float(cpu)


_COLLECTED = re.compile(r"Collected : (\d+)")


def instructions(stmt: str, env: dict[str, str]) -> int:
    """The instructions (valgrind's callgrind ``Ir``) a fresh interpreter executes for ``stmt``, start-up and exit
    included (:func:`main` subtracts those of ``pass``). Deterministic for a fixed ``PYTHONHASHSEED``: a loaded
    machine does not move it."""
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                          stmt], capture_output=True, text=True, check=True, env={**env, "PYTHONHASHSEED": "0"})
    found = _COLLECTED.search(out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def count(chosen: dict[str, str], env: dict[str, str]) -> None:
    """Print each statement's instructions beyond an interpreter's start-up, and their ratio to telebot's."""
    start = instructions("pass", env)
    counted = {name: instructions(stmt, env) - start for name, stmt in chosen.items()}
    base = counted["import telebot"]
    for name, value in counted.items():
        print(f"{name:38s} instructions {value / 1e6:8.1f} M  ({value / base:.3f}x import telebot)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", default=None, metavar="REGEX",
                        help="time only the statements whose name matches (import telebot always: the base)")
    parser.add_argument("--instructions", action="store_true",
                        help="count each statement's instructions once under valgrind (callgrind) instead of timing")
    parser.add_argument("--source", action="store_true",
                        help="let the children compile telegram_fence when PYTHONDONTWRITEBYTECODE is set")
    args = parser.parse_args()
    chosen = {name: stmt for name, stmt in STATEMENTS.items()
              if name == "import telebot" or args.only is None or re.search(args.only, name)}
    pycache = cache_dir("tf-import-pyc-")
    env = child_env(None if args.source else pycache.name)
    if not args.source:
        for stmt in chosen.values():  # unrecorded: writes the bytecode the recorded runs read
            once(stmt, env)
    if args.instructions:
        count(chosen, env)
        pycache.cleanup()
        return
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in chosen}
    for _ in range(args.rounds):
        for name, stmt in chosen.items():
            times[name].append(once(stmt, env))
    pycache.cleanup()
    base = statistics.median(wall for wall, _ in times["import telebot"])
    base_cpu = statistics.median(cpu for _, cpu in times["import telebot"])
    for name, values in times.items():
        median = statistics.median(wall for wall, _ in values)
        cpu = statistics.median(cpu for _, cpu in values)
        print(f"{name:38s} median {median:6.1f} ms  ({median / base:.2f}x import telebot)  "
              f"cpu {cpu:6.1f} ms  ({cpu / base_cpu:.2f}x cpu)")


if __name__ == "__main__":
    main()
