"""The update queue of the fake Bot API: pushed updates, offset confirmation and the ``getUpdates`` long poll (one
poller at a time, 409 for a second)."""

from __future__ import annotations

import itertools
import json
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...updates import escape_lone_surrogates
from .answers import ApiError, as_number

__all__ = ["Pending", "UpdateQueue", "parse_allowed"]

#: Update types Telegram sends when ``allowed_updates`` is empty or was never given.
DEFAULT_ALLOWED = frozenset({
    "message", "edited_message", "channel_post", "edited_channel_post", "business_connection", "business_message",
    "edited_business_message", "deleted_business_messages", "inline_query", "chosen_inline_result",
    "callback_query", "shipping_query", "pre_checkout_query", "purchased_paid_media", "poll", "poll_answer",
    "my_chat_member", "chat_join_request", "chat_boost", "removed_chat_boost"
})


@dataclass
class Pending:
    """One queued update: its id, its kind (``"message"``, ...) and its JSON, serialised once at push time."""

    update_id: int
    kind: str
    body: str


def parse_allowed(raw: Any) -> frozenset[str] | None:
    """An ``allowed_updates`` parameter: None when absent, the defaults when empty; raises the 400 if malformed."""
    if raw in (None, ""):
        return None
    try:
        names = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        raise ApiError(400, "Bad Request: can't parse allowed_updates JSON array") from None
    if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
        raise ApiError(400, "Bad Request: allowed_updates must be a JSON array of strings")
    return frozenset(names) if names else DEFAULT_ALLOWED


class UpdateQueue:
    """Queued updates and the ``getUpdates`` state. Thread-safe: every method takes ``cond`` (re-entrant); a change
    wakes its waiters. ``stopping`` ends long polls; ``max_long_poll`` caps their wait; ``conflict`` returns the 409
    that refuses any ``getUpdates`` (a set webhook), or None.
    """

    def __init__(self, cond: threading.Condition, stopping: threading.Event, max_long_poll: float | None) -> None:
        self.cond = cond
        self.stopping = stopping
        self.max_long_poll = max_long_poll
        self.pending: deque[Pending] = deque()
        self.next_update_id = 1000
        self.confirmed_offset = 0
        self.poller: tuple[object, Any] | None = None  # (marker, socket) of the running getUpdates
        self.allowed: frozenset[str] = DEFAULT_ALLOWED
        self.conflict: Callable[[], str | None] = lambda: None

    def queue(self, update: dict[str, Any]) -> int:
        """Queue ``update`` (its ``update_id`` assigned or checked to grow) and wake waiters; returns the id."""
        with self.cond:
            update_id = update.setdefault("update_id", self.next_update_id)
            if not isinstance(update_id, int) or update_id < self.next_update_id:
                raise ValueError(f"update_id {update_id!r} must be an int >= {self.next_update_id} (ids only grow)")
            self.next_update_id = update_id + 1
            # A lone surrogate stays an escape, as Telegram sends one.
            body = escape_lone_surrogates(json.dumps(update, separators=(",", ":"), ensure_ascii=False))
            kind = next((key for key in update if key != "update_id"), "")
            self.pending.append(Pending(update_id, kind, body))
            self.cond.notify_all()
            return update_id

    def get_updates(self, params: dict[str, Any], conn: Any) -> bytes:
        """``getUpdates``: confirm ``offset``, then answer queued updates or wait for some (the JSON array). ``conn`` is
        the client's socket: a running poll whose client hung up (killed, timed out) is superseded, as Telegram does.
        """
        offset = as_number(params, "offset")
        limit = as_number(params, "limit")
        limit = 100 if limit is None else min(100, max(1, limit))
        wait = max(0.0, as_number(params, "timeout", float, 0.0))
        if self.max_long_poll is not None:
            wait = min(wait, self.max_long_poll)
        allowed = parse_allowed(params.get("allowed_updates"))
        with self.cond:
            conflict = self.conflict()
            if conflict is not None:
                raise ApiError(409, conflict)
            if self.poller is not None and not peer_closed(self.poller[1]):
                raise ApiError(409, "Conflict: terminated by other getUpdates request; make sure that only one bot "
                                    "instance is running")
            if allowed is not None:
                self.allowed = allowed
            me = (object(), conn)
            self.poller = me
            self.cond.notify_all()  # wait_for(lambda: api.polling) in tests
            try:
                if offset is not None:
                    self._confirm(offset)
                deadline = time.monotonic() + wait
                while True:
                    batch = list(itertools.islice((u.body for u in self.pending if u.kind in self.allowed), limit))
                    if batch or self.stopping.is_set() or self.poller is not me:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self.cond.wait(remaining)
                    if self.conflict() is not None:
                        raise ApiError(409, "Conflict: terminated by setWebhook request")
            finally:
                if self.poller is me:
                    self.poller = None
        return ("[" + ",".join(batch) + "]").encode("utf-8")

    def _confirm(self, offset: int) -> None:
        pending = self.pending
        if offset < 0:
            while len(pending) > -offset:
                pending.popleft()
            floor = pending[0].update_id if pending else self.next_update_id
            self.confirmed_offset = max(self.confirmed_offset, floor)
            return
        while pending and pending[0].update_id < offset:
            pending.popleft()
        self.confirmed_offset = max(self.confirmed_offset, offset)


def peer_closed(sock: Any) -> bool:
    """True if the client of ``sock`` hung up (or the socket is unusable); False while it is connected."""
    try:
        return bool(select.select([sock], [], [], 0)[0]) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True
