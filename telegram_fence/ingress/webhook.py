"""``WebhookIntake``: the WSGI application that receives Telegram's webhook deliveries durably, each answered after
the commit that holds it.

Telegram retries a delivery until it gets a 2xx, so it is answered 200 only once recorded. It records with
``next_offset=0``: Telegram delivers up to ``max_connections`` updates at once, so a cursor raised past a stored id
could confirm a lower one still pending when the bot polls again. :class:`~telegram_fence.http_serving.WsgiServer`
serves it for ``run_webhook``."""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from ..errors import ConfigurationError, InvalidUpdate
from ..http_serving import WsgiServer
from ..store import RecordHook, UpdateStore
from ..updates import UnreadableUpdate
from .long_poll import unreadable_update
from .poller import unauthorized
from .webhook_guard import check_secret

__all__ = ["SECRET_HEADER", "Rejected", "WebhookIntake", "WsgiServer", "decode_update", "read_body"]

log = logging.getLogger("telegram_fence.webhook")

#: The WSGI environ key of Telegram's ``X-Telegram-Bot-Api-Secret-Token`` header.
SECRET_HEADER = "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN"

#: A commit marks the door's progress at most once per this many seconds.
MARK_EVERY = 1.0

_READ_CHUNK = 65536
_MAX_LENGTH_DIGITS = 19  # far above any max_body, and below int()'s digit limit


class Rejected(Exception):
    """``Rejected(status, text)``: a request answered with ``status`` before anything was stored."""


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constants)  # made once: json.loads(parse_constant=) makes one per call


def decode_update(body: bytes) -> dict[str, Any]:
    """The update in ``body``: a JSON object with a non-negative integer ``update_id``. One nesting deeper than
    Python's reader goes is an :class:`~telegram_fence.updates.UnreadableUpdate` (stored as an exhaustion: a 400
    would have Telegram send it forever). Raises ``ValueError`` for anything else (not UTF-8 or JSON, ``NaN``)."""
    text = body.decode("utf-8")
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        value = unreadable_update(text)
        if value is None:
            raise ValueError("the update nests too deep to be read and has no readable update_id") from None
    if type(value) is not dict and not isinstance(value, UnreadableUpdate):
        raise ValueError("the body is not a JSON object")
    update_id = value.get("update_id")
    if type(update_id) is not int or update_id < 0:
        raise ValueError("the update has no non-negative integer update_id")
    return value


def read_body(environ: Mapping[str, Any], max_body: int) -> bytes:
    """The body of a WSGI request, never reading more than ``max_body`` + 1 bytes. :class:`Rejected`: 413 above
    ``max_body``; 400 for a ``Content-Length`` that is not at most 19 ASCII digits, or a body that stopped short."""
    declared = str(environ.get("CONTENT_LENGTH") or "").strip()
    if not declared:  # a chunked body, decoded by the server: read to its end, up to the limit
        length, limit = None, max_body + 1
    elif not (declared.isascii() and declared.isdigit()) or len(declared) > _MAX_LENGTH_DIGITS:
        raise Rejected(400, "bad Content-Length: not a plain decimal number of bytes")
    else:
        length = limit = int(declared)
        if length > max_body:
            raise Rejected(413, f"body above {max_body} bytes")
    stream = environ.get("wsgi.input")
    chunks: list[bytes] = []
    left = limit
    try:
        while left > 0 and stream is not None:
            chunk = stream.read(min(left, _READ_CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:  # the server's bound on the request ran out, the connection reset: the client's doing
        raise Rejected(400, f"the body did not arrive whole: {type(exc).__name__}") from None
    body = b"".join(chunks)
    if len(body) > max_body:
        raise Rejected(413, f"body above {max_body} bytes")
    if length is not None and len(body) < length:
        raise Rejected(400, "body shorter than its Content-Length")
    return body


class WebhookIntake:
    """A WSGI application (PEP 3333) that stores each delivered update before answering 200; its parameters and answers
    are in docs/api.md. ``record`` is what records a delivery, committed when it returns (a fence passes its writer's);
    ``on_commit(updates)`` is told after each commit (skipped ones left out; its exceptions are logged). Serves any
    number of concurrent requests; starts no thread."""

    def __init__(self, store: UpdateStore, secret_token: str, *, max_body: int = 1_048_576,
                 authorize: Callable[[Mapping[str, Any]], bool] | None = None,
                 capture: object = None,
                 on_commit: Callable[[Sequence[Mapping[str, Any]]], None] | None = None,
                 observe: Callable[[str], tuple[int, str, bytes] | None] | None = None,
                 record: Callable[..., int] | None = None) -> None:
        if not isinstance(store, UpdateStore):
            raise ConfigurationError(f"{type(store).__name__} is not an update store (record, next_offset, claim, "
                                     "renew, settle, prune); pass one")
        if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
            raise ConfigurationError(f"max_body={max_body!r} must be a positive number of bytes")
        hook = getattr(capture, "record_hook", capture)  # an Outbox or a CaptureRule gives its hook
        if hook is not None and not callable(hook):
            raise ConfigurationError("capture must be an Outbox, a CaptureRule or a hook fn(conn, new_updates)")
        self.store, self.max_body = store, max_body
        self._record_fn: Callable[..., int] = store.record if record is None else record
        self._secret = check_secret(secret_token).encode("ascii")
        self._authorize, self._on_commit, self._observe = authorize, on_commit, observe
        self._capture: RecordHook | None = hook
        self._generation: int | None = None  # the door's generation in the store: each commit is its progress
        self._marked = -MARK_EVERY  # when a commit last marked it (monotonic)
        self._lock = threading.Lock()  # guards the counts, the generation and the closed flag
        self._idle = threading.Condition(self._lock)  # close() waits here for the deliveries in hand
        self._closed = False
        self._waiting = 0
        self._counts = {"stored": 0, "skipped": 0, "rejected": 0, "failed": 0}
        self._last_stored: float | None = None  # monotonic time of the last stored delivery
        self._last_failed = False  # whether the last delivery the store decided on failed (answered 500)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """Handle one request (PEP 3333); a delivery is answered only after it was committed."""
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        answer = None
        if self._observe is not None and method in ("GET", "HEAD"):
            answer = self._observe(str(environ.get("PATH_INFO", "")))  # the fence's /metrics, /livez, /readyz
        if answer is None:
            try:
                status = self._accept(environ, method)
                text = "" if status == 200 else HTTPStatus(status).phrase
            except Rejected as exc:
                status, text = exc.args
                with self._lock:
                    self._counts["rejected"] += 1
            answer = (status, "text/plain; charset=utf-8", text.encode("utf-8"))
        status, content_type, data = answer
        headers = [("Content-Type", content_type), ("Content-Length", str(len(data)))]
        if status == 405:
            headers.append(("Allow", "POST"))
        start_response(f"{status} {HTTPStatus(status).phrase}", headers)
        return [b"" if method == "HEAD" else data]

    def _accept(self, environ: Mapping[str, Any], method: str) -> int:
        if method != "POST":
            raise Rejected(405, "only POST is accepted")
        given = environ.get(SECRET_HEADER, "")
        if not isinstance(given, str) or not hmac.compare_digest(given.encode("latin-1", "replace"), self._secret):
            raise Rejected(401, "missing or wrong secret token")
        if self._closed:
            raise Rejected(503, "the intake is closed")
        body = read_body(environ, self.max_body)
        try:
            update = decode_update(body)
        except (ValueError, RecursionError) as exc:
            raise Rejected(400, f"not an update: {exc}"[:200]) from None
        return self._submit(update, body)

    def _submit(self, update: dict[str, Any], body: bytes) -> int:
        """Record ``update`` and return its status once the transaction holding it ended."""
        skipped = unauthorized([update], self._authorize)
        skip = bool(skipped)
        generation = None
        with self._lock:
            if self._closed:
                raise Rejected(503, "the intake is closed")
            self._waiting += 1
            if self._generation is not None and time.monotonic() - self._marked >= MARK_EVERY:
                self._marked, generation = time.monotonic(), self._generation
        try:  # the body as it came: the store need not encode it again
            self._record_fn([update], 0, skip=skipped, on_record=None if skip else self._capture, generation=generation,
                            body=b'{"ok":true,"result":[' + body + b"]}")
        except Exception as exc:
            status = 400 if isinstance(exc, InvalidUpdate) else 500
            log.error("recording a delivered update failed; Telegram will deliver it again",
                      extra={"update_id": update["update_id"], "err": exc})
        else:
            status = 200
        with self._lock:
            self._waiting -= 1
            if self._waiting == 0:
                self._idle.notify_all()
            if status == 200:
                self._counts["stored"] += 1
                self._counts["skipped"] += int(skip)
                self._last_stored = time.monotonic()
                self._last_failed = False
            else:
                self._counts["failed"] += 1
                self._last_failed = status == 500 or self._last_failed
        if status == 200 and not skip and self._on_commit is not None:
            try:
                self._on_commit([update])
            except Exception:
                log.error("on_commit raised", exc_info=True)
        return status

    def close(self, timeout: float | None = 10.0) -> bool:
        """Answer 503 to every later request; the deliveries in hand are still recorded and answered. Returns
        whether all were answered within ``timeout`` seconds. Safe from any thread; idempotent."""
        with self._lock:
            self._closed = True
            return self._idle.wait_for(lambda: self._waiting == 0, timeout)

    def mark_progress_of(self, generation: int) -> None:
        """Mark ``generation`` (the door's, begun in the store) as progressing in later commits (``record(...,
        generation=)``, at most once per :data:`MARK_EVERY` seconds). Safe from any thread."""
        with self._lock:
            self._generation = generation

    def stats(self) -> dict[str, Any]:
        """Counters: ``stored`` (answered 200, duplicates included), ``skipped`` (of those,
        unauthorised), ``rejected`` (4xx/503 before storing), ``failed`` (500 or 400 from the store);
        ``waiting`` (being recorded now), ``closed``, ``last_stored_age`` (seconds, ``None`` before the first) and
        ``last_failed`` (1 when the last delivery the store decided on answered 500)."""
        with self._lock:
            age = None if self._last_stored is None else time.monotonic() - self._last_stored
            return {**self._counts, "waiting": self._waiting, "closed": int(self._closed),
                    "last_stored_age": age, "last_failed": int(self._last_failed)}
