"""The call journal's decisions as plain functions of values: which calls are journaled, what identifies a
call's arguments, what an answer means for the journal, and what a journaled row means for a retried handler.

May import the standard library only. Pure: every function is safe from any thread.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from ..records import Record

__all__ = [
    "INTENT",
    "QUEUED",
    "REFUSED",
    "SENT",
    "STATES",
    "UNCERTAIN",
    "Replay",
    "Verdict",
    "chat_of",
    "fingerprint",
    "journaled",
    "judge_answer",
    "judge_failure",
    "replay_of",
]

#: States of a journaled call: written before the request, the two certain answers, the third final answer,
#: and a call queued in a transaction that is sent after its commit.
INTENT, SENT, REFUSED, UNCERTAIN, QUEUED = "intent", "sent", "refused", "uncertain", "queued"
STATES = (INTENT, SENT, REFUSED, UNCERTAIN, QUEUED)


def journaled(method: str) -> bool:
    """Whether a call of Bot API ``method`` is journaled: every method but the read-only ``get*`` ones."""
    return not method.startswith("get")


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(type(value).__name__)


def fingerprint(method: str, params: Mapping[str, Any] | None, files: Mapping[str, Any] | None) -> str:
    """A short stable digest of a call's method and arguments, blind to what telebot randomises.

    Two calls with the same digest asked Telegram for the same thing. A file part counts by its field and, for a
    file opened from a path, its file name (never its content). telebot names each upload of an album (and each
    thumbnail or cover) with a fresh random field, referred to as ``attach://<field>`` in the parameters: such a
    field counts by its position among the call's files. The name telebot makes up for a stream without one does
    not count. Never raises.
    """
    fields = [str(field) for field in (files or {})]
    text_params = [v for v in (params or {}).values() if isinstance(v, str)]
    attached = {field: f"#{index}" for index, field in enumerate(fields)
                if any(f"attach://{field}" in value for value in text_params)}
    body = {str(k): _plain(_unrandomised(v, attached)) for k, v in (params or {}).items()}
    names: dict[str, Any] = {}
    for field, value in (files or {}).items():
        names[attached.get(str(field), str(field))] = _plain(_file_name(value))
    text = json.dumps([method, body, names], sort_keys=True, ensure_ascii=True, default=repr)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:24]


def _unrandomised(value: Any, attached: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for field, position in attached.items():
            value = value.replace(f"attach://{field}", f"attach://{position}")
    return value


def _file_name(value: Any) -> str | None:
    """The name a file part is sent under when it is the file's own (the last part of the path it was opened
    from), else ``None``: telebot gives a stream without a name a random one."""
    name = value[0] if isinstance(value, tuple) and value else getattr(value, "name", None)
    stream = value[1] if isinstance(value, tuple) and len(value) > 1 else value
    own = getattr(stream, "name", None)
    if not isinstance(name, str) or not isinstance(own, str):
        return None
    return name if os.path.basename(own) == os.path.basename(name) else None


def chat_of(params: Mapping[str, Any] | None) -> int | None:
    """The numeric chat id a call is addressed to, or ``None`` (no ``chat_id``, a ``@channel`` name, or a number that
    does not fit 64 bits: no Telegram chat id does and no store column holds one, so such a call is journaled without a
    chat, as an update with such a chat is recorded without one, and Telegram's answer decides; it was bound into the
    journal's row and failed there, an ``OverflowError`` on SQLite and a ``StoreError`` on PostgreSQL)."""
    value = (params or {}).get("chat_id")
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if _INT64_MIN <= value <= _INT64_MAX else None
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            return None
        return number if _INT64_MIN <= number <= _INT64_MAX else None
    return None


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class Verdict(Record):
    """What one answer (or failure) means: ``state`` to record (``None``: forget the intent, nothing was done),
    ``pause`` seconds the call's scope must wait (a 429), and whether the request may be sent again now."""

    __slots__ = ("pause", "resend", "state")
    state: str | None
    pause: float
    resend: bool

    def __init__(self, state: str | None, pause: float = 0.0, resend: bool = False) -> None:
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "pause", pause)
        object.__setattr__(self, "resend", resend)


def judge_answer(status: int, body: Any, *, max_wait: float) -> Verdict:
    """What an HTTP answer means for the journal.

    ``body`` is the parsed JSON (``None`` when it was not JSON). ``ok: true`` → sent; ``ok: false`` → refused,
    except a 429 (nothing was done: forget it, pause its scope for ``retry_after``, send again when that wait
    is at most ``max_wait``) and a 5xx (the server may have acted: uncertain). A non-JSON answer is uncertain
    when its status is 200 or 5xx (the request may have been carried out), forgotten on 408 and 429, refused
    otherwise.
    """
    if isinstance(body, dict) and "ok" in body:
        if body.get("ok") is True:
            return Verdict(SENT)
        code = body.get("error_code", status)
        if code == 429:
            wait = _retry_after(body)
            return Verdict(None, pause=wait, resend=wait <= max_wait)
        if isinstance(code, int) and 500 <= code < 600:
            return Verdict(UNCERTAIN)
        return Verdict(REFUSED)
    if status == 429:
        return Verdict(None, pause=1.0, resend=max_wait >= 1.0)
    if status == 408:
        return Verdict(None)
    if status == 200 or 500 <= status < 600:
        return Verdict(UNCERTAIN)
    return Verdict(REFUSED)


def _retry_after(body: Mapping[str, Any]) -> float:
    parameters = body.get("parameters")
    value = parameters.get("retry_after") if isinstance(parameters, dict) else None
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return 1.0
    if seconds != seconds:  # NaN
        return 1.0
    return max(0.0, seconds)


def judge_failure(not_sent: bool) -> Verdict:
    """What a request that got no answer means: forgotten (to be sent again by a later attempt) when it
    certainly never left this machine, else uncertain (final: never sent again automatically)."""
    return Verdict(None) if not_sent else Verdict(UNCERTAIN)


class Replay(Record):
    """What a retried handler's call gets from a journaled row: ``action`` is ``"answer"`` (give telebot the
    recorded answer), ``"uncertain"`` (the call's outcome is unknown: final), ``"queued"`` (the call waits to
    be sent after its commit) or ``"mismatch"`` (another method at this position); ``changed``: the same method
    with other arguments (reported, the recorded answer still given)."""

    __slots__ = ("action", "changed")
    action: str
    changed: bool

    def __init__(self, action: str, changed: bool = False) -> None:
        object.__setattr__(self, "action", action)
        object.__setattr__(self, "changed", changed)


def replay_of(state: str, recorded_method: str, recorded_fingerprint: str, method: str, digest: str) -> Replay:
    """How a call whose position already has a journaled row in ``state`` is answered (see :class:`Replay`).

    An ``intent`` row found by a later attempt was in flight when its attempt died or lost its update: it is
    uncertain. Another method at the position is a mismatch whatever the state.
    """
    if recorded_method != method:
        return Replay("mismatch")
    changed = recorded_fingerprint != digest
    if state in (SENT, REFUSED):
        return Replay("answer", changed)
    if state == QUEUED:
        return Replay("queued", changed)
    return Replay("uncertain", changed)
