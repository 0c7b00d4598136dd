"""The capture outbox: every authorised message reaches an HTTP collector, at least once (see docs/outbox.md).

A capture is written in the same transaction as the update it captures (through ``store.record``'s
``on_record`` hook) and POSTed by the ``fence-outbox`` thread until the collector answers 2xx. Logs go to
``telegram_fence.outbox.*`` and never carry the captured text or the collector's answer."""

from __future__ import annotations

from .capture import CaptureRule, build_capture, capture_key
from .collector import check_collector_url, classify_status, parse_retry_after, retry_delay
from .queries import prune_delivered
from .sender import THREAD_NAME, Outbox

__all__ = [
    "THREAD_NAME", "CaptureRule", "Outbox", "build_capture", "capture_key", "check_collector_url", "classify_status",
    "parse_retry_after", "prune_delivered", "retry_delay",
]
