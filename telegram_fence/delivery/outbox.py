"""The capture outbox: every authorised message reaches an HTTP collector, at least once.

A *capture* is one row of ``fence_outbox`` in the same SQLite file as the updates. It is written
in the **same transaction** as the update it captures and the cursor, through the ``on_record``
hook of :meth:`SqliteUpdateStore.record <telegram_fence.store.sqlite.SqliteUpdateStore.record>`:
an update is never recorded without its capture, and a capture never exists without its update.
A delivery thread (``"fence-outbox"``) then POSTs each capture to the collector until the collector
accepts it (a 2xx answer).

Key and payload
    Every capture has the stable key ``telegram:{update_id}:{chat_id}:{message_id}`` and carries
    the original text (``text``, or ``caption`` for media) and the raw update. Enqueueing the same
    key with the same payload does nothing; the same key with a different payload raises
    :class:`~telegram_fence.errors.CaptureConflict` and keeps the first payload: evidence is never
    silently replaced.

States
    ``pending`` → ``delivering`` → ``delivered``; or ``failed`` when the collector refused it (a 4xx
    other than 408/429, or a 3xx) or ``max_attempts`` deliveries did not succeed. Network errors,
    timeouts, 408, 429 and 5xx put the row back to ``pending`` with exponential backoff (a
    ``Retry-After`` header is honoured). A row left ``delivering`` by a dead process is delivered
    again once its lease lapsed. Delivery is at least once; the key travels as the
    ``Idempotency-Key`` header so the collector can drop repeats.

How the Fence uses it
    ``Fence(bot, store, capture=outbox)`` with ``outbox = Outbox(store, url, rule=CaptureRule(...))``,
    on the same store (the same file) the Fence records into:

    1. at construction, refuse an outbox whose ``rule`` is ``None`` (nothing would be captured);
    2. every batch: ``store.record(batch, next_offset, ..., on_record=outbox.record_hook)``
       (``record_hook`` is :meth:`Outbox.on_record`). A :class:`CaptureConflict`, or an error raised
       by ``rule.authorize``, rolls the whole record back (updates and cursor unchanged); the poller
       logs it and asks Telegram for the same offset again. That is deliberate: an evidence
       mismatch stops ingress loudly instead of losing or replacing a capture, and an
       authorisation backend that is briefly down delays captures instead of dropping them;
    3. ``outbox.start()`` once the store is open, before polling; on shutdown ``outbox.stop()``
       then ``outbox.join(timeout)`` (an in-flight POST ends within ``timeout`` seconds).

    ``Fence(..., capture=rule)`` with a bare :class:`CaptureRule` passes ``rule.record_hook``:
    captures are written in the record transaction and delivered by an :class:`Outbox` running
    elsewhere (another process on the same file finds them within its ``recheck`` interval).

Only loopback collectors (``127.0.0.0/8``, ``::1``, ``localhost``) are accepted unless
``allow_remote=True`` is passed, and then a remote collector must use ``https``.

Logging goes to ``logging.getLogger("telegram_fence.outbox")`` with fixed messages and the extra
fields ``key``, ``update_id``, ``chat_id``, ``attempt`` (and ``status``, ``delay`` where they apply).
The captured text and the collector's answer are never logged.
"""

from __future__ import annotations

import email.utils
import http.client
import ipaddress
import json
import logging
import math
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import apsw

from ..errors import CaptureConflict, ConfigurationError, InvalidUpdate
from ..retry import exponential

__all__ = [
    "MESSAGE_KINDS",
    "STATES",
    "Capture",
    "CaptureRule",
    "CollectorTarget",
    "Outbox",
    "RecordHook",
    "build_capture",
    "capture_key",
    "check_collector_url",
    "classify_status",
    "failed_captures",
    "outbox_stats",
    "parse_retry_after",
    "requeue_failed",
    "retry_delay",
]

log = logging.getLogger("telegram_fence.outbox")

RecordHook = Callable[[apsw.Connection, Sequence[Mapping[str, Any]]], None]
Clock = Callable[[], float]

_KIND_ORDER = (
    "message",
    "edited_message",
    "channel_post",
    "edited_channel_post",
    "business_message",
    "edited_business_message",
)
#: Update fields that carry a message a capture can be made of.
MESSAGE_KINDS = frozenset(_KIND_ORDER)
#: The states of a capture, in the order a successful one goes through them (plus ``failed``).
STATES = ("pending", "delivering", "delivered", "failed")

THREAD_NAME = "fence-outbox"
_ANSWER_READ = 64 * 1024  # bytes of the collector's answer read at most
_ANSWER_KEPT = 2000  # characters of it kept in the row
_MAX_RETRY_AFTER = 86400.0  # a Retry-After beyond one day is taken as one day
_USER_AGENT = "telegram-fence-outbox/1"

# --- SQL -------------------------------------------------------------------------------------------

_INSERT = (
    "INSERT INTO fence_outbox(key, update_id, chat_id, payload, state, attempts, due_at, created_at, changed_at) "
    "VALUES (?, ?, ?, ?, 'pending', 0, ?, ?, ?) ON CONFLICT(key) DO NOTHING"
)
_SELECT_PAYLOAD = "SELECT payload FROM fence_outbox WHERE key = ?"
_FAIL_LAPSED = (
    "UPDATE fence_outbox SET state = 'failed', lease_until = NULL, claim_id = NULL, last_error = ?, "
    "changed_at = ? WHERE state = 'delivering' AND lease_until <= ? AND attempts >= ? "
    "RETURNING key, update_id, chat_id, attempts"
)
_NEXT_LAPSED = (
    "SELECT key FROM fence_outbox WHERE state = 'delivering' AND lease_until <= ? ORDER BY lease_until LIMIT 1"
)
_NEXT_DUE = "SELECT key FROM fence_outbox WHERE state = 'pending' AND due_at <= ? ORDER BY due_at, update_id LIMIT 1"
_TAKE = (
    "UPDATE fence_outbox SET state = 'delivering', attempts = attempts + 1, "
    "claim_id = lower(hex(randomblob(12))), lease_until = ?, changed_at = ? WHERE key = ? "
    "RETURNING update_id, chat_id, attempts, claim_id, payload"
)
_EARLIEST_DUE = "SELECT min(due_at) FROM fence_outbox WHERE state = 'pending'"
_EARLIEST_LEASE = "SELECT min(lease_until) FROM fence_outbox WHERE state = 'delivering'"
# Any accepted answer is the fact that matters, even from a claim whose lease lapsed meanwhile.
_MARK_DELIVERED = (
    "UPDATE fence_outbox SET state = 'delivered', lease_until = NULL, claim_id = NULL, last_status = ?, "
    "answer = ?, last_error = NULL, changed_at = ? WHERE key = ? AND state != 'delivered'"
)
# A failure only counts for the claim that is still current.
_MARK_UNDELIVERED = (
    "UPDATE fence_outbox SET state = ?, due_at = ?, lease_until = NULL, claim_id = NULL, last_status = ?, "
    "last_error = ?, answer = ?, changed_at = ? WHERE key = ? AND claim_id = ? AND state = 'delivering'"
)
_COUNTS = "SELECT state, count(*) FROM fence_outbox GROUP BY state"
_OLDEST_UNDELIVERED = "SELECT min(created_at) FROM fence_outbox WHERE state IN ('pending', 'delivering')"
_REQUEUE_ALL = (
    "UPDATE fence_outbox SET state = 'pending', attempts = 0, due_at = ?, changed_at = ? WHERE state = 'failed'"
)
_REQUEUE_KEYS = (
    "UPDATE fence_outbox SET state = 'pending', attempts = 0, due_at = ?, changed_at = ? "
    "WHERE state = 'failed' AND key IN (SELECT value FROM json_each(?))"
)
_FAILED = (
    "SELECT key, update_id, chat_id, attempts, last_status, last_error, changed_at FROM fence_outbox "
    "WHERE state = 'failed' ORDER BY changed_at, key LIMIT ?"
)
_PRUNE = "DELETE FROM fence_outbox WHERE state = 'delivered' AND changed_at < ?"


# --- the same statements on PostgreSQL ---------------------------------------------------------------
# A PostgresUpdateStore yields psycopg connections; they carry the name of the store's outbox table
# (``{table}_outbox``) as ``telegram_fence_outbox``. The statements above are rewritten for them once.

_PG_REWRITES = (
    ("lower(hex(randomblob(12)))", "substr(md5(random()::text || clock_timestamp()::text), 1, 24)"),
    ("(SELECT value FROM json_each(?))", "(SELECT json_array_elements_text(?::json))"),
    ("?", "%s"),
)
_pg_statements: dict[tuple[str, str], str] = {}


class _PgDb:
    """``execute`` and ``changes`` of an APSW connection, over a psycopg connection."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._table = str(getattr(conn, "telegram_fence_outbox", "fence_outbox"))
        self._changes = 0

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        text = _pg_statements.get((sql, self._table))
        if text is None:
            text = sql.replace("fence_outbox", self._table)
            for old, new in _PG_REWRITES:
                text = text.replace(old, new)
            _pg_statements[(sql, self._table)] = text
        cursor = self._conn.execute(text, tuple(params))
        self._changes = max(0, cursor.rowcount)
        return cursor

    def changes(self) -> int:
        return self._changes


def _db(conn: Any) -> Any:
    """``conn`` itself for APSW; a :class:`_PgDb` over a psycopg connection (PostgreSQL store)."""
    return conn if isinstance(conn, apsw.Connection) else _PgDb(conn)


# --- captures --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Capture:
    """One capture as it is stored: the key, where it came from, and the JSON sent to the collector."""

    key: str
    update_id: int
    chat_id: int
    payload: str = field(repr=False)


def _message(update: Mapping[str, Any], kinds: Collection[str]) -> tuple[str, Mapping[str, Any]] | None:
    for kind in kinds:
        value = update.get(kind)
        if isinstance(value, Mapping):
            return kind, value
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text_of(message: Mapping[str, Any]) -> str | None:
    for name in ("text", "caption"):
        value = message.get(name)
        if isinstance(value, str):
            return value
    return None


def _encode(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _identify(update: Mapping[str, Any], kinds: Collection[str]) -> tuple[str, Mapping[str, Any], int, int, int] | None:
    if not isinstance(update, Mapping):
        return None
    update_id = _int(update.get("update_id"))
    found = _message(update, kinds)
    if update_id is None or found is None:
        return None
    kind, message = found
    chat = message.get("chat")
    chat_id = _int(chat.get("id")) if isinstance(chat, Mapping) else None
    message_id = _int(message.get("message_id"))
    if chat_id is None or message_id is None:
        return None
    return kind, message, update_id, chat_id, message_id


def capture_key(update: Mapping[str, Any]) -> str:
    """The stable key ``telegram:{update_id}:{chat_id}:{message_id}`` of the message an update carries.

    Raises :class:`~telegram_fence.errors.InvalidUpdate` when the update carries no message with a
    chat id and a message id.
    """
    return build_capture(update).key


def build_capture(update: Mapping[str, Any], kinds: Collection[str] = _KIND_ORDER) -> Capture:
    """The capture of ``update``: its key and the JSON payload the collector receives.

    The payload is ``{"key", "source": "telegram", "kind", "update_id", "chat_id", "message_id",
    "date", "from_id", "text", "update"}``: ``text`` is the message's text or caption exactly as sent
    (``null`` when it has neither), ``update`` the raw update. The same update always gives the same
    payload. ``kinds`` are the update fields looked at, in order. Raises
    :class:`~telegram_fence.errors.InvalidUpdate` for an update without such a message, or without
    a chat id or a message id.
    """
    found = _identify(update, kinds)
    if found is None:
        shown = update.get("update_id") if isinstance(update, Mapping) else type(update).__name__
        raise InvalidUpdate(
            f"update {shown!r} carries no message with chat.id and message_id "
            f"(one of {', '.join(kinds)}); nothing can be captured"
        )
    kind, message, update_id, chat_id, message_id = found
    sender = message.get("from")
    key = f"telegram:{update_id}:{chat_id}:{message_id}"
    payload = {
        "key": key,
        "source": "telegram",
        "kind": kind,
        "update_id": update_id,
        "chat_id": chat_id,
        "message_id": message_id,
        "date": _int(message.get("date")),
        "from_id": _int(sender.get("id")) if isinstance(sender, Mapping) else None,
        "text": _text_of(message),
        "update": update,
    }
    try:
        encoded = _encode(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidUpdate(f"update {update_id} cannot be encoded as JSON: {exc}; nothing was captured") from exc
    return Capture(key, update_id, chat_id, encoded)


def _write_capture(conn: apsw.Connection, capture: Capture, now: float) -> bool:
    """Insert ``capture`` through ``conn`` (inside the caller's transaction); ``True`` when it is new.

    Raises :class:`CaptureConflict` when the key exists with a different payload (the stored one stays).
    """
    conn = _db(conn)
    conn.execute(_INSERT, (capture.key, capture.update_id, capture.chat_id, capture.payload, now, now, now))
    if conn.changes() == 1:
        log.debug(
            "capture enqueued",
            extra={"key": capture.key, "update_id": capture.update_id, "chat_id": capture.chat_id},
        )
        return True
    row = conn.execute(_SELECT_PAYLOAD, (capture.key,)).fetchone()
    if row is not None and json.loads(row[0]) == json.loads(capture.payload):
        return False
    log.error(
        "capture key reused with a different payload; the first is kept",
        extra={"key": capture.key, "update_id": capture.update_id, "chat_id": capture.chat_id},
    )
    raise CaptureConflict(
        f"capture {capture.key} already exists with a different payload; the first payload is kept and "
        "this write was not stored (when raised while recording, the whole batch and the cursor were "
        "left unchanged)"
    )


@dataclass(frozen=True)
class CaptureRule:
    """Which updates become captures.

    An update is captured when all of these hold: it carries a message under one of ``kinds``
    (default: new messages only), with a chat id and a message id; its chat is in ``chats`` (when
    given); ``authorize(update)`` returns true (when given); and, with ``require_text`` (default),
    the message has a ``text`` or a ``caption``. At least one of ``chats`` and ``authorize`` is
    required, so capturing every chat is a visible decision (``authorize=lambda update: True``).

    ``authorize`` runs inside the record transaction: if it raises, the batch is not recorded
    (the poller asks for it again), so it must be quick and must not touch the database itself.
    Immutable; safe to share between threads when ``authorize`` is.
    """

    chats: Collection[int] | None = None
    authorize: Callable[[Mapping[str, Any]], bool] | None = None
    kinds: Collection[str] = frozenset({"message"})
    require_text: bool = True

    def __post_init__(self) -> None:
        if self.chats is None and self.authorize is None:
            raise ConfigurationError(
                "CaptureRule needs chats={...} (allowed chat ids) or authorize=fn(update) -> bool; "
                "to capture every chat pass authorize=lambda update: True"
            )
        if self.chats is not None:
            if isinstance(self.chats, (str, bytes)) or not isinstance(self.chats, Iterable):
                raise ConfigurationError(f"chats={self.chats!r} must be a collection of chat ids (ints)")
            chats = frozenset(self.chats)
            bad = [c for c in chats if _int(c) is None]
            if bad:
                raise ConfigurationError(f"chats must hold integer chat ids; got {sorted(map(repr, bad))}")
            object.__setattr__(self, "chats", chats)
        if self.authorize is not None and not callable(self.authorize):
            raise ConfigurationError(f"authorize={self.authorize!r} must be a callable taking the update dict")
        if isinstance(self.kinds, str):
            raise ConfigurationError(f"kinds={self.kinds!r} must be a collection of update kinds, not one string")
        kinds = frozenset(self.kinds)
        unknown = kinds - MESSAGE_KINDS
        if not kinds or unknown:
            raise ConfigurationError(
                f"kinds={sorted(kinds)!r}: capturable kinds are {', '.join(sorted(MESSAGE_KINDS))}"
            )
        object.__setattr__(self, "kinds", kinds)

    @property
    def _order(self) -> tuple[str, ...]:
        return tuple(kind for kind in _KIND_ORDER if kind in self.kinds)

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

    def write(self, conn: apsw.Connection, updates: Iterable[Mapping[str, Any]], now: float) -> int:
        """Capture the matching ``updates`` through ``conn``, inside the caller's transaction.

        Returns how many captures were new. Raises :class:`CaptureConflict` on a key reused with
        another payload; the caller's transaction must then roll back (``store.record`` does).
        """
        created = 0
        for update in updates:
            if self.matches(update):
                created += _write_capture(conn, build_capture(update, self._order), now)
        return created

    @property
    def record_hook(self) -> RecordHook:
        """``hook()`` on the system clock: what ``Fence(..., capture=rule)`` passes to ``store.record``."""
        return self.hook()

    def hook(self, clock: Clock = time.time) -> RecordHook:
        """An ``on_record`` hook for ``store.record`` that writes this rule's captures (no delivery)."""

        def on_record(conn: apsw.Connection, new_updates: Sequence[Mapping[str, Any]]) -> None:
            self.write(conn, new_updates, clock())

        return on_record


# --- decisions (plain functions of values) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CollectorTarget:
    """A validated collector URL, split for ``http.client``; ``safe`` is what may be logged."""

    scheme: str
    host: str
    port: int
    target: str
    safe: str


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv4Address):
        return address in ipaddress.IPv4Network("127.0.0.0/8")
    return address == ipaddress.IPv6Address("::1")


def check_collector_url(url: str, *, allow_remote: bool = False) -> CollectorTarget:
    """Validate a collector URL; raise :class:`ConfigurationError` naming what is wrong.

    Accepted: ``http`` or ``https`` to ``127.0.0.0/8``, ``::1`` or ``localhost``; with
    ``allow_remote=True`` also any other host over ``https``. Refused: other schemes, other hosts,
    credentials in the URL (pass ``headers=`` instead), a bad port.
    """
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"collector_url={url!r} must be an http(s) URL such as http://127.0.0.1:8080/capture")
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ConfigurationError(f"collector_url {url!r}: scheme must be http or https, not {parts.scheme!r}")
    if parts.username is not None or parts.password is not None:
        raise ConfigurationError(
            "collector_url must not carry credentials (user:password@); pass headers={'Authorization': ...}"
        )
    host = parts.hostname
    if not host:
        raise ConfigurationError(f"collector_url {url!r} has no host")
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"collector_url {url!r} has an invalid port: {exc}") from None
    if port is None:
        port = 443 if scheme == "https" else 80
    if not _is_loopback(host):
        if not allow_remote:
            raise ConfigurationError(
                f"collector_url host {host!r} is not loopback (127.0.0.0/8, ::1, localhost); captures hold "
                "private messages, so a remote collector needs allow_remote=True and https"
            )
        if scheme != "https":
            raise ConfigurationError(
                f"collector_url {parts.scheme}://{host}: a remote collector must use https, even with allow_remote=True"
            )
    path = parts.path or "/"
    target = f"{path}?{parts.query}" if parts.query else path
    shown_host = f"[{host}]" if ":" in host else host
    return CollectorTarget(scheme, host, port, target, f"{scheme}://{shown_host}:{port}{path}")


def classify_status(status: int) -> str:
    """What an HTTP answer means for a capture: ``"delivered"`` (2xx), ``"retry"`` (408, 429, 5xx) or ``"failed"``.

    Every other answer (3xx, other 4xx, anything unknown) is ``"failed"``: repeating cannot help,
    and redirects are not followed (a capture is never sent to a host that was not configured).
    """
    if 200 <= status < 300:
        return "delivered"
    if status in (408, 429) or 500 <= status < 600:
        return "retry"
    return "failed"


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta seconds or an HTTP date); ``None`` if absent or bad."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def retry_delay(attempt: int, *, initial: float, maximum: float, retry_after: float | None = None) -> float:
    """Seconds before the next delivery after failed attempt ``attempt`` (1-based).

    Without ``retry_after``: ``initial * 2 ** (attempt - 1)`` capped at ``maximum``. With it: the
    collector's wish, but never less than ``initial`` (a ``Retry-After: 0`` must not make a hot
    loop) and never more than one day.
    """
    if retry_after is not None:
        return min(max(retry_after, initial), _MAX_RETRY_AFTER)
    return exponential(max(attempt, 1), initial, maximum)


# --- store-level operations (used by Outbox and the CLI) -------------------------------------------


def outbox_stats(store: Any) -> dict[str, Any]:
    """Counts of captures by state and the age in seconds of the oldest undelivered one (``None`` if none).

    ``{"pending", "delivering", "delivered", "failed", "oldest_pending_age", "next_due_at"}``;
    "undelivered" means pending or delivering.
    """
    counts: dict[str, Any] = dict.fromkeys(STATES, 0)
    with store.write() as handle:
        conn = _db(handle)
        now = store.clock()
        for state, count in conn.execute(_COUNTS):
            counts[state] = count
        oldest = conn.execute(_OLDEST_UNDELIVERED).fetchone()[0]
        next_due = conn.execute(_EARLIEST_DUE).fetchone()[0]
    counts["oldest_pending_age"] = None if oldest is None else max(0.0, now - oldest)
    counts["next_due_at"] = next_due
    return counts


def requeue_failed(store: Any, keys: Iterable[str] | None = None) -> int:
    """Put failed captures back to pending, due now, with a fresh attempt budget; return how many.

    ``keys=None`` re-queues every failed capture; otherwise only the failed ones among ``keys``
    (other keys are ignored). Their last error and answer stay until the next attempt.
    """
    with store.write() as handle:
        conn = _db(handle)
        now = store.clock()
        if keys is None:
            conn.execute(_REQUEUE_ALL, (now, now))
        else:
            wanted = [keys] if isinstance(keys, str) else list(keys)
            if not all(isinstance(k, str) for k in wanted):
                raise ConfigurationError("requeue_failed(keys=...) takes capture keys (strings)")
            conn.execute(_REQUEUE_KEYS, (now, now, json.dumps(wanted)))
        count = conn.changes()
    if count:
        log.info("failed captures re-queued", extra={"count": count})
    return count


def failed_captures(store: Any, limit: int = 20) -> list[dict[str, Any]]:
    """Up to ``limit`` failed captures, oldest failure first: key, ids, attempts, last status and error."""
    with store.write() as handle:
        rows = _db(handle).execute(_FAILED, (limit,)).fetchall()
    names = ("key", "update_id", "chat_id", "attempts", "last_status", "last_error", "failed_at")
    return [dict(zip(names, row, strict=True)) for row in rows]


# --- delivery --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Delivery:
    key: str
    update_id: int
    chat_id: int | None
    attempt: int
    claim_id: str
    payload: str = field(repr=False)
    recovered: bool = False

    def fields(self, **more: Any) -> dict[str, Any]:
        return {"key": self.key, "update_id": self.update_id, "chat_id": self.chat_id, "attempt": self.attempt, **more}


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    reason: str
    retry_after: str | None
    body: str


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name}={value!r} must be a positive, finite number of seconds")
    return float(value)


class Outbox:
    """Captures in the store's file and the thread that delivers them to one HTTP collector.

    Construction validates everything and touches no network. ``rule`` decides what
    :meth:`on_record` captures (``None``: only :meth:`enqueue` adds captures). ``max_attempts``
    deliveries without an accepted answer mark a capture failed; the defaults (1 s doubling to
    5 minutes, 1000 attempts) keep retrying for about three and a half days. ``lease`` must exceed
    ``timeout``: a capture whose delivery has not ended ``lease`` seconds after it started is
    taken to be abandoned and delivered again. ``headers`` are added to every POST (e.g. an
    ``Authorization``) and never logged. ``recheck`` bounds how long the idle thread waits before
    looking for captures written by another process (its own captures wake it at once).

    Thread-safe: the record hook, :meth:`enqueue`, :meth:`deliver_once` and the delivery thread
    may run concurrently (each capture is claimed in its own transaction).
    """

    def __init__(
        self,
        store: Any,
        collector_url: str,
        *,
        rule: CaptureRule | None = None,
        allow_remote: bool = False,
        max_attempts: int = 1000,
        lease: float = 60.0,
        timeout: float = 10.0,
        backoff: tuple[float, float] = (1.0, 300.0),
        headers: Mapping[str, str] | None = None,
        recheck: float = 30.0,
    ) -> None:
        if not callable(getattr(store, "write", None)) or not callable(getattr(store, "clock", None)):
            raise ConfigurationError(
                f"Outbox needs a SqliteUpdateStore or PostgresUpdateStore (with write() and clock); "
                f"got {type(store).__name__}"
            )
        if rule is not None and not isinstance(rule, CaptureRule):
            raise ConfigurationError(f"rule={rule!r} must be a CaptureRule or None")
        if not isinstance(allow_remote, bool):
            raise ConfigurationError(f"allow_remote={allow_remote!r} must be True or False")
        self._target = check_collector_url(collector_url, allow_remote=allow_remote)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigurationError(f"max_attempts={max_attempts!r} must be an integer >= 1")
        self.lease = _positive("lease", lease)
        self.timeout = _positive("timeout", timeout)
        if self.lease <= self.timeout:
            raise ConfigurationError(
                f"lease={lease!r} must be longer than timeout={timeout!r}, or a slow delivery would be "
                "taken for an abandoned one and sent again"
            )
        try:
            initial, maximum = backoff
        except (TypeError, ValueError):
            raise ConfigurationError(f"backoff={backoff!r} must be (initial_seconds, maximum_seconds)") from None
        self._initial = _positive("backoff[0]", initial)
        self._maximum = _positive("backoff[1]", maximum)
        if self._maximum < self._initial:
            raise ConfigurationError(f"backoff={backoff!r}: the maximum must not be below the initial delay")
        self._headers = dict(headers or {})
        for name, value in self._headers.items():
            if not isinstance(name, str) or not isinstance(value, str) or any(c in name + value for c in "\r\n"):
                raise ConfigurationError(f"header {name!r} must be a string name and value without line breaks")
        self.recheck = _positive("recheck", recheck)
        self.max_attempts = max_attempts
        self.rule = rule
        self.store = store
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()

    @property
    def collector(self) -> str:
        """The collector URL as it may be logged (no query string)."""
        return self._target.safe

    # --- writing captures ------------------------------------------------------------------------

    def on_record(self, conn: apsw.Connection, new_updates: Sequence[Mapping[str, Any]]) -> None:
        """The ``on_record`` hook for ``store.record``: capture ``new_updates`` matching :attr:`rule`.

        Runs inside the record transaction; raises :class:`CaptureConflict` (the record then rolls
        back) on a key reused with another payload, and :class:`ConfigurationError` when the outbox
        has no rule.
        """
        if self.rule is None:
            raise ConfigurationError("this Outbox has no rule=CaptureRule(...); it cannot be used as a record hook")
        if self.rule.write(conn, new_updates, self.store.clock()):
            self._wake.set()

    @property
    def record_hook(self) -> RecordHook:
        """:meth:`on_record`: what ``Fence(..., capture=outbox)`` passes to ``store.record``."""
        return self.on_record

    def capture_hook(self, rule: CaptureRule) -> RecordHook:
        """An ``on_record`` hook capturing with ``rule`` (instead of :attr:`rule`) and waking this outbox."""
        if not isinstance(rule, CaptureRule):
            raise ConfigurationError(f"capture_hook() takes a CaptureRule, got {type(rule).__name__}")

        def on_record(conn: apsw.Connection, new_updates: Sequence[Mapping[str, Any]]) -> None:
            if rule.write(conn, new_updates, self.store.clock()):
                self._wake.set()

        return on_record

    def record(self, updates: Sequence[Mapping[str, Any]], next_offset: int, **kwargs: Any) -> int:
        """Record a batch with its captures and the cursor in one transaction; return how many updates were new.

        Same as ``store.record(updates, next_offset, on_record=self.on_record, **kwargs)``.
        """
        return int(self.store.record(updates, next_offset, on_record=self.on_record, **kwargs))

    def enqueue(self, update: Mapping[str, Any]) -> str:
        """Capture ``update`` (whatever the rule says) and return its key; a no-op if it is already captured.

        Commits its own write transaction, or joins the caller's when called inside ``store.write()``.
        Raises :class:`InvalidUpdate` for an update without a message, and :class:`CaptureConflict`
        (nothing written) when the key exists with a different payload.
        """
        capture = build_capture(update)
        with self.store.write() as conn:
            created = _write_capture(conn, capture, self.store.clock())
        if created:
            self._wake.set()
        return capture.key

    # --- delivering ------------------------------------------------------------------------------

    def _claim(self) -> _Delivery | float | None:
        """Take the next due capture, or say when one will be due (store-clock time; ``None``: none)."""
        with self.store.write() as handle:
            conn = _db(handle)
            now = self.store.clock()
            reason = f"delivery attempt lease lapsed with all {self.max_attempts} attempts spent"
            for key, update_id, chat_id, attempts in conn.execute(
                _FAIL_LAPSED, (reason, now, now, self.max_attempts)
            ).fetchall():
                log.error(
                    "capture failed: attempts spent",
                    extra={"key": key, "update_id": update_id, "chat_id": chat_id, "attempt": attempts},
                )
            recovered = True
            row = conn.execute(_NEXT_LAPSED, (now,)).fetchone()
            if row is None:
                recovered = False
                row = conn.execute(_NEXT_DUE, (now,)).fetchone()
            if row is None:
                due = conn.execute(_EARLIEST_DUE).fetchone()[0]
                lease = conn.execute(_EARLIEST_LEASE).fetchone()[0]
                times = [t for t in (due, lease) if t is not None]
                return min(times) if times else None
            key = row[0]
            update_id, chat_id, attempt, claim_id, payload = conn.execute(
                _TAKE, (now + self.lease, now, key)
            ).fetchone()
        delivery = _Delivery(key, update_id, chat_id, attempt, claim_id, payload, recovered)
        if recovered:
            log.warning("capture lease lapsed; delivering again", extra=delivery.fields())
        return delivery

    def _post(self, delivery: _Delivery) -> _Answer:
        target = self._target
        connection: http.client.HTTPConnection
        if target.scheme == "https":
            connection = http.client.HTTPSConnection(
                target.host, target.port, timeout=self.timeout, context=ssl.create_default_context()
            )
        else:
            connection = http.client.HTTPConnection(target.host, target.port, timeout=self.timeout)
        headers = {
            **self._headers,
            "Content-Type": "application/json; charset=utf-8",
            "Idempotency-Key": delivery.key,
            "X-Capture-Attempt": str(delivery.attempt),
            "User-Agent": _USER_AGENT,
            "Connection": "close",
        }
        try:
            connection.request("POST", target.target, body=delivery.payload.encode("utf-8"), headers=headers)
            response = connection.getresponse()
            body = response.read(_ANSWER_READ)
            return _Answer(
                response.status,
                response.reason,
                response.getheader("Retry-After"),
                body.decode("utf-8", "replace")[:_ANSWER_KEPT],
            )
        finally:
            connection.close()

    def _settle(self, delivery: _Delivery, answer: _Answer | None, error: str | None) -> str:
        """Record the outcome of ``delivery``; return the state it led to (or ``"stale"``)."""
        now = self.store.clock()
        verdict = "retry" if answer is None else classify_status(answer.status)
        status = None if answer is None else answer.status
        body = None if answer is None else answer.body
        if verdict == "delivered":
            with self.store.write() as handle:
                conn = _db(handle)
                conn.execute(_MARK_DELIVERED, (status, body, now, delivery.key))
                changed = conn.changes()
            if changed:
                log.info("capture delivered", extra=delivery.fields(status=status))
                return "delivered"
            log.info("capture delivered again; it was already marked delivered", extra=delivery.fields(status=status))
            return "stale"
        if answer is not None:
            error = f"HTTP {answer.status} {answer.reason}".strip()
        if verdict == "retry" and delivery.attempt < self.max_attempts:
            retry_after = None if answer is None else parse_retry_after(answer.retry_after, now)
            delay = retry_delay(delivery.attempt, initial=self._initial, maximum=self._maximum, retry_after=retry_after)
            state, due = "pending", now + delay
        else:
            if verdict == "retry":
                error = f"{error} (attempt {delivery.attempt} of {self.max_attempts}: attempts spent)"
            state, due, delay = "failed", now, None
        with self.store.write() as handle:
            conn = _db(handle)
            conn.execute(_MARK_UNDELIVERED, (state, due, status, error, body, now, delivery.key, delivery.claim_id))
            changed = conn.changes()
        if not changed:
            log.warning(
                "capture outcome discarded: the claim lapsed and the capture was taken again",
                extra=delivery.fields(status=status),
            )
            return "stale"
        if state == "pending":
            log.warning("capture not delivered; will retry", extra=delivery.fields(status=status, delay=delay))
        else:
            log.error("capture failed", extra=delivery.fields(status=status))
        return state

    def _deliver(self, delivery: _Delivery) -> str:
        try:
            answer = self._post(delivery)
        except (OSError, http.client.HTTPException) as exc:
            return self._settle(delivery, None, f"{type(exc).__name__}: {exc}".rstrip(": "))
        return self._settle(delivery, answer, None)

    def deliver_once(self) -> bool:
        """Deliver the next due capture, if any, and record the outcome; ``False`` when none was due.

        Synchronous (for tests and for applications without the thread): blocks for at most
        ``timeout`` seconds on the collector. Store errors propagate; collector errors are recorded.
        """
        claimed = self._claim()
        if not isinstance(claimed, _Delivery):
            return False
        self._deliver(claimed)
        return True

    # --- the thread ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the ``"fence-outbox"`` delivery thread. Raises ``RuntimeError`` if it is running."""
        with self._thread_lock:
            if self._thread is not None and self._thread.is_alive():
                raise RuntimeError("the outbox delivery thread is already running")
            self._stop.clear()
            self._wake.set()  # look at once: captures may be waiting from an earlier run
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Ask the delivery thread to end; returns at once. An in-flight POST is finished first."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the delivery thread to end; ``True`` when it has (or never ran)."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    @property
    def running(self) -> bool:
        """Whether the delivery thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def __enter__(self) -> Outbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join()

    def wake(self) -> None:
        """Make the idle delivery thread look for due captures now (e.g. after another process wrote some)."""
        self._wake.set()

    def _run(self) -> None:
        log.info("outbox delivery started", extra={"collector": self._target.safe})
        failures = 0
        while not self._stop.is_set():
            self._wake.clear()
            try:
                claimed = self._claim()
                if isinstance(claimed, _Delivery):
                    self._deliver(claimed)
                    failures = 0
                    continue
                failures = 0
                wait = self.recheck if claimed is None else min(self.recheck, max(0.0, claimed - self.store.clock()))
            except Exception:
                failures += 1
                wait = min(self.recheck, retry_delay(failures, initial=self._initial, maximum=self._maximum))
                log.exception("outbox delivery step failed; trying again", extra={"delay": wait})
            if wait > 0:
                self._wake.wait(wait)
        log.info("outbox delivery stopped", extra={"collector": self._target.safe})

    # --- inspection ------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """See :func:`outbox_stats`; also ``"running"``: whether the delivery thread is alive."""
        return {**outbox_stats(self.store), "running": self.running}

    def requeue_failed(self, keys: Iterable[str] | None = None) -> int:
        """See :func:`requeue_failed`; wakes the delivery thread when something was re-queued."""
        count = requeue_failed(self.store, keys)
        if count:
            self._wake.set()
        return count

    def prune(self, delivered_before: float) -> int:
        """Delete delivered captures last changed before ``delivered_before``; return how many.

        Never deletes a pending, delivering or failed capture.
        """
        with self.store.write() as handle:
            conn = _db(handle)
            conn.execute(_PRUNE, (delivered_before,))
            return int(conn.changes())
