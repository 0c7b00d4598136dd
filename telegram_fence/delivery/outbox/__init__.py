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

Logging goes to the loggers under ``telegram_fence.outbox`` (one per module: ``.capture``, ``.sender``,
``.queries``) with fixed messages and the extra
fields ``key``, ``update_id``, ``chat_id``, ``attempt`` (and ``status``, ``delay`` where they apply).
The captured text and the collector's answer are never logged.

The package: :mod:`.capture` (what is captured, keys, the insert), :mod:`.collector` (URL checks, one POST,
decisions about answers), :mod:`.sender` (the :class:`Outbox` thread), :mod:`.queries` (operator queries, pruning).
"""

from __future__ import annotations

from .capture import MESSAGE_KINDS, Capture, CaptureRule, RecordHook, build_capture, capture_key
from .collector import CollectorTarget, check_collector_url, classify_status, parse_retry_after, retry_delay
from .queries import STATES, failed_captures, outbox_stats, prune_delivered, requeue_failed
from .sender import THREAD_NAME, Outbox

__all__ = [
    "MESSAGE_KINDS",
    "STATES",
    "THREAD_NAME",
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
    "prune_delivered",
    "requeue_failed",
    "retry_delay",
]
