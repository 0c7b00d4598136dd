"""Run one benchmark from two checkouts of this project, alternating A, B, A, B, … in one run.

    python bench/ab.py --a ../old --b . --rounds 4 -- bench/steps_cost.py --n 500 --rounds 1
    python bench/ab.py --a ../old --b . --rounds 3 --pick 'pair' --value 'ratio ([0-9.]+)' \
        -- bench/throughput.py --pairs 1 --handlers trivial

Each run is ``python SCRIPT ARGS`` in that checkout's directory with ``PYTHONPATH`` set to it, so each side
imports its own ``telegram_fence``. Alternating spreads the machine's drift over both sides. Prints the lines
of each run that match ``--pick`` (a regular expression; default: the first line of the output) and the median
per side of the value on those lines (``--value``: a regular expression whose first group is the number; default:
the first number on the line). Exits 2 on a failed run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")


def run(checkout: Path, script: str, args: list[str]) -> str:
    """One run of ``script`` in ``checkout``; returns its standard output, raises on a non-zero exit."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, script, *args], cwd=checkout, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: {script} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return done.stdout


def picked(output: str, pick: str | None) -> list[str]:
    """The lines of ``output`` matching ``pick`` (the first non-empty line when ``pick`` is None)."""
    lines = [line for line in output.splitlines() if line.strip()]
    if pick is None:
        return lines[:1]
    pattern = re.compile(pick)
    return [line for line in lines if pattern.search(line)]


def value_of(line: str, pattern: re.Pattern[str] | None) -> float | None:
    """The number ``pattern``'s first group finds on ``line`` (the first number when ``pattern`` is None)."""
    if pattern is None:
        match = _NUMBER.search(line)
        return float(match.group().replace(",", "")) if match else None
    found = pattern.search(line)
    return float(found.group(1).replace(",", "")) if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, type=Path, help="checkout A (e.g. a worktree of the old commit)")
    parser.add_argument("--b", required=True, type=Path, help="checkout B")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pick", default=None, help="regular expression of the output lines to keep")
    parser.add_argument("--value", default=None, help="regular expression whose first group is the figure")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    if ns.rounds < 1:
        parser.error("--rounds must be at least 1")
    figures: dict[str, list[float]] = {"A": [], "B": []}
    pattern = re.compile(ns.value) if ns.value else None
    for number in range(1, ns.rounds + 1):
        for side, checkout in (("A", ns.a.resolve()), ("B", ns.b.resolve())):
            try:
                output = run(checkout, ns.script, ns.args)
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                return 2
            for line in picked(output, ns.pick):
                print(f"round {number} {side}: {line.strip()}", flush=True)
                value = value_of(line, pattern)
                if value is not None:
                    figures[side].append(value)
    for side in ("A", "B"):
        if figures[side]:
            print(f"median {side}: {statistics.median(figures[side]):,.2f} over {len(figures[side])} figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
