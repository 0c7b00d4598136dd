"""Plain functions of values for conversations: state keys, the JSON kept for a state and its data, next-step
handler references.

A state is keyed as telebot keys it (bot, business connection, message thread, chat, user), an absent part written
as ``0``/``""``; a state and its data are kept as JSON text. May import ``errors`` and the standard library (layer
3, conversation).
"""

from __future__ import annotations

import importlib
import json
import math
import pickle
import sys
from collections.abc import Mapping
from typing import Any

from ..errors import StateNotStorable
from ..records import Record

__all__ = ["StateKey", "decode_args", "decode_data", "decode_state", "encode_args", "encode_data", "encode_state",
           "int64_of", "reads_of", "reference_of", "replied_to", "resolve", "state_key"]


class StateKey(Record):
    """Whose state: ``bot_id`` (0: not given), ``business_connection_id`` (``""``: none), ``message_thread_id``
    (0: none), ``chat_id``, ``user_id``."""

    __slots__ = ("bot_id", "business_connection_id", "chat_id", "message_thread_id", "user_id")
    bot_id: int
    business_connection_id: str
    message_thread_id: int
    chat_id: int
    user_id: int

    def __init__(self, bot_id: int, business_connection_id: str, message_thread_id: int, chat_id: int,
                 user_id: int) -> None:
        for field, value in zip(self._fields, (bot_id, business_connection_id, message_thread_id, chat_id, user_id),
                                strict=True):
            object.__setattr__(self, field, value)

    def params(self) -> tuple[int, str, int, int, int]:
        """The key as statement parameters, in the column order of the states table."""
        return (self.bot_id, self.business_connection_id, self.message_thread_id, self.chat_id, self.user_id)


_INT64 = 2**63


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if not (isinstance(value, str) and value.lstrip("-").isdigit()):
            raise StateNotStorable(f"{name}={value!r} must be an integer (a Telegram id)")
        value = int(value)
    if not -_INT64 <= value < _INT64:
        raise StateNotStorable(f"{name}={value} is outside the 64-bit integers a Telegram id (and the store) can hold")
    return value


def int64_of(text: str) -> int | None:
    """The 64-bit integer ``text`` writes in decimal ASCII, or ``None`` for anything else."""
    if not (text.isascii() and text.lstrip("-").isdigit()) or text.count("-") > 1:
        return None
    number = int(text)
    return number if -_INT64 <= number < _INT64 else None


def state_key(chat_id: Any, user_id: Any, business_connection_id: Any = None, message_thread_id: Any = None,
              bot_id: Any = None) -> StateKey:
    """The key of a state from telebot's arguments; :class:`StateNotStorable` for an id that is not an integer or
    lies outside 64 bits."""
    if chat_id is None:
        chat_id = user_id
    return StateKey(
        _integer(bot_id, "bot_id") if bot_id else 0,
        str(business_connection_id) if business_connection_id else "",
        _integer(message_thread_id, "message_thread_id") if message_thread_id else 0,
        _integer(chat_id, "chat_id"),
        _integer(user_id, "user_id"),
    )


def replied_to(update: Mapping[str, Any]) -> int | None:
    """The 64-bit id of the message a message update replies to, else ``None``. Never raises."""
    message = update.get("message")
    if type(message) is not dict and not isinstance(message, Mapping):
        return None
    reply = message.get("reply_to_message")
    if reply is None or not isinstance(reply, Mapping):
        return None
    replied = reply.get("message_id")
    return replied if type(replied) is int and -_INT64 <= replied < _INT64 else None


def reads_of(update: Mapping[str, Any], bot_id: Any) -> tuple[StateKey | None, str, str] | None:
    """What handling ``update`` is likely to read: the sender's state key (or ``None``), the chat whose next-step
    handlers a message takes and the message id whose reply handlers it takes (``""``: none). ``None`` for an
    update that is not a message or a callback query, or of an unexpected shape. Never raises."""
    try:
        message = update.get("message")
        query = update.get("callback_query")
        if isinstance(message, Mapping):
            chat, sender, steps = message["chat"]["id"], message.get("from"), True
            reply = message.get("reply_to_message")
            replied = str(reply["message_id"]) if isinstance(reply, Mapping) and "message_id" in reply else ""
        elif isinstance(query, Mapping) and isinstance(query.get("message"), Mapping):
            message, sender, steps, replied = query["message"], query.get("from"), False, ""
            chat = message["chat"]["id"]
        else:
            return None
        key = None
        if isinstance(sender, Mapping) and "id" in sender:
            thread = message.get("message_thread_id") if message.get("is_topic_message") else None
            key = state_key(chat, sender["id"], message.get("business_connection_id"), thread, bot_id)
        return key, str(chat) if steps else "", replied
    except (KeyError, TypeError, StateNotStorable):
        return None


def _check_json(value: Any, path: str) -> None:
    """Refuse what JSON would not give back as it was: tuples, sets, non-string keys, NaN, other objects."""
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise StateNotStorable(f"{path} is {value!r}: JSON has no NaN or infinity; store a string or None")
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for name, item in value.items():
            if not isinstance(name, str):
                raise StateNotStorable(f"{path} has the key {name!r}: conversation data keys must be strings")
            _check_json(item, f"{path}[{name!r}]")
        return
    raise StateNotStorable(
        f"{path} is a {type(value).__name__}: conversation data must be JSON values (str, int, float, bool, None, "
        "lists and dicts with string keys); store e.g. its id or a dict of its fields"
    )


def encode_state(state: Any) -> str:
    """The JSON text of a state: a telebot ``State`` by its ``name``, a string or an integer as itself;
    :class:`StateNotStorable` for anything else."""
    name = getattr(state, "name", state) if not isinstance(state, (str, int)) else state
    if isinstance(name, bool) or not isinstance(name, (str, int)):
        raise StateNotStorable(f"state={state!r} must be a telebot State, a string or an integer")
    return json.dumps(name)


def decode_state(text: str) -> Any:
    """The state :func:`encode_state` wrote (a string or an integer)."""
    return json.loads(text)


def encode_data(data: Mapping[str, Any]) -> str:
    """The JSON text of a state's data; :class:`StateNotStorable`, naming the key, for a value JSON would not give
    back unchanged."""
    if not isinstance(data, Mapping):
        raise StateNotStorable(f"state data must be a dict, not a {type(data).__name__}")
    plain = dict(data)
    _check_json(plain, "data")
    return json.dumps(plain, ensure_ascii=True, separators=(",", ":"))


def decode_data(text: str) -> dict[str, Any]:
    """A fresh dict of the data :func:`encode_data` wrote (changing it changes nothing stored)."""
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def reference_of(callback: Any) -> str | None:
    """``module:qualified.name`` when ``callback`` can be found again by that name in another process; ``None`` for
    a lambda, a closure, a bound method, a ``functools.partial`` and the like."""
    module = getattr(callback, "__module__", None)
    qualname = getattr(callback, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    target: Any = sys.modules.get(module)
    if target is None:
        return None
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    try:
        same = target is callback or bool(target == callback)
    except Exception:
        same = False
    return f"{module}:{qualname}" if same else None


def resolve(reference: str) -> Any:
    """The callable a :func:`reference_of` reference names (its module imported); ``LookupError`` when gone."""
    module, _, qualname = reference.partition(":")
    try:
        target: Any = sys.modules.get(module) or importlib.import_module(module)
    except Exception as exc:
        raise LookupError(f"{reference}: module {module!r} cannot be imported ({exc})") from exc
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise LookupError(f"{reference}: {module!r} has no {qualname!r} (renamed or removed?)") from None
    if not callable(target):
        raise LookupError(f"{reference} is not callable")
    return target


def encode_args(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bytes | None:
    """The pickled ``(args, kwargs)`` of a handler, or ``None`` when they cannot be pickled (kept in memory then)."""
    try:
        return pickle.dumps((tuple(args), dict(kwargs)), protocol=4)
    except Exception:
        return None


def decode_args(blob: bytes) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``(args, kwargs)`` :func:`encode_args` wrote; ``LookupError`` when they cannot be read back."""
    try:
        args, kwargs = pickle.loads(blob)
    except Exception as exc:
        raise LookupError(f"its arguments cannot be read back ({type(exc).__name__}: {exc})") from exc
    return tuple(args), dict(kwargs)
