"""The store's values, once for every backend: checking and encoding updates, claim ids, identity keys,
lapse reasons and the shape of ``stats()``.

One input has one outcome on both backends: an update id out of range or an item that is not JSON data is
:class:`~telegram_fence.errors.InvalidUpdate` (nothing stored); JSON data nesting deeper than :data:`MAX_DEPTH`
becomes an exhaustion holding only ``{"update_id": N}`` and the reason (:class:`Unstorable`); a lone surrogate
is kept as its ``\\uXXXX`` escape; NaN is stored as ``null`` and the infinities as ``±9e999``.
No I/O, no clock; safe from any thread.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import ConfigurationError, InvalidUpdate
from ..records import Record
from ..updates import UnreadableUpdate, escape_lone_surrogates
from .contract import Identity
from .owners import TAG_SEPARATOR, owner_tag

__all__ = [
    "MAX_DEPTH",
    "MAX_ID",
    "STATE_NAMES",
    "TOO_DEEP_TO_DECODE",
    "Unstorable",
    "check_claim",
    "check_door",
    "check_due",
    "check_lease",
    "check_limit",
    "check_max_attempts",
    "check_offset",
    "corrupt_message",
    "count_states",
    "decode",
    "door_of",
    "encode",
    "identities_json",
    "key",
    "lapsed_reason",
    "new_claim_ids",
    "repeated_in_batch",
    "stats_shape",
    "storable_text",
    "validate",
]

#: The largest ``update_id``, offset and chat id a store keeps (a 64-bit signed integer).
MAX_ID = 2**63 - 1

#: The deepest nesting an update may have to be stored, on both backends (SQLite's JSON reader goes 1000 levels
#: deep and a batch wraps each update in two more).
MAX_DEPTH = 998

#: The error of an update exhausted because its stored payload nests too deep for Python to decode.
TOO_DEEP_TO_DECODE = "the update nests too deep to be decoded from JSON; its payload was not kept"
# One reason whichever bound was met first (Python's recursion limit or MAX_DEPTH).
_TOO_DEEP = f"the update nests too deep to be stored (at most {MAX_DEPTH} levels are kept); its payload was not stored"

#: The names of the row states.
STATE_NAMES = {0: "pending", 1: "claimed", 2: "settled", 3: "exhausted", 4: "skipped"}
_EXHAUSTED = 3

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_LAX_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_BRACKETS = re.compile(_STRING + r"|[\[\]{}]", re.DOTALL)
_NON_FINITE = re.compile(_STRING + r"|-?Infinity|NaN", re.DOTALL)
_FINITE = {"NaN": "null", "Infinity": "9e999", "-Infinity": "-9e999"}


class Unstorable(Record):
    """An update that is JSON data but cannot be stored: it is kept as an exhaustion with ``reason``."""

    __slots__ = ("reason",)
    reason: str

    def __init__(self, reason: str) -> None:
        object.__setattr__(self, "reason", reason)


# --- checking -------------------------------------------------------------------------------------


def validate(updates: Sequence[Any]) -> list[int]:
    """Each update's id, in order; :class:`InvalidUpdate` naming the first malformed item (no mapping, or
    an ``update_id`` that is not an integer in ``[0, 2**63)``)."""
    if isinstance(updates, (str, bytes)) or not isinstance(updates, Sequence):
        raise InvalidUpdate(f"record() takes a sequence of update dicts, got {type(updates).__name__}")
    checked = []
    for index, update in enumerate(updates):
        if type(update) is dict:  # the common case, checked without the ABC
            update_id = update.get("update_id")
            if type(update_id) is int and 0 <= update_id <= MAX_ID:
                checked.append(update_id)
                continue
        if not isinstance(update, Mapping):
            raise InvalidUpdate(
                f"update #{index} of the batch is a {type(update).__name__}, not a mapping; nothing was stored"
            )
        update_id = update.get("update_id")
        if not isinstance(update_id, int) or isinstance(update_id, bool) or not 0 <= update_id <= MAX_ID:
            raise InvalidUpdate(
                f"update #{index} of the batch has update_id={update_id!r}; a non-negative integer below 2**63 "
                "is required; nothing was stored"
            )
        checked.append(update_id)
    return checked


def check_lease(lease: object) -> None:
    """Raise :class:`ConfigurationError` naming ``lease`` unless it is a positive finite number of seconds."""
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 < lease < math.inf:
        raise ConfigurationError(f"lease={lease!r} must be a positive number of seconds")


def check_due(at: object) -> None:
    """Raise :class:`ConfigurationError` naming ``at`` unless it is a finite time in the store's clock."""
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise ConfigurationError(f"at={at!r} must be a finite time (seconds in the store's clock)")


def check_limit(limit: object, least: int = 1) -> None:
    """Raise :class:`ConfigurationError` naming ``limit`` unless it is an int from ``least`` to :data:`MAX_ID`."""
    if type(limit) is not int or not least <= limit <= MAX_ID:
        raise ConfigurationError(f"limit={limit!r} must be a whole number from {least} to 2**63 - 1")


def check_max_attempts(max_attempts: object) -> None:
    """Raise :class:`ConfigurationError` naming ``max_attempts`` unless it is an int from 1 to :data:`MAX_ID`."""
    if type(max_attempts) is not int or not 1 <= max_attempts <= MAX_ID:
        raise ConfigurationError(f"max_attempts={max_attempts!r} must be a whole number from 1 to 2**63 - 1")


def check_claim(lease: object, max_attempts: object) -> None:
    """:func:`check_lease`, and :func:`check_max_attempts` unless ``max_attempts`` is ``None`` (no limit)."""
    check_lease(lease)
    if max_attempts is not None:
        check_max_attempts(max_attempts)


def check_offset(next_offset: object) -> int:
    """``next_offset`` when it is an integer in ``[0, 2**63)``; :class:`InvalidUpdate` otherwise."""
    if type(next_offset) is not int or not 0 <= next_offset <= MAX_ID:
        raise InvalidUpdate(
            f"next_offset={next_offset!r} must be a non-negative integer below 2**63; nothing was stored"
        )
    return next_offset


# --- encoding -------------------------------------------------------------------------------------


def encode(update: Mapping[str, Any], index: int = 0) -> str | Unstorable:
    """One update as compact JSON text that UTF-8 can hold, or :class:`Unstorable` with the reason; raises
    :class:`InvalidUpdate` for what is not JSON data (a set, bytes, a cycle), naming its place ``index``."""
    try:
        text = _ENCODER.encode(update)
    except RecursionError:
        return Unstorable(_TOO_DEEP)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise _not_json(update, index, exc) from exc
        try:  # NaN and the infinities as Python writes them, then made JSON outside the strings
            text = _NON_FINITE.sub(lambda m: _FINITE.get(m.group(), m.group()), _LAX_ENCODER.encode(update))
        except RecursionError:
            return Unstorable(_TOO_DEEP)
        except (TypeError, ValueError) as inner:
            raise _not_json(update, index, inner) from inner
    except TypeError as exc:
        raise _not_json(update, index, exc) from exc
    if _too_deep(text):
        return Unstorable(_TOO_DEEP)
    return escape_lone_surrogates(text)


def repeated_in_batch(updates: Sequence[Mapping[str, Any]], ids: Sequence[int]) -> list[int]:
    """The ids of the items that repeat an ``update_id`` of the batch with another payload (compared as JSON
    values), one entry per such item, in batch order."""
    if len(set(ids)) == len(ids):
        return []
    first: dict[int, object] = {}
    repeated: list[int] = []
    for index, (update, update_id) in enumerate(zip(updates, ids, strict=True)):
        form = _comparable(update, index)
        if update_id not in first:
            first[update_id] = form
        elif form != first[update_id]:
            repeated.append(update_id)
    return repeated


def _comparable(update: Mapping[str, Any], index: int) -> object:
    """``update`` in a form equal for equal JSON values (a caller's non-JSON item: a form equal to nothing)."""
    if isinstance(update, UnreadableUpdate):
        return ("unreadable", update.reason)
    try:
        text = encode(update, index)
    except InvalidUpdate:
        return object()  # (recording raises for it anyway)
    if isinstance(text, Unstorable):
        return ("unstorable", text.reason)
    return json.dumps(json.loads(text), sort_keys=True)


def _too_deep(text: str) -> bool:
    """Whether the JSON ``text`` nests deeper than :data:`MAX_DEPTH` (counting brackets outside strings)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False  # cannot be that deep: the common case, two scans in C
    depth = 0
    for match in _BRACKETS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif token in "]}":
            depth -= 1
    return False


def _not_json(update: Mapping[str, Any], index: int, exc: BaseException) -> InvalidUpdate:
    return InvalidUpdate(
        f"update #{index} of the batch (update_id={update.get('update_id')}) cannot be stored as JSON: {exc}; "
        "nothing was stored"
    )


def decode(text: str) -> Any | None:
    """``text`` decoded from JSON; ``None`` when it nests too deep for Python. ``ValueError`` for text not JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        return None


def storable_text(text: object) -> str:
    """``str(text)`` as a store can keep it (UTF-8): lone surrogates become their ``\\uXXXX`` escapes."""
    return escape_lone_surrogates(str(text))


# --- claims and identities ------------------------------------------------------------------------


def new_claim_ids(count: int) -> list[str]:
    """``count`` fresh claim ids: this process's owner tag and ``-`` (none where it is unknown), then 24 random hex
    digits."""
    tag = owner_tag()
    prefix = tag + TAG_SEPARATOR if tag else ""
    tokens = os.urandom(12 * count).hex()
    return [prefix + tokens[i:i + 24] for i in range(0, len(tokens), 24)]


def key(identity: Identity) -> tuple[int, int, str]:
    """``identity`` as the three values every fenced statement compares; :class:`TypeError` for another type."""
    if not isinstance(identity, Identity):
        raise TypeError(f"expected an Identity(update_id, attempt, claim_id), got {type(identity).__name__}")
    return identity.update_id, identity.attempt, identity.claim_id


_json_string = json.encoder.encode_basestring_ascii  # a str as json.dumps writes it, in C


def identities_json(identities: Iterable[Identity]) -> str:
    """``identities`` as one JSON array of ``[update_id, attempt, claim_id]`` arrays; :class:`TypeError` for an
    item of another type."""
    parts = []
    for identity in identities:
        if type(identity) is Identity:
            update_id, attempt, claim_id = identity.update_id, identity.attempt, identity.claim_id
            if type(update_id) is int and type(attempt) is int and type(claim_id) is str:
                parts.append(f"[{update_id},{attempt},{_json_string(claim_id)}]")
                continue
        parts.append(json.dumps(list(key(identity))))
    return "[" + ",".join(parts) + "]"


def lapsed_reason(attempt: int, max_attempts: int) -> str:
    return f"attempt {attempt} of {max_attempts} lost its lease (the worker died or hung)"


# --- stats ----------------------------------------------------------------------------------------


def count_states(rows: Iterable[Sequence[Any]]) -> dict[str, int]:
    """Counts by state name from ``(state, acknowledged, count)`` rows; every name present, 0 for none."""
    counts = {"pending": 0, "claimed": 0, "settled": 0, "skipped": 0, "exhausted": 0, "acknowledged": 0}
    for state, acknowledged, count in rows:
        if state == _EXHAUSTED:
            counts["acknowledged" if acknowledged else "exhausted"] += int(count)
        else:
            name = STATE_NAMES.get(int(state), f"state{state}")
            counts[name] = counts.get(name, 0) + int(count)
    return counts


_DOORS = ("poll", "webhook")


def check_door(door: str) -> str:
    """``door`` when it is ``"poll"`` or ``"webhook"``; else :class:`~telegram_fence.errors.ConfigurationError`."""
    if door not in _DOORS:
        raise ConfigurationError(f"door={door!r} must be one of {', '.join(_DOORS)}")
    return door


def door_of(generation: int, webhook_generation: object) -> str:
    """The door of ``generation``, given the latest generation the webhook door began (``None``: never)."""
    return "webhook" if webhook_generation is not None and int(str(webhook_generation)) == generation else "poll"


def stats_shape(
    counts: Mapping[str, int],
    *,
    cursor: int,
    oldest_open_age: float | None,
    generation: Mapping[str, Any] | None,
    schema_version: int,
    payload_conflicts: int,
    backend: str,
    **extra: Any,
) -> dict[str, Any]:
    """The ``stats()`` of every store: counts by state, ``cursor``, ``oldest_open_age`` (``None`` when nothing is
    open), the latest ``generation`` (``None`` before the first), ``schema_version``, ``payload_conflicts``,
    ``backend``, then what a backend adds (``extra``)."""
    return {
        **counts,
        "cursor": int(cursor),
        "oldest_open_age": None if oldest_open_age is None else max(0.0, float(oldest_open_age)),
        "generation": None if generation is None else dict(generation),
        "schema_version": schema_version,
        "payload_conflicts": int(payload_conflicts),
        "backend": backend,
        **extra,
    }


def corrupt_message(what: str, detail: object) -> str:
    """What :class:`~telegram_fence.errors.StoreCorrupt` says on every backend: ``what`` is damaged, why, what
    to do."""
    return (
        f"{what} is damaged ({detail}); the fence cannot go on with it: stop every process "
        "using it and restore it from a backup (for a SQLite file, `sqlite3 FILE .recover` may save what is "
        "left); nothing more was written"
    )
