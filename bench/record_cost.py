"""What constructing a ``records.Record`` costs against the frozen dataclasses it replaced, in instructions.

    python bench/record_cost.py              # 20,000 constructions of each shape, counted under valgrind

Three classes of one shape (three fields, two with defaults): ``calls.verdicts.Verdict`` itself (a ``Record``
whose ``__init__`` sets each field with ``object.__setattr__``), a ``@dataclass(frozen=True)`` (what ``Verdict``
was) and a ``@dataclass(frozen=True, slots=True)``. Each is built ``--n`` times in a fresh interpreter under valgrind's
callgrind, and once with no construction; the difference over ``--n`` is printed: instructions per construction,
the loop's own included. Deterministic (``PYTHONHASHSEED=0``), where timeit on a loaded host swings 2x.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

_SHAPES = '''
import sys
from dataclasses import dataclass
from telegram_fence.calls.verdicts import Verdict as Recorded

@dataclass(frozen=True)
class Frozen:
    state: str | None
    pause: float = 0.0
    resend: bool = False

@dataclass(frozen=True, slots=True)
class FrozenSlots:
    state: str | None
    pause: float = 0.0
    resend: bool = False

made = globals()[sys.argv[1]]
for _ in range(int(sys.argv[2])):
    made("sent")
'''


def instructions(shape: str, n: int) -> int:
    """Instructions a fresh interpreter executes to build ``shape`` ``n`` times (start-up included)."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                           _SHAPES, shape, str(n)], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(done.stderr[-2000:])
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    args = parser.parse_args()
    for shape in ("Recorded", "Frozen", "FrozenSlots"):
        per = (instructions(shape, args.n) - instructions(shape, 0)) / args.n
        print(f"{shape:12s} {per:8.0f} instructions per construction")


if __name__ == "__main__":
    main()
