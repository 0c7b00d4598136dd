"""The :class:`Outbox`: the named thread that claims each capture under a lease and delivers it to the collector."""

from __future__ import annotations

import http.client
import logging
import math
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError
from ...store.values import check_max_attempts
from .capture import CaptureRule, _write_capture, build_capture
from .collector import Answer, check_collector_url, classify_status, parse_retry_after, post, retry_delay
from .queries import EARLIEST_DUE, OutboxWrites, outbox_stats, prune_delivered, requeue_failed, rows

if TYPE_CHECKING:
    import apsw

log = logging.getLogger("telegram_fence.outbox.sender")

THREAD_NAME = "fence-outbox"

_FAIL_LAPSED = (
    "UPDATE fence_outbox SET state = 'failed', lease_until = NULL, claim_id = NULL, last_error = ?, changed_at = ? "
    "WHERE state = 'delivering' AND lease_until <= ? AND attempts >= ? RETURNING key, update_id, chat_id, attempts"
)
_NEXT_LAPSED = ("SELECT key FROM fence_outbox WHERE state = 'delivering' AND lease_until <= ? ORDER BY lease_until "
                "LIMIT 1")
_NEXT_DUE = "SELECT key FROM fence_outbox WHERE state = 'pending' AND due_at <= ? ORDER BY due_at, update_id LIMIT 1"
_TAKE = (
    "UPDATE fence_outbox SET state = 'delivering', attempts = attempts + 1, claim_id = ?, lease_until = ?, "
    "changed_at = ? WHERE key = ? RETURNING update_id, chat_id, attempts, claim_id, payload"
)
_EARLIEST_LEASE = "SELECT min(lease_until) FROM fence_outbox WHERE state = 'delivering'"
# Any accepted answer is the fact that matters, even from a claim whose lease lapsed meanwhile.
_MARK_DELIVERED = (
    "UPDATE fence_outbox SET state = 'delivered', lease_until = NULL, claim_id = NULL, last_status = ?, answer = ?, "
    "last_error = NULL, changed_at = ? WHERE key = ? AND state != 'delivered' RETURNING key"
)
# A failure only counts for the claim that is still current.
_MARK_UNDELIVERED = (
    "UPDATE fence_outbox SET state = ?, due_at = ?, lease_until = NULL, claim_id = NULL, last_status = ?, "
    "last_error = ?, answer = ?, changed_at = ? WHERE key = ? AND claim_id = ? AND state = 'delivering' RETURNING key"
)


@dataclass(frozen=True, slots=True)
class _Delivery:
    key: str
    update_id: int
    chat_id: int | None
    attempt: int
    claim_id: str
    payload: str = field(repr=False)

    def fields(self, **more: Any) -> dict[str, Any]:
        return {"key": self.key, "update_id": self.update_id, "chat_id": self.chat_id, "attempt": self.attempt, **more}


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name}={value!r} must be a positive, finite number of seconds")
    return float(value)


class Outbox:
    """Captures in the store's file and the thread that delivers them to one HTTP collector, at least once. ``rule``
    decides what :meth:`record_hook` captures (``None``: only :meth:`enqueue`). After ``max_attempts`` deliveries
    without a 2xx a capture is failed; one not ended ``lease`` seconds after it started is delivered again. ``headers``
    go with every POST, never logged; ``recheck`` bounds the idle wait for captures written by another process.
    Construction touches no network and raises :class:`ConfigurationError` naming a bad setting. Thread-safe."""

    def __init__(self, store: OutboxWrites, collector_url: str, *, rule: CaptureRule | None = None,
                 allow_remote: bool = False, max_attempts: int = 1000, lease: float = 60.0, timeout: float = 10.0,
                 backoff: tuple[float, float] = (1.0, 300.0), headers: Mapping[str, str] | None = None,
                 recheck: float = 30.0) -> None:
        if not callable(getattr(store, "write", None)) or not callable(getattr(store, "clock", None)):
            raise ConfigurationError(f"Outbox needs a SqliteUpdateStore or PostgresUpdateStore (with write() and "
                                     f"clock); got {type(store).__name__}")
        if rule is not None and not isinstance(rule, CaptureRule):
            raise ConfigurationError(f"rule={rule!r} must be a CaptureRule or None")
        if not isinstance(allow_remote, bool):
            raise ConfigurationError(f"allow_remote={allow_remote!r} must be True or False")
        self._target = check_collector_url(collector_url, allow_remote=allow_remote)
        check_max_attempts(max_attempts)  # (compared in the store's statements: a column's bound)
        self.lease = _positive("lease", lease)
        self.timeout = _positive("timeout", timeout)
        if self.lease <= self.timeout:
            raise ConfigurationError(f"lease={lease!r} must be longer than timeout={timeout!r}, or a slow delivery "
                                     "would be taken for an abandoned one and sent again")
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
        self.max_attempts, self.rule, self.store = max_attempts, rule, store
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()

    def record_hook(self, conn: apsw.Connection, new_updates: Sequence[Mapping[str, Any]]) -> None:
        """The ``on_record`` hook for ``store.record`` (what ``Fence(..., capture=outbox)`` passes): capture
        ``new_updates`` matching :attr:`rule`, inside the record transaction, and wake the delivery thread. Raises
        :class:`CaptureConflict` (the record rolls back) on a key reused with another payload,
        :class:`ConfigurationError` without a rule."""
        if self.rule is None:
            raise ConfigurationError("this Outbox has no rule=CaptureRule(...); it cannot be used as a record hook")
        if self.rule.write(conn, new_updates, self.store.clock()):
            self._wake.set()

    def enqueue(self, update: Mapping[str, Any]) -> str:
        """Capture ``update`` (whatever the rule says) and return its key; a no-op if it is already captured. Joins the
        caller's ``store.write()`` transaction if any. Raises :class:`InvalidUpdate` for an update without a message,
        :class:`CaptureConflict` (nothing written) when the key exists with another payload."""
        capture = build_capture(update)
        with self.store.write() as handle:
            created = _write_capture(handle, capture, self.store.clock())
        if created:
            self._wake.set()
        return capture.key

    def _claim(self) -> _Delivery | float | None:
        """Take the next due capture, or say when one will be due (store-clock time; ``None``: none)."""
        with self.store.write() as conn:
            now = self.store.clock()
            reason = f"delivery attempt lease lapsed with all {self.max_attempts} attempts spent"
            for key, update_id, chat_id, attempts in rows(conn, _FAIL_LAPSED, (reason, now, now, self.max_attempts)):
                log.error("capture failed: attempts spent",
                          extra={"key": key, "update_id": update_id, "chat_id": chat_id, "attempt": attempts})
            found = rows(conn, _NEXT_LAPSED, (now,))
            recovered = bool(found)
            found = found or rows(conn, _NEXT_DUE, (now,))
            if not found:
                times = [t for ((t,),) in (rows(conn, EARLIEST_DUE), rows(conn, _EARLIEST_LEASE)) if t is not None]
                return min(times) if times else None
            key = found[0][0]
            ((*taken,),) = rows(conn, _TAKE, (secrets.token_hex(12), now + self.lease, now, key))
            delivery = _Delivery(key, *taken)
        if recovered:
            log.warning("capture lease lapsed; delivering again", extra=delivery.fields())
        return delivery

    def _settle(self, delivery: _Delivery, answer: Answer | None, error: str | None) -> str:
        """Record the outcome of ``delivery``; return the state it led to (or ``"stale"``)."""
        now = self.store.clock()
        verdict = "retry" if answer is None else classify_status(answer.status)
        status = None if answer is None else answer.status
        body = None if answer is None else answer.body
        if verdict == "delivered":
            with self.store.write() as conn:
                changed = rows(conn, _MARK_DELIVERED, (status, body, now, delivery.key))
            if changed:
                log.info("capture delivered", extra=delivery.fields(status=status))
                return "delivered"
            log.info("capture delivered again; it was already marked delivered", extra=delivery.fields(status=status))
            return "stale"
        if answer is not None:
            error = f"HTTP {answer.status} {answer.reason}".strip()
        if verdict == "retry" and delivery.attempt < self.max_attempts:
            retry_after = None if answer is None else parse_retry_after(answer.retry_after)
            delay = retry_delay(delivery.attempt, initial=self._initial, maximum=self._maximum, retry_after=retry_after)
            state, due = "pending", now + delay
        else:
            if verdict == "retry":
                error = f"{error} (attempt {delivery.attempt} of {self.max_attempts}: attempts spent)"
            state, due, delay = "failed", now, None
        with self.store.write() as conn:
            changed = rows(conn, _MARK_UNDELIVERED, (state, due, status, error, body, now, delivery.key,
                                                     delivery.claim_id))
        if not changed:
            log.warning("capture outcome discarded: the claim lapsed and the capture was taken again",
                        extra=delivery.fields(status=status))
            return "stale"
        if state == "pending":
            log.warning("capture not delivered (%s); will retry in %.3g s", error, delay,
                        extra=delivery.fields(status=status, delay=delay, error=error))
        else:
            log.error("capture failed (%s)", error, extra=delivery.fields(status=status, error=error))
        return state

    def _deliver(self, delivery: _Delivery) -> str:
        try:
            answer = post(self._target, delivery.payload, key=delivery.key, attempt=delivery.attempt,
                          headers=self._headers, timeout=self.timeout)
        except (OSError, http.client.HTTPException) as exc:
            return self._settle(delivery, None, f"{type(exc).__name__}: {exc}".rstrip(": "))
        return self._settle(delivery, answer, None)

    def deliver_once(self) -> bool:
        """Deliver the next due capture, if any, and record the outcome; ``False`` when none was due. Store errors
        propagate; collector errors are recorded."""
        claimed = self._claim()
        if not isinstance(claimed, _Delivery):
            return False
        self._deliver(claimed)
        return True

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
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    @property
    def running(self) -> bool:
        """Whether the delivery thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _run(self) -> None:
        log.info("outbox delivery started", extra={"collector": self._target.safe})
        failures = 0
        while not self._stop.is_set():
            self._wake.clear()
            try:
                claimed = self._claim()
                failures = 0
                if isinstance(claimed, _Delivery):
                    self._deliver(claimed)
                    continue
                wait = self.recheck if claimed is None else min(self.recheck, max(0.0, claimed - self.store.clock()))
            except Exception:
                failures += 1
                wait = min(self.recheck, retry_delay(failures, initial=self._initial, maximum=self._maximum))
                log.exception("outbox delivery step failed; trying again", extra={"delay": wait})
            if wait > 0:
                self._wake.wait(wait)
        log.info("outbox delivery stopped", extra={"collector": self._target.safe})

    def stats(self) -> dict[str, Any]:
        """See :func:`outbox_stats`; also ``"running"``: whether the delivery thread is alive."""
        return {**outbox_stats(self.store), "running": self.running}

    def requeue_failed(self, keys: Iterable[str] | None = None) -> int:
        """See :func:`requeue_failed`; wakes the delivery thread when something was re-queued."""
        count = len(requeue_failed(self.store, keys))
        if count:
            self._wake.set()
        return count

    def prune(self, delivered_before: float) -> int:
        """See :func:`prune_delivered`."""
        return prune_delivered(self.store, delivered_before)
