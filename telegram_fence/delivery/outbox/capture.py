"""Captures: which updates are captured, their stable keys and payloads, and their insert in the record transaction."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import CaptureConflict, ConfigurationError, InvalidUpdate
from ...updates import MESSAGE_FIELDS, escape_lone_surrogates
from .queries import rows

log = logging.getLogger("telegram_fence.outbox.capture")


_INSERT = ("INSERT INTO fence_outbox(key, update_id, chat_id, payload, state, attempts, due_at, created_at, "
           "changed_at) VALUES (?, ?, ?, ?, 'pending', 0, ?, ?, ?) ON CONFLICT(key) DO NOTHING RETURNING key")
_SELECT_PAYLOAD = "SELECT payload FROM fence_outbox WHERE key = ?"


@dataclass(frozen=True, slots=True)
class Capture:
    """One capture as it is stored: the key, where it came from, and the JSON sent to the collector."""

    key: str
    update_id: int
    chat_id: int
    payload: str = field(repr=False)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text_of(message: Mapping[str, Any]) -> str | None:
    return next((v for v in (message.get("text"), message.get("caption")) if isinstance(v, str)), None)


def _identify(update: Mapping[str, Any], kinds: Collection[str]) -> tuple[str, Mapping[str, Any], int, int, int] | None:
    if not isinstance(update, Mapping):
        return None
    update_id = _int(update.get("update_id"))
    kind = next((kind for kind in kinds if isinstance(update.get(kind), Mapping)), None)
    if update_id is None or kind is None:
        return None
    message = update[kind]
    chat = message.get("chat")
    chat_id = _int(chat.get("id")) if isinstance(chat, Mapping) else None
    message_id = _int(message.get("message_id"))
    if chat_id is None or message_id is None:
        return None
    return kind, message, update_id, chat_id, message_id


def capture_key(update: Mapping[str, Any]) -> str:
    """The stable key ``telegram:{update_id}:{chat_id}:{message_id}`` of the message an update carries;
    :class:`~telegram_fence.errors.InvalidUpdate` when it carries none with a chat id and a message id."""
    return build_capture(update).key


def build_capture(update: Mapping[str, Any], kinds: Collection[str] = MESSAGE_FIELDS) -> Capture:
    """The capture of ``update``: its key and the JSON payload the collector receives (the same for the same update).
    Raises :class:`~telegram_fence.errors.InvalidUpdate` for an update without a message under ``kinds``, or one that
    cannot be encoded as JSON."""
    found = _identify(update, kinds)
    if found is None:
        shown = update.get("update_id") if isinstance(update, Mapping) else type(update).__name__
        raise InvalidUpdate(f"update {shown!r} carries no message with chat.id and message_id "
                            f"(one of {', '.join(kinds)}); nothing can be captured")
    kind, message, update_id, chat_id, message_id = found
    sender = message.get("from")
    key = f"telegram:{update_id}:{chat_id}:{message_id}"
    payload = {
        "key": key, "source": "telegram", "kind": kind, "update_id": update_id, "chat_id": chat_id,
        "message_id": message_id, "date": _int(message.get("date")), "text": _text_of(message), "update": update,
        "from_id": _int(sender.get("id")) if isinstance(sender, Mapping) else None,
    }
    try:  # a lone surrogate stays an escape, so the text can be stored and sent as UTF-8
        encoded = escape_lone_surrogates(json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True))
    except RecursionError:
        raise InvalidUpdate(f"update {update_id} nests too deep to be encoded as JSON; nothing was captured") from None
    except (TypeError, ValueError) as exc:
        raise InvalidUpdate(f"update {update_id} cannot be encoded as JSON: {exc}; nothing was captured") from exc
    return Capture(key, update_id, chat_id, encoded)


def _write_capture(conn: Any, capture: Capture, now: float) -> bool:
    """Insert ``capture`` in the caller's transaction; ``True`` when it is new, :class:`CaptureConflict` when the key
    exists with another payload (the stored one stays)."""
    if rows(conn, _INSERT, (capture.key, capture.update_id, capture.chat_id, capture.payload, now, now, now)):
        log.debug("capture enqueued", extra={"key": capture.key, "update_id": capture.update_id})
        return True
    stored = rows(conn, _SELECT_PAYLOAD, (capture.key,))
    try:
        if stored and (stored[0][0] == capture.payload or json.loads(stored[0][0]) == json.loads(capture.payload)):
            return False
    except (ValueError, RecursionError):
        pass
    log.error("capture key reused with a different payload; the first is kept",
              extra={"key": capture.key, "update_id": capture.update_id, "chat_id": capture.chat_id})
    raise CaptureConflict(f"capture {capture.key} already exists with a different payload; the first payload is kept "
                          "and this write was not stored (when raised while recording, the whole batch and the "
                          "cursor were left unchanged)")


@dataclass(frozen=True)
class CaptureRule:
    """Which updates become captures: a message under one of ``kinds`` in ``chats`` (when given), approved by
    ``authorize(update)`` (when given; it runs inside the record transaction: if it raises, the batch is not recorded),
    with a text or caption when ``require_text``. ``chats`` or ``authorize`` is required. Immutable."""

    chats: Collection[int] | None = None
    authorize: Callable[[Mapping[str, Any]], bool] | None = None
    kinds: Collection[str] = frozenset({"message"})
    require_text: bool = True

    def __post_init__(self) -> None:
        if self.chats is None and self.authorize is None:
            raise ConfigurationError("CaptureRule needs chats={...} (allowed chat ids) or authorize=fn(update) -> "
                                     "bool; to capture every chat pass authorize=lambda update: True")
        if self.chats is not None:
            if isinstance(self.chats, (str, bytes)) or not isinstance(self.chats, Iterable):
                raise ConfigurationError(f"chats={self.chats!r} must be a collection of chat ids (ints)")
            chats = frozenset(self.chats)
            if bad := [c for c in chats if _int(c) is None]:
                raise ConfigurationError(f"chats must hold integer chat ids; got {sorted(map(repr, bad))}")
            object.__setattr__(self, "chats", chats)
        if self.authorize is not None and not callable(self.authorize):
            raise ConfigurationError(f"authorize={self.authorize!r} must be a callable taking the update dict")
        if isinstance(self.kinds, str):
            raise ConfigurationError(f"kinds={self.kinds!r} must be a collection of update kinds, not one string")
        kinds = frozenset(self.kinds)
        if not kinds or kinds - set(MESSAGE_FIELDS):
            known = ", ".join(sorted(MESSAGE_FIELDS))
            raise ConfigurationError(f"kinds={sorted(kinds)!r}: capturable kinds are {known}")
        object.__setattr__(self, "kinds", kinds)

    @property
    def _order(self) -> tuple[str, ...]:
        return tuple(kind for kind in MESSAGE_FIELDS if kind in self.kinds)

    def matches(self, update: Mapping[str, Any]) -> bool:
        """Whether ``update`` is to be captured. Propagates whatever ``authorize`` raises."""
        found = _identify(update, self._order)
        if found is None:
            return False
        _kind, message, _update_id, chat_id, _message_id = found
        if self.require_text and _text_of(message) is None:
            return False
        if self.chats is not None and chat_id not in self.chats:
            return False
        return self.authorize is None or bool(self.authorize(update))

    def write(self, conn: Any, updates: Iterable[Mapping[str, Any]], now: float) -> int:
        """Capture the matching ``updates`` in the caller's transaction; return how many were new. An update whose
        capture cannot be built is logged and recorded without it. Raises :class:`CaptureConflict` on a key reused with
        another payload (the caller's transaction must then roll back)."""
        created = 0
        for update in updates:
            if self.matches(update):
                try:
                    capture = build_capture(update, self._order)
                except InvalidUpdate as exc:
                    log.error("capture cannot be built (%s); the update is recorded without it", exc,
                              extra={"update_id": update.get("update_id"), "err": str(exc)})
                    continue
                created += _write_capture(conn, capture, now)
        return created

    def record_hook(self, conn: Any, new_updates: Sequence[Mapping[str, Any]]) -> None:
        """The ``on_record`` hook for ``store.record`` (what ``Fence(..., capture=rule)`` passes): write this rule's
        captures on the system clock (no delivery). Raises as :meth:`write` does."""
        self.write(conn, new_updates, time.time())
