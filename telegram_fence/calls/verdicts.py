"""The call journal's decisions as plain functions of values: which calls are journaled, what identifies a
call's arguments, what an answer means for the journal, what a journaled row means for a retried handler, and the
stand-in answer of a call whose real answer is unknown.

May import ``telegram.failures`` and the standard library. Pure: every function is safe from any
thread.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..telegram.failures import retry_after_of

__all__ = ["INTENT", "NO_RESULT", "QUEUED", "REFUSED", "SENT", "UNCERTAIN", "Verdict", "chat_of",
           "fingerprint", "journaled", "judge_answer", "replay_of", "stand_in"]

#: States of a journaled call: written before the request, the two certain answers, the third final answer,
#: and a call queued in a transaction that is sent after its commit.
INTENT, SENT, REFUSED, UNCERTAIN, QUEUED = "intent", "sent", "refused", "uncertain", "queued"


def journaled(method: str) -> bool:
    """Whether a call of Bot API ``method`` is journaled: every method but the read-only ``get*`` ones."""
    return not method.startswith("get")


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(type(value).__name__)


def fingerprint(method: str, params: Mapping[str, Any] | None, files: Mapping[str, Any] | None) -> str:
    """A short stable digest of a call's method and arguments, blind to what telebot randomises: a file counts by
    its field (an ``attach://`` field by its position) and its own file name, never its content. Never raises."""
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
    """The name a file part is sent under when it is the file's own, else ``None`` (telebot's random one)."""
    name = value[0] if isinstance(value, tuple) and value else getattr(value, "name", None)
    stream = value[1] if isinstance(value, tuple) and len(value) > 1 else value
    own = getattr(stream, "name", None)
    if not isinstance(name, str) or not isinstance(own, str):
        return None
    return name if os.path.basename(own) == os.path.basename(name) else None


def chat_of(params: Mapping[str, Any] | None) -> int | None:
    """The numeric chat id a call is addressed to, or ``None`` (no ``chat_id``, a ``@channel`` name, or a number
    beyond 64 bits, which no store column holds: such a call is journaled without a chat)."""
    value = (params or {}).get("chat_id")
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return None
    elif isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if _INT64_MIN <= value <= _INT64_MAX else None


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class Verdict(NamedTuple):
    """What one answer (or failure) means: ``state`` to record (``None``: forget the intent, nothing was done),
    ``pause`` seconds the call's scope must wait (a 429), and whether the request may be sent again now."""

    state: str | None
    pause: float = 0.0
    resend: bool = False


def judge_answer(status: int, body: Any, *, max_wait: float) -> Verdict:
    """What an HTTP answer (``body``: its parsed JSON, or ``None``) means for the journal: ``ok`` → sent; else
    refused, except a 429 (forgotten, its scope paused, sent again when the wait is at most ``max_wait``) and a 5xx
    (uncertain). Without JSON: uncertain on 200 and 5xx, forgotten on 408 and 429, refused otherwise."""
    if isinstance(body, dict) and "ok" in body:
        if body.get("ok") is True:
            return Verdict(SENT)
        code = body.get("error_code", status)
        if code == 429:
            wait = retry_after_of(body)
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


def replay_of(state: str, recorded_method: str, recorded_fingerprint: str, method: str,
              digest: str) -> tuple[str, bool]:
    """What a retried handler's call gets from a journaled row in ``state``: ``(action, changed)``, ``action``
    ``"answer"`` (the recorded answer), ``"uncertain"`` (an ``intent`` row too), ``"queued"`` or ``"mismatch"``
    (another method there); ``changed``: other arguments."""
    if recorded_method != method:
        return "mismatch", False
    changed = recorded_fingerprint != digest
    return "answer" if state in (SENT, REFUSED) else "queued" if state == QUEUED else "uncertain", changed


#: The answer of a call whose result is unknown and has no stand-in: telebot's method returns ``None``.
NO_RESULT = '{"ok": true, "result": null}'

#: The Bot API methods whose answer is one Message (the ``send*`` methods but ``sendChatAction`` and
#: ``sendMediaGroup``, and ``forwardMessage``), in lower case.
_MESSAGE = frozenset(name.lower() for name in (
    "sendMessage", "forwardMessage", "sendPhoto", "sendAudio", "sendDocument", "sendVideo", "sendAnimation",
    "sendVoice", "sendVideoNote", "sendPaidMedia", "sendLocation", "sendVenue", "sendContact", "sendPoll",
    "sendDice", "sendSticker", "sendInvoice", "sendGame",
))


def _chat(chat_id: int) -> dict[str, Any]:
    """The chat object of ``chat_id``, its type as the id tells."""
    if chat_id > 0:
        return {"id": chat_id, "type": "private"}
    return {"id": chat_id, "type": "supergroup" if str(chat_id).startswith("-100") else "group"}


def _message(chat_id: int, params: Mapping[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"message_id": 0, "date": 0, "chat": _chat(chat_id)}
    for key in ("text", "caption"):
        value = params.get(key)
        if isinstance(value, str):
            message[key] = value
    return message


def _media_count(params: Mapping[str, Any]) -> int:
    """How many items a ``sendMediaGroup``'s ``media`` holds (a JSON text or a list; 1 when it cannot be read)."""
    media = params.get("media")
    if isinstance(media, str):
        try:
            media = json.loads(media)
        except ValueError:
            return 1
    return len(media) if isinstance(media, list) and media else 1


def stand_in(method: str, params: Mapping[str, Any] | None) -> str:
    """The answer (JSON text) telebot gets for a call whose real answer is unknown (uncertain or queued): a
    Message with ``message_id`` 0, ``date`` 0 and the call's chat, text and caption (a list for
    ``sendMediaGroup``, ``{"message_id": 0}`` for ``copyMessage``), so a next step registers on it; else ``null``."""
    params = params or {}
    chat_id = chat_of(params)
    name = method.lower()
    if chat_id is None:
        return NO_RESULT
    if name in _MESSAGE:
        result: Any = _message(chat_id, params)
    elif name == "sendmediagroup":
        result = [_message(chat_id, {}) for _ in range(_media_count(params))]
    elif name == "copymessage":
        result = {"message_id": 0}
    else:
        return NO_RESULT
    return json.dumps({"ok": True, "result": result})
