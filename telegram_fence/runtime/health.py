"""Liveness, readiness and the Prometheus figures of a running fence, as plain functions of its ``stats()``
snapshot, the bounded write check of the store that readiness rests on, and ``HealthService``, which answers
``GET /metrics``, ``/livez`` and ``/readyz`` with them (the server of ``metrics=`` loads only when one is given).

- **live**: started, not ended on its own, and every thread it runs alive (a supervisor restarts a fence that is
  not live).
- **ready**: live, not stopping, the store can take a write now (:func:`check_write`, without writing), and the
  door in use makes progress: the poller answered within ``max_progress_age`` and is not paused, or the webhook
  intake is open and its last delivery was stored.

The figures are in Prometheus' text exposition format (version 0.0.4); counters (``_total``) count since this process
started the fence, gauges are read at the scrape. The list is in ``docs/operations.md`` ("Metrics and health").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..http_serving import WsgiServer

__all__ = ["CONTENT_TYPE", "PATHS", "Answer", "HealthService", "bounded_reads", "check_write", "exposition",
           "liveness", "readiness"]

log = logging.getLogger("telegram_fence.metrics")

#: The paths :class:`HealthService` answers.
PATHS = ("/metrics", "/livez", "/readyz")

#: ``(HTTP status, Content-Type, body)``
Answer = tuple[int, str, bytes]

_TEXT = "text/plain; charset=utf-8"


def bounded_reads(store: object, seconds: float) -> AbstractContextManager[None]:
    """``store.bounded(seconds)`` (within the block, this thread's reads wait at most ``seconds`` in all, else raise
    ``StoreUnavailable``), or a block that bounds nothing for a store without ``bounded``."""
    bounded = getattr(store, "bounded", None)
    return nullcontext() if bounded is None else bounded(seconds)


def check_write(store: object, timeout: float) -> str | None:
    """``None`` when ``store`` showed within ``timeout`` seconds that it takes a write now (nothing is written), else
    why not, in one line (also for a store without ``probe_writable``). Never raises."""
    probe = getattr(store, "probe_writable", None)  # fn(timeout): returns when a write would be taken now, else raises
    if probe is None:
        return f"the store {type(store).__name__} cannot be checked for writes (it has no probe_writable)"
    try:
        probe(timeout)
    except Exception as exc:
        line = " ".join(str(exc).split()) or type(exc).__name__
        return f"the store cannot take a write (checked for {timeout:.2g} s): {line[:300]}"
    return None


def liveness(stats: Mapping[str, Any], *, polling: bool) -> list[str]:
    """Why the fence whose snapshot is ``stats`` is not live, one short line each (none: it runs every thread it
    should; ``polling``: a poller among them)."""
    reasons: list[str] = []
    if stats.get("ended_reason"):
        reasons.append(f"the fence ended: {stats['ended_reason']}")
    threads = stats.get("threads") or {}
    if not threads.get("started"):
        reasons.append("the fence is not started")
        return reasons
    for name in ("dispatcher", "heartbeat"):
        if not threads.get(name):
            reasons.append(f"the {name} thread is not alive")
    if not threads.get("exhaustions"):
        reasons.append("the exhaustion delivery thread is not alive")
    poller = stats.get("poller")
    if polling and not (poller and poller.get("alive")):
        reasons.append("the poller thread is not alive")
    return reasons


def readiness(stats: Mapping[str, Any], live: list[str], *, write_error: str | None,
              max_progress_age: float) -> list[str]:
    """Why the fence does not do its work now (none: ready); ``live`` is :func:`liveness`'s answer, ``write_error``
    :func:`check_write`'s."""
    reasons = list(live)
    if stats.get("stopping"):
        reasons.append("the fence is stopping")
    if "store_error" in stats:
        reasons.append(f"the store could not be read: {stats['store_error']}")
    calls = stats.get("calls")
    if isinstance(calls, Mapping) and calls.get("journal_error"):
        reasons.append(f"the calls journal could not be read: {calls['journal_error']}")
    steps = stats.get("steps")
    if isinstance(steps, Mapping) and steps.get("stored_error"):
        reasons.append(f"the durable steps could not be read: {steps['stored_error']}")
    if write_error is not None:
        reasons.append(write_error)
    webhook = stats.get("webhook")
    poller = stats.get("poller")
    if webhook is not None:
        intake = webhook.get("intake") or {}
        if intake.get("closed"):
            reasons.append("the webhook intake is closed")
        if intake.get("last_failed"):
            reasons.append("the webhook's last delivery could not be stored (answered 500)")
    elif poller is not None:
        if poller.get("paused"):
            reasons.append("paused: the poller fetches nothing until resume()")
        else:
            age = poller.get("progress_age")
            if age is None or age > max_progress_age:
                what = "getUpdates answer" if poller.get("leading", True) else "poll leadership check"
                shown = "never" if age is None else f"{age:.0f} s ago"
                reasons.append(f"no progress at the poller: the last {what} was {shown} "
                               f"(the bound is {max_progress_age:g} s)")
    return reasons


#: The Content-Type of the text format, as Prometheus asks for it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_STATES = ("pending", "claimed", "settled", "skipped", "exhausted", "acknowledged")
#: pool counter -> (metric name, help)
_POOL_COUNTERS = (
    ("handled", "telegram_fence_updates_handled_total", "Updates whose handler returned (settled)."),
    ("retried", "telegram_fence_updates_retried_total", "Failed attempts scheduled for a retry."),
    ("exhausted", "telegram_fence_updates_exhausted_total", "Updates that failed for good (exhaustions made)."),
    ("lost", "telegram_fence_attempts_lost_total", "Attempts that lost their claim (their writes were refused)."),
    ("timeouts", "telegram_fence_handler_timeouts_total", "Handlers taken away after handler_timeout."),
)
_WEBHOOK_OUTCOMES = ("stored", "skipped", "rejected", "failed")
_CALL_OUTCOMES = ("sent", "refused", "replayed", "uncertain", "retried", "mismatched", "queued")
_STEP_OUTCOMES = ("called", "replayed", "uncertain", "repeated", "failed", "refused")
_STEP_STATES = ("intent", "done", "failed", "uncertain")


_ESCAPE = str.maketrans({"\\": "\\\\", "\n": "\\n", '"': '\\"'})  # what a label value escapes


def _labels(labels: Mapping[str, str]) -> str:
    inner = ",".join(f'{key}="{str(value).translate(_ESCAPE)}"' for key, value in labels.items())
    return "{" + inner + "}" if inner else ""


def _number(value: float | int | bool) -> str:
    """A sample's value: counts as integers, ages (finite) as Python writes floats, booleans as 1 and 0."""
    return str(int(value)) if isinstance(value, (bool, int)) else repr(float(value))


def _num(value: Any) -> float | int | None:
    """A number for a sample, or ``None`` (no sample) for anything else."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    return None


def exposition(stats: Mapping[str, Any], *, live: bool, ready: bool, workers: int, version: str) -> str:
    """The text a ``GET /metrics`` answers for the snapshot ``stats``; a part missing from it only leaves its
    metrics out. Never raises for a snapshot of the documented shape."""
    lines: list[str] = []

    def add(name: str, kind: str, help_text: str,
            samples: Iterable[tuple[Mapping[str, str], float | int | bool | None]]) -> None:
        """The family ``name``: its HELP and TYPE lines, then its samples; nothing without a sample."""
        rows = [(labels, value) for labels, value in samples if value is not None]
        if rows:
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
            lines.extend(f"{name}{_labels(labels)} {_number(value)}" for labels, value in rows)

    def one(name: str, kind: str, help_text: str, value: float | int | bool | None) -> None:
        add(name, kind, help_text, [({}, value)])

    add("telegram_fence_info", "gauge", "Always 1; the version of telegram_fence in a label.",
            [({"version": version}, 1)])
    one("telegram_fence_live", "gauge", "1 when every thread of the fence runs and it did not end (/livez).",
            live)
    one("telegram_fence_ready", "gauge",
            "1 when the store takes writes and the door in use makes progress (/readyz).", ready)
    one("telegram_fence_stopping", "gauge", "1 while the fence shuts down.", bool(stats.get("stopping")))
    one("telegram_fence_ended", "gauge", "1 when the fence ended on its own (see the log for the reason).",
            stats.get("ended_reason") is not None)

    poller = stats.get("poller") or {}
    webhook = stats.get("webhook") or {}
    intake = webhook.get("intake") or {}
    recorded = []
    if poller:
        recorded.append(({"door": "poller"}, _num(poller.get("recorded"))))
    if intake:
        stored, skipped = _num(intake.get("stored")) or 0, _num(intake.get("skipped")) or 0
        recorded.append(({"door": "webhook"}, stored - skipped))
    add("telegram_fence_updates_recorded_total", "counter",
            "Updates this process stored in the inbox, by the door they came through.", recorded)

    pool = stats.get("workers") or {}
    for key, name, help_text in _POOL_COUNTERS:
        one(name, "counter", help_text, _num(pool.get(key)))

    add("telegram_fence_updates", "gauge", "Updates in the store by state (all processes on this database).",
            [({"state": state}, _num(stats.get(state))) for state in _STATES])
    if all(_num(stats.get(state)) is not None for state in ("pending", "claimed")):
        one("telegram_fence_backlog", "gauge",
                "Updates stored and not yet done (pending or claimed, retries waiting included).",
                stats["pending"] + stats["claimed"])
    if "oldest_open_age" in stats:
        one("telegram_fence_oldest_open_age_seconds", "gauge",
                "Age of the oldest update not yet done (0 when there is none).",
                _num(stats.get("oldest_open_age")) or 0)
    calls = stats.get("calls")
    steps = stats.get("steps")
    journal_failed = (isinstance(calls, Mapping) and bool(calls.get("journal_error"))) or \
        (isinstance(steps, Mapping) and bool(steps.get("stored_error")))
    one("telegram_fence_store_answered", "gauge",
            "1 when the store answered this scrape's reads in time; 0: it did not (locked, away), and the figures "
            "read from it are missing from this answer (see /readyz for why).",
            "store_error" not in stats and not journal_failed)
    one("telegram_fence_cursor", "gauge", "The stored getUpdates offset (what Telegram may forget below).",
            _num(stats.get("cursor")))
    one("telegram_fence_schema_version", "gauge", "The store's schema version.",
            _num(stats.get("schema_version")))

    if pool:
        one("telegram_fence_workers", "gauge", "The most worker threads at once (workers=).", workers)
        one("telegram_fence_workers_alive", "gauge", "Worker threads alive now.", _num(pool.get("alive")))
        one("telegram_fence_workers_busy", "gauge", "Handlers running now.", _num(pool.get("running")))
        one("telegram_fence_leases", "gauge", "Claims this process holds now (running or queued).",
                _num(pool.get("in_flight")))

    if poller:
        one("telegram_fence_polls_total", "counter", "getUpdates calls Telegram answered.",
                _num(poller.get("polls")))
        one("telegram_fence_poller_alive", "gauge", "1 while the poller thread runs.", _num(poller.get("alive")))
        one("telegram_fence_poller_progress_age_seconds", "gauge",
                "Seconds since the poller last made progress (an answered getUpdates, or a poll leadership check "
                "while another process leads).", _num(poller.get("progress_age")))
        one("telegram_fence_poller_in_call_seconds", "gauge",
                "Seconds the getUpdates in progress has run (0 between calls).", _num(poller.get("in_call_for")) or 0)
        one("telegram_fence_poller_leading", "gauge",
                "1 when this process may poll (always on SQLite; the elected poller on PostgreSQL).",
                _num(poller.get("leading")))
        one("telegram_fence_paused", "gauge", "1 while fetching is paused (pause()).", _num(poller.get("paused")))

    if intake:
        add("telegram_fence_webhook_requests_total", "counter",
                "Webhook deliveries by outcome: stored (200), skipped (stored, unauthorised), rejected (4xx/503 "
                "before storing), failed (the store failed: 500).",
                [({"outcome": key}, _num(intake.get(key))) for key in _WEBHOOK_OUTCOMES])
        one("telegram_fence_webhook_waiting", "gauge", "Deliveries queued for the next commit.",
                _num(intake.get("waiting")))
        one("telegram_fence_webhook_progress_age_seconds", "gauge",
                "Seconds since the intake last stored a delivery (absent before the first).",
                _num(intake.get("last_stored_age")))
        one("telegram_fence_webhook_pending_updates", "gauge",
                "Telegram's pending_update_count at the last getWebhookInfo (run_webhook only).",
                _num(webhook.get("pending_update_count")))

    if isinstance(calls, Mapping):  # the journal of fenced Telegram calls (docs/calls.md)
        add("telegram_fence_calls_total", "counter",
                "Bot API calls of this process's handlers by outcome (uncertain: may have left, never resent).",
                [({"outcome": key}, _num(calls.get(key))) for key in _CALL_OUTCOMES])
        journal = calls.get("journal")
        if isinstance(journal, Mapping):
            add("telegram_fence_calls_journaled", "gauge", "Calls in the store's journal by state.",
                    [({"state": str(key)}, _num(value)) for key, value in journal.items()])
    if isinstance(steps, Mapping):  # durable steps (docs/steps.md)
        add("telegram_fence_steps_total", "counter",
                "Durable steps of this process's handlers by outcome (called: the function ran; replayed: a recorded "
                "result returned; uncertain: StepUncertain raised; repeated: an uncertain step ran again; failed: a "
                "final exception recorded; refused: a stale attempt's outcome not recorded).",
                [({"outcome": key}, _num(steps.get(key))) for key in _STEP_OUTCOMES])
        by_state = steps.get("stored")
        if isinstance(by_state, Mapping):
            add("telegram_fence_steps_recorded", "gauge", "Durable steps in the store by state.",
                    [({"state": key}, _num(by_state.get(key, 0))) for key in _STEP_STATES])
    return "\n".join(lines) + "\n"


class HealthService:
    """The answers of ``/metrics``, ``/livez`` and ``/readyz`` for one fence (also mounted by ``webhook_app`` and
    ``health_app``), built from ``snapshot()`` (its ``stats()``); ``vitals()`` is the part liveness reads, without
    the store (so ``/livez`` answers while the store is locked). ``/livez`` and ``/readyz`` answer 200 ``ok`` or 503
    with the reasons, one per line. No answer writes to the store, and each comes within about ``answer_timeout``
    seconds whatever holds the store's locks: the reads get half of it (one still waiting fails: not ready), the
    write check the rest (at least a tenth). Safe from any thread, but :meth:`bind`, :meth:`start` and :meth:`stop`:
    the server of ``address`` (``metrics=``), the owner's.
    """

    def __init__(self, snapshot: Callable[[], Mapping[str, Any]], store: object, *, workers: int,
                 polling: Callable[[], bool], max_progress_age: float, version: str,
                 vitals: Callable[[], Mapping[str, Any]], address: tuple[str, int] | None = None,
                 answer_timeout: float = 1.0) -> None:
        self._snapshot, self._vitals, self._store = snapshot, vitals, store
        self._workers, self._polling, self._version = workers, polling, version
        self._max_progress_age, self._answer_timeout = max_progress_age, answer_timeout
        self._address = address
        self._server: WsgiServer | None = None

    def bind(self) -> None:
        """Bind ``address`` when one was given; raises :class:`ConfigurationError` when it cannot be bound."""
        if self._address is not None and self._server is None:
            from ..http_serving import WsgiServer  # (only a fence given metrics= loads it)

            host, port = self._address
            self._server = WsgiServer(self.wsgi, host, port, request_timeout=5.0, max_connections=32,
                                      names=("fence-metrics", "fence-metrics-request"), option="metrics")

    def start(self, announce: logging.Logger) -> None:
        """Serve on the bound address (nothing without one), saying where on ``announce``."""
        if self._server is not None:
            self._server.start()
            announce.info("serving /metrics, /livez and /readyz", extra={"url": self._server.url})

    def stop(self, timeout: float) -> bool:
        """Stop serving and join (bounded by ``timeout``); ``True`` when nothing is left running."""
        if self._server is None:
            return True
        self._server.stop()
        return self._server.join(timeout)

    @property
    def url(self) -> str | None:
        """``http://host:port`` where the address serves, once bound (the port chosen when 0 was given)."""
        return None if self._server is None else self._server.url

    def answer(self, path: str) -> Answer | None:
        """The answer to ``GET path``, or ``None`` when the path is not one of :data:`PATHS`. Never raises: a
        failure while answering is a 503 naming it."""
        if path not in PATHS:
            return None
        try:
            if path == "/livez":
                return _health(liveness(self._vitals(), polling=self._polling()))
            started = time.monotonic()
            with bounded_reads(self._store, self._answer_timeout / 2):
                stats = self._snapshot()
            live = liveness(stats, polling=self._polling())
            left = max(self._answer_timeout / 10, started + self._answer_timeout - time.monotonic())
            with bounded_reads(self._store, left):
                write_error = check_write(self._store, left)
            ready = readiness(stats, live, write_error=write_error, max_progress_age=self._max_progress_age)
            if path == "/readyz":
                return _health(ready)
            text = exposition(stats, live=not live, ready=not ready, workers=self._workers, version=self._version)
            return 200, CONTENT_TYPE, text.encode("utf-8")
        except Exception as exc:  # an answer, never a dropped connection: the scraper sees why
            log.error("answering %s failed", path, exc_info=True)
            return 503, _TEXT, f"answering {path} failed: {type(exc).__name__}: {exc}\n".encode()

    def wsgi(self, environ: Mapping[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """A WSGI application (PEP 3333) answering :data:`PATHS` (404 elsewhere, 405 for a method but GET/HEAD)."""
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        answer = self.answer(str(environ.get("PATH_INFO", "")))
        if answer is None:
            answer = (404, _TEXT, b"not found; try /metrics, /livez or /readyz\n")
        elif method not in ("GET", "HEAD"):
            answer = (405, _TEXT, b"only GET and HEAD\n")
        status, content_type, body = answer
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if status == 405:
            headers.append(("Allow", "GET, HEAD"))
        start_response(f"{status} {HTTPStatus(status).phrase}", headers)
        return [b""] if method == "HEAD" else [body]


def _health(reasons: list[str]) -> Answer:
    """200 ``ok``, or 503 with the reasons, one per line."""
    if not reasons:
        return 200, _TEXT, b"ok\n"
    return 503, _TEXT, "".join(f"{reason}\n" for reason in reasons).encode("utf-8")
