"""Argument parsing for every command: one-line errors (exit 2) and checked number and duration types."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

#: The largest id SQLite (and PostgreSQL's bigint) stores: ids and counts above it are refused with a line.
MAX_ID = 2**63 - 1


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr, then exit 2 (its subparsers too). A word that
    begins with ``-`` and a digit is a value, not an option (``--older-than -5d``), so its type names what is wrong
    with it (plain argparse: ``expected one argument``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's, but a word this parser cannot take is a one-line error naming its own ``--help``."""
        words = list(sys.argv[1:] if args is None else args)
        if self._subparsers is not None:
            for word in words:
                if not word.startswith("-") or word == "--":
                    break
                name = word.split("=", 1)[0]
                if not any(known.startswith(name) for known in self._option_string_actions):  # (abbreviations)
                    self.error(f"unrecognized arguments: {word}")
        parsed, extras = super().parse_known_args(words, namespace)
        if extras and self._subparsers is None:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


_N = TypeVar("_N", int, float)


def _number(kind: Callable[[str], _N], test: Callable[[_N], bool], wanted: str, *,
            limit: int | None = None) -> Callable[[str], _N]:
    """An argparse ``type=``: ``kind(text)`` if finite, within ``±limit`` and ``test`` holds, else an error."""
    def parse(text: str) -> _N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
        if value != value or value in (float("inf"), float("-inf")) or not test(value):  # NaN, infinities
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
        if limit is not None and value > limit:
            raise argparse.ArgumentTypeError(f"{text!r} is too large for {wanted}: at most {limit}")
        if limit is not None and value < -limit:
            raise argparse.ArgumentTypeError(f"{text!r} is too small for {wanted}: at least {-limit}")
        return value

    return parse


positive_float = _number(float, lambda v: v > 0, "a number of seconds above 0")
rate = _number(float, lambda v: v > 0, "a rate above 0 (messages per second, e.g. 25 or 0.5)")
positive_int = _number(int, lambda v: v >= 1, "a whole number of at least 1", limit=MAX_ID)
non_negative_int = _number(int, lambda v: v >= 0, "a whole number of at least 0", limit=MAX_ID)
update_id = _number(int, lambda v: v >= 0, "an update id (a whole number of at least 0)", limit=MAX_ID)
chat_id = _number(int, lambda v: True, "a chat id (a whole number)", limit=MAX_ID)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_NEGATIVE = re.compile(r"^\s*-\s*\d")
_BARE_NUMBER = re.compile(r"^\s*\d+(?:\.\d+)?\s*$")


def duration(text: str) -> float:
    """Seconds from ``45s``, ``30m``, ``12h``, ``7d`` or ``2w`` (for argparse); a bare ``7`` (seconds where days
    were meant?) and a negative one are refused, naming the value."""
    if _NEGATIVE.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is negative; give how long ago, without a sign (e.g. {text.strip()[1:].strip()})"
        )
    if _BARE_NUMBER.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} has no unit; say {text.strip()}d for days, {text.strip()}h hours, {text.strip()}m minutes "
            f"or {text.strip()}s seconds"
        )
    match = _DURATION.match(text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; use e.g. 7d, 12h, 30m, 45s")
    return float(match.group(1)) * _UNITS[match.group(2)]
