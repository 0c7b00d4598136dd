"""``WebhookIntake``: the WSGI application that receives Telegram's webhook deliveries durably.

Telegram retries a delivery until it gets a 2xx, so the only safe answer is "200 after the update is on
disk". Every request is checked (secret, method, size, JSON) on its own thread, then recorded through ``record``
and answered once that returned (committed). ``record`` is the store's own, or the one a fence passes: its writer's,
so the fence's writer thread records every delivery posted before its next round in that round's one transaction
(each delivery in a savepoint of its own: one bad update fails only its own request) and answers each after the
commit.

The intake never moves the polling cursor: it records with ``next_offset=0`` (the cursor is only
ever raised, so it stays where the last poller left it). Telegram delivers up to
``max_connections`` updates at once, so a lower ``update_id`` may still be pending at Telegram
while a higher one is stored; a cursor raised past it would make a later ``getUpdates`` confirm
(and so drop) it. After switching back to polling, the poller asks from the old cursor; updates it
gets again are already stored and are not stored twice.

Imports: the standard library, ``errors``, ``updates``, ``store`` (the contract: the store is typed by its protocols)
and its ``ingress`` siblings ``webhook_body`` and ``webhook_guard`` (to check the secret).
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigurationError, InvalidUpdate
from ..store import RecordHook, UpdateStore
from ..updates import UnreadableUpdate
from .webhook_body import Rejected, decode_update, read_body
from .webhook_guard import check_secret

__all__ = ["SECRET_HEADER", "CaptureSource", "WebhookIntake"]

log = logging.getLogger("telegram_fence.webhook")

#: The WSGI environ key of Telegram's ``X-Telegram-Bot-Api-Secret-Token`` header.
SECRET_HEADER = "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN"

StartResponse = Callable[..., Any]

#: The door's progress is marked by the first commit after this many seconds without a mark (seconds): a commit
#: every few milliseconds need not write it each time.
MARK_EVERY = 1.0

_STATUS = {
    200: "200 OK",
    400: "400 Bad Request",
    401: "401 Unauthorized",
    405: "405 Method Not Allowed",
    411: "411 Length Required",
    413: "413 Content Too Large",
    500: "500 Internal Server Error",
    503: "503 Service Unavailable",
}



class _Delivery:
    """One checked update on its way to the disk, and its answer (``status``, set once it was recorded or failed)."""

    __slots__ = ("raw", "skip", "status", "update")

    def __init__(self, update: dict[str, Any], raw: bytes, skip: bool) -> None:
        self.update = update
        self.raw = raw
        self.skip = skip
        self.status = 500


@runtime_checkable
class CaptureSource(Protocol):
    """What ``capture=`` may be besides a bare hook: an object that gives its record hook (an Outbox, a
    CaptureRule)."""

    @property
    def record_hook(self) -> RecordHook:
        """The hook ``(conn, new_updates)`` run in the record transaction."""
        ...


class WebhookIntake:
    """A WSGI application (PEP 3333) that stores each delivered update before answering 200.

    ``store`` is an update store (``record`` with ``skip=`` and ``on_record=``; any
    :class:`~telegram_fence.store.UpdateStore` works, ``skip``/``on_record`` are passed only when
    used; anything else is refused with :class:`ConfigurationError`); ``secret_token`` is the secret given
    to ``setWebhook`` (1-256 of A-Z a-z 0-9 _ -, else :class:`ConfigurationError`).
    ``authorize(raw_update) -> bool``: a false answer (or an exception: it fails closed) records the update as
    skipped; ``capture``: an ``on_record`` hook
    ``(conn, new_updates)`` or a :class:`CaptureSource` (``record_hook``: an Outbox, a CaptureRule), run in
    the record transaction and never given skipped updates. ``record``: the function that records a
    delivery, with ``store.record``'s signature and promise (committed when it returns; default
    ``store.record``): a fence passes its writer's, so its writer thread commits the deliveries.
    ``accepts_body``: whether ``record`` takes the raw bodies (``body=``, see
    :class:`~telegram_fence.store.UpdateStore`); ``None`` (the default) asks the store once, here
    (a fence passes what it found at assembly).
    ``on_commit(updates)`` is called
    after each commit with the updates it stored, skipped ones left out (the fence wakes its
    dispatcher there); an exception from it is logged. ``on_refused(query_string)`` is called for each
    request answered 401 (a missing or wrong secret) with its URL's query string, before the answer (the
    fence's webhook watch looks for its tag there: Telegram's own deliveries refused mean the secret was
    swapped); an exception from it is logged.

    Answers: 405 (with ``Allow: POST``) for any method but POST, 401 for a missing or wrong
    secret, 413 for a body above ``max_body`` (never reading more than ``max_body`` + 1 bytes),
    400 for a ``Content-Length`` that is not a plain decimal of at most 19 ASCII digits or longer than the
    body, 400 for a body that is not a JSON object with a non-negative integer ``update_id``, 200 once
    the update is committed (also for an ``update_id`` already stored: it is stored once), 500
    when the store failed (Telegram delivers it again), 503 after :meth:`close`. Nothing is
    stored for any answer but 200. ``observe(path)``: a GET or HEAD whose path it answers (a
    ``(status, content type, body)``, not ``None``) gets that answer instead of 405, with no secret
    asked: the fence's ``/metrics``, ``/livez`` and ``/readyz`` beside the intake.

    Thread safety: one instance serves any number of concurrent requests (a threaded WSGI server); it starts no
    thread of its own.
    """

    def __init__(
        self,
        store: UpdateStore,
        secret_token: str,
        *,
        max_body: int = 1_048_576,
        authorize: Callable[[Mapping[str, Any]], bool] | None = None,
        capture: RecordHook | CaptureSource | None = None,
        on_commit: Callable[[Sequence[Mapping[str, Any]]], None] | None = None,
        on_refused: Callable[[str], None] | None = None,
        observe: Callable[[str], tuple[int, str, bytes] | None] | None = None,
        record: Callable[..., int] | None = None,
        accepts_body: bool | None = None,
    ) -> None:
        if not isinstance(store, UpdateStore):
            raise ConfigurationError(f"{type(store).__name__} is not an update store (record, next_offset, claim, "
                                     "renew, settle, prune); pass one")
        if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
            raise ConfigurationError(f"max_body={max_body!r} must be a positive number of bytes")
        hook = capture.record_hook if isinstance(capture, CaptureSource) else capture
        if hook is not None and not callable(hook):
            raise ConfigurationError("capture must be an Outbox, a CaptureRule or a hook fn(conn, new_updates)")
        self.store = store
        self._record_fn: Callable[..., int] = store.record if record is None else record
        self._secret = check_secret(secret_token).encode("ascii")
        self.max_body = max_body
        self._authorize = authorize
        self._capture: RecordHook | None = hook
        self._on_commit = on_commit
        self._on_refused = on_refused
        self._generation: int | None = None  # the door's generation in the store: each commit is its progress
        self._marked = -MARK_EVERY  # when a commit last marked it (monotonic): at most one mark per MARK_EVERY
        self._observe = observe
        if accepts_body is None:  # the one look at the store, at construction
            accepts_body = getattr(store, "accepts_body", False) is True
        self._accepts_body = accepts_body
        self._lock = threading.Lock()  # guards the counts, the generation and the closed flag
        self._closed = False
        self._waiting = 0  # deliveries checked and not answered yet
        self._idle = threading.Condition(self._lock)  # close() waits here for them
        self._counts = {"received": 0, "stored": 0, "skipped": 0, "commits": 0, "rejected": 0, "failed": 0}
        self._last_stored: float | None = None  # monotonic time of the last stored delivery
        self._last_failed = False  # whether the last delivery the store decided on failed (answered 500)

    # --- WSGI -----------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Handle one request (PEP 3333); the body is answered only after the update is committed."""
        if self._observe is not None and environ.get("REQUEST_METHOD", "GET").upper() in ("GET", "HEAD"):
            answer = self._observe(str(environ.get("PATH_INFO", "")))  # the fence's /metrics, /livez, /readyz
            if answer is not None:
                code, content_type, data = answer
                start_response(_STATUS.get(code, f"{code} Error"),
                               [("Content-Type", content_type), ("Content-Length", str(len(data)))])
                return [b"" if environ.get("REQUEST_METHOD", "GET").upper() == "HEAD" else data]
        try:
            status = self._accept(environ)
            if status == 200:
                start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", "0")])
                return [b""]
            text = _STATUS[status]
        except Rejected as exc:
            status, text = exc.status, exc.text
            self._count("rejected")
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if status == 405:
            headers.append(("Allow", "POST"))
        body = text.encode("utf-8")
        headers.append(("Content-Length", str(len(body))))
        start_response(_STATUS[status], headers)
        return [body]

    def _accept(self, environ: Mapping[str, Any]) -> int:
        if environ.get("REQUEST_METHOD", "GET").upper() != "POST":
            raise Rejected(405, "only POST is accepted")
        given = environ.get(SECRET_HEADER, "")
        if not isinstance(given, str) or not hmac.compare_digest(given.encode("latin-1", "replace"), self._secret):
            self._refused(str(environ.get("QUERY_STRING") or ""))
            raise Rejected(401, "missing or wrong secret token")
        if self._closed:
            raise Rejected(503, "the intake is closed")
        body = self._read_body(environ)
        try:
            update = decode_update(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise Rejected(400, f"not an update: {exc}"[:200]) from None
        return self._submit(_Delivery(update, body, not self._allowed(update)))

    def _submit(self, delivery: _Delivery) -> int:
        """Record ``delivery`` and return its status once the transaction holding it ended; 503 after :meth:`close`."""
        with self._lock:
            if self._closed:
                raise Rejected(503, "the intake is closed")
            self._counts["received"] += 1
            self._waiting += 1
        try:
            updates, kwargs = self._prepare(delivery)
            self._record_fn(updates, 0, **kwargs)
        except Exception as exc:
            self._failed(delivery, exc)
        else:
            self._stored(delivery)
        finally:
            with self._lock:
                self._waiting -= 1
                if self._waiting == 0:
                    self._idle.notify_all()
        return delivery.status

    def _refused(self, query: str) -> None:
        if self._on_refused is None:
            return
        try:
            self._on_refused(query)
        except Exception:
            log.error("on_refused raised", exc_info=True)

    def _read_body(self, environ: Mapping[str, Any]) -> bytes:
        """The request body, up to ``max_body`` bytes; 413 above it, 400 for a bad Content-Length."""
        return read_body(environ, self.max_body)

    def _allowed(self, update: Mapping[str, Any]) -> bool:
        if self._authorize is None or isinstance(update, UnreadableUpdate):
            return True  # an unreadable update is kept as an exhaustion: never handled, whatever authorize says
        try:
            return bool(self._authorize(update))
        except Exception as exc:
            # Fail closed: an authorisation check that breaks must not let an update through.
            log.error("authorize() raised; the update is skipped",
                      extra={"update_id": update.get("update_id"), "err": exc})
            return False

    # --- what a commit writes (the group commit's calls) ----------------------------------------

    def _failed(self, delivery: _Delivery, exc: Exception) -> None:
        delivery.status = 400 if isinstance(exc, InvalidUpdate) else 500
        with self._lock:
            self._counts["failed"] += 1
            self._last_failed = delivery.status == 500 or self._last_failed
        log.error("recording a delivered update failed; Telegram will deliver it again",
                  extra={"update_id": delivery.update["update_id"], "err": exc})

    def _prepare(self, delivery: _Delivery) -> tuple[list[Mapping[str, Any]], dict[str, Any]]:
        """The updates and the keywords of the ``record`` call storing ``delivery``."""
        kwargs: dict[str, Any] = {}
        skip = {delivery.update["update_id"]} if delivery.skip else set()
        if skip:
            kwargs["skip"] = skip
        if self._capture is not None:
            kwargs["on_record"] = self._captured(skip)
        with self._lock:
            generation = self._generation
            now = time.monotonic()
            if generation is not None and now - self._marked >= MARK_EVERY:  # a commit is the door's progress
                self._marked = now
                kwargs["generation"] = generation
        if self._accepts_body:  # the payload as it came, read by the store without encoding it again
            kwargs["body"] = b'{"ok":true,"result":[' + delivery.raw + b"]}"
        return [delivery.update], kwargs

    def _stored(self, delivery: _Delivery) -> None:
        """``delivery`` committed: it answers 200; counted; ``on_commit`` told."""
        delivery.status = 200
        with self._lock:
            counts = self._counts
            counts["commits"] += 1
            counts["stored"] += 1
            counts["skipped"] += int(delivery.skip)
            self._last_stored = time.monotonic()
            self._last_failed = False
        if self._on_commit is not None and not delivery.skip:
            try:
                self._on_commit([delivery.update])
            except Exception:
                log.error("on_commit raised", exc_info=True)

    def _captured(self, skip: set[int]) -> RecordHook:
        """The capture hook, never given a skipped update."""
        capture = self._capture
        assert capture is not None

        def on_record(conn: Any, new_updates: Sequence[Mapping[str, Any]]) -> None:
            wanted = [u for u in new_updates if u["update_id"] not in skip] if skip else list(new_updates)
            if wanted:
                capture(conn, wanted)

        return on_record

    # --- lifecycle and observation --------------------------------------------------------------

    def close(self, timeout: float | None = 10.0) -> bool:
        """Answer 503 to every later request (Telegram delivers those again); the requests already checked are
        still recorded and answered. Waits up to ``timeout`` seconds for them; returns whether all were answered.
        Safe from any thread; idempotent."""
        with self._lock:
            self._closed = True
            return self._idle.wait_for(lambda: self._waiting == 0, timeout)

    def mark_progress_of(self, generation: int) -> None:
        """Mark ``generation`` (one the store began for this door) as progressing in later commits' transactions
        (``store.record(..., generation=)``; the first commit after :data:`MARK_EVERY` seconds without a mark, so the
        mark is at most that much older than the last commit): ``telegram-fence status`` then sees deliveries as the
        door's progress. Safe from any thread."""
        with self._lock:
            self._generation = generation

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    def stats(self) -> dict[str, Any]:
        """Counters: ``received`` (checked updates), ``stored`` (answered 200, duplicates included),
        ``skipped`` (of those, unauthorised), ``commits``, ``rejected`` (answered 4xx/503 before storing),
        ``failed`` (answered 500 or 400 by the store); ``waiting``: deliveries being recorded now; ``closed`` (1
        after :meth:`close`);
        ``last_stored_age``: seconds since a delivery was last stored (``None`` before the first);
        ``last_failed``: 1 when the last delivery the store decided on could not be stored (500)."""
        with self._lock:
            age = None if self._last_stored is None else time.monotonic() - self._last_stored
            counts, closed = dict(self._counts), int(self._closed)
            waiting = self._waiting
        return {**counts, "waiting": waiting, "closed": closed,
                "last_stored_age": age, "last_failed": int(self._last_failed)}
