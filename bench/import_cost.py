"""What ``import telegram_fence`` costs against ``import telebot``, in fresh interpreters, alternating.

    python bench/import_cost.py              # 15 rounds
    python bench/import_cost.py --rounds 31

Each round starts one fresh ``python`` per statement (in turn, so the machine's drift spreads over all
of them) and times the statement inside it with ``time.perf_counter`` (interpreter start-up excluded).
Prints the median of each and its ratio to ``import telebot``. The children read compiled bytecode, as an
installed wheel has it (``bench/bytecode.py``; one unrecorded run of each statement writes it first); ``--source``
lets them compile ``telegram_fence`` when ``PYTHONDONTWRITEBYTECODE`` is set, as before.
``from telegram_fence import Fence`` includes telebot itself (the fence parses updates with telebot's types);
``import telegram_fence`` loads the public names on first use only.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from bytecode import cache_dir, child_env  # bench/ is the script's path

STATEMENTS = {
    "import telebot": "import telebot",
    "import telegram_fence": "import telegram_fence",
    "from telegram_fence import Fence": "from telegram_fence import Fence",
    "Fence + SqliteUpdateStore": "from telegram_fence import Fence, SqliteUpdateStore",
    "everything in __all__": "import telegram_fence as tf\nfor name in tf.__all__: getattr(tf, name)",
}

_CHILD = "import time\nstart_ = time.perf_counter()\n{stmt}\nprint((time.perf_counter() - start_) * 1000)\n"


def once(stmt: str, env: dict[str, str]) -> float:
    """Milliseconds the statement took in a fresh interpreter with ``env``."""
    out = subprocess.run([sys.executable, "-c", _CHILD.format(stmt=stmt)], capture_output=True, text=True,
                         check=True, env=env)
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--source", action="store_true",
                        help="let the children compile telegram_fence when PYTHONDONTWRITEBYTECODE is set")
    args = parser.parse_args()
    pycache = cache_dir("tf-import-pyc-")
    env = child_env(None if args.source else pycache.name)
    if not args.source:
        for stmt in STATEMENTS.values():  # unrecorded: writes the bytecode the recorded runs read
            once(stmt, env)
    times: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    for _ in range(args.rounds):
        for name, stmt in STATEMENTS.items():
            times[name].append(once(stmt, env))
    pycache.cleanup()
    base = statistics.median(times["import telebot"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:34s} median {median:6.1f} ms  ({median / base:.2f}x import telebot)")


if __name__ == "__main__":
    main()
