"""Argument parsing for every command: one-line errors (exit 2) and checked number and duration types.

May import: ``errors``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["Parser", "duration", "non_negative_int", "positive_float", "positive_int"]

EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr, then exit 2 (its subparsers too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)


def _number(kind: Callable[[str], float], test: Callable[[float], bool], wanted: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
        if value != value or value in (float("inf"), float("-inf")) or not test(value):  # NaN, infinities
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
        return value

    return parse


positive_float = _number(float, lambda v: v > 0, "a number of seconds above 0")
_positive_int = _number(int, lambda v: v >= 1, "a whole number of at least 1")
_non_negative_int = _number(int, lambda v: v >= 0, "a whole number of at least 0")


def positive_int(text: str) -> int:
    """An ``int`` >= 1 (for argparse ``type=``)."""
    return int(_positive_int(text))


def non_negative_int(text: str) -> int:
    """An ``int`` >= 0 (for argparse ``type=``)."""
    return int(_non_negative_int(text))


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def duration(text: str) -> float:
    """Seconds from ``30s``, ``15m``, ``12h``, ``7d``, ``2w`` or a plain number of seconds (for argparse)."""
    match = _DURATION.match(text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; use e.g. 7d, 12h, 30m, 45s")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]
