"""How the listing commands (``calls``, ``steps``) print their rows: one line each and a count per state, or JSON.

May import the standard library only.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol


class Row(Protocol):
    """A listed row: its state, and itself as a JSON object."""

    @property
    def state(self) -> str: ...

    def as_dict(self) -> dict[str, Any]: ...


def print_rows(rows: Sequence[Row], line: Callable[[Any, float], str], *, as_json: bool, nothing: str) -> int:
    """Print ``rows`` as a JSON array (``as_json``), or each as ``line(row, now)`` followed by how many there are in
    each state, or ``nothing`` when there are none. Returns the exit code, 0."""
    if as_json:
        json.dump([row.as_dict() for row in rows], sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print(nothing)
        return 0
    now = time.time()
    counts: dict[str, int] = {}
    for row in rows:
        print(line(row, now))
        counts[row.state] = counts.get(row.state, 0) + 1
    print(", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    return 0
