"""The worker pool: claim → handle → settle, retry or exhaust; and the heartbeat that keeps leases.

Each worker claims a small batch of due updates (at most one per chat) in one transaction, runs
the handler on each in turn, and settles the finished ones together in one transaction. An
update is acknowledged only after its handler returned. The heartbeat renews every lease the
pool holds, sets ``owner_lost`` on attempts whose lease could not be kept, and takes an update
away from a handler that ran past ``handler_timeout`` (starting a replacement worker, so the pool
keeps its capacity).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .errors import OwnershipLost
from .retry import RetryPolicy
from .store import Claim, Identity
from .telegram import mask_tokens

__all__ = ["AttemptContext", "WorkerPool"]

log = logging.getLogger("telegram_fence.workers")

_MAX_ERROR_TEXT = 4000
#: Handler time one claimed batch should hold (see WorkerPool._claim_size).
_BATCH_SECONDS = 0.004

Handler = Callable[[Any, "AttemptContext"], None]
Parser = Callable[[Mapping[str, Any]], Any]


class AttemptContext:
    """What an attempt-aware handler knows about its attempt.

    - ``identity``: ``Identity(update_id, attempt, claim_id)``; ``attempt``: 1 for the first try;
    - ``raw``: the update as Telegram sent it (a dict);
    - ``owner_lost``: a ``threading.Event`` set when the lease could not be kept (advisory: stop early);
    - ``owns()``: asks the database (the authority) whether this attempt still owns the update;
    - ``transaction(complete=False)``: a write transaction that commits only while this attempt owns the
      update, raising :class:`~telegram_fence.errors.OwnershipLost` otherwise; ``complete=True`` settles the
      update in the same transaction.

    Belongs to one attempt; use it from the handler's thread (``owner_lost`` may be waited on anywhere).
    """

    __slots__ = ("_store", "completed", "identity", "lease_until", "owner_lost", "raw", "started")

    def __init__(self, store: Any, claim: Claim) -> None:
        self._store = store
        self.identity: Identity = claim.identity
        self.raw: Mapping[str, Any] = claim.update
        self.owner_lost = threading.Event()
        self.lease_until = claim.lease_until
        self.completed = False
        self.started: float | None = None

    @property
    def attempt(self) -> int:
        return self.identity.attempt

    @property
    def update_id(self) -> int:
        return self.identity.update_id

    def owns(self) -> bool:
        """``True`` while the database still gives this attempt the update."""
        return bool(self._store.owns(self.identity))

    @contextmanager
    def transaction(self, complete: bool = False) -> Iterator[Any]:
        """Yield the store's connection inside a fenced write transaction (see the class docstring)."""
        with self._store.transaction(self.identity, complete=complete) as conn:
            yield conn
        if complete:
            self.completed = True


@dataclass(eq=False)
class _Slot:
    """What one worker holds: claims not yet started, the one running, and finished ones to settle."""

    pending: deque[AttemptContext] = field(default_factory=deque)
    current: AttemptContext | None = None
    finished: list[AttemptContext] = field(default_factory=list)
    abandoned: bool = False
    #: moving average of this worker's handler time (seconds); sizes its claims
    handler_time: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def live(self) -> list[AttemptContext]:
        with self.lock:
            items = list(self.pending) + self.finished
            if self.current is not None:
                items.append(self.current)
            return items


def error_text(error: BaseException) -> str:
    """The error as the store keeps it: type, message and traceback, tokens masked, bounded in size."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    text = mask_tokens(text)
    if len(text) > _MAX_ERROR_TEXT:
        text = text[:200] + "\n…\n" + text[-(_MAX_ERROR_TEXT - 210):]
    return text


class WorkerPool:
    """``workers`` threads named ``fence-worker-N`` plus a ``fence-heartbeat`` thread.

    Owned by the fence; ``stop()`` and ``wake()`` may be called from any thread.
    """

    def __init__(
        self,
        *,
        store: Any,
        handle: Handler,
        parse: Parser,
        workers: int,
        lease: float,
        max_attempts: int,
        retry: RetryPolicy,
        handler_timeout: float,
        batch_size: int = 16,
        on_exhausted: Callable[[], None] = lambda: None,
        on_progress: Callable[[], None] = lambda: None,
        on_tick: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._handle = handle
        self._parse = parse
        self._size = workers
        self._lease = lease
        self._max_attempts = max_attempts
        self._retry = retry
        self._handler_timeout = handler_timeout
        self._batch = max(1, batch_size)
        self._on_exhausted = on_exhausted
        self._on_progress = on_progress
        self._on_tick = on_tick
        self._claim_many = getattr(store, "claim_many", None)
        self._settle_many = getattr(store, "settle_many", None)
        self._renew_many = getattr(store, "renew_many", None)
        self._release = getattr(store, "release", None)
        self._stop = threading.Event()
        self._hb_stop = threading.Event()
        self._work = threading.Condition()
        self._work_seq = 0
        self._slots: dict[threading.Thread, _Slot] = {}
        self._slots_lock = threading.Lock()
        self._serial = 0
        self._heartbeat = threading.Thread(target=self._beat, name="fence-heartbeat", daemon=True)
        self.counts = {"handled": 0, "retried": 0, "exhausted": 0, "lost": 0, "timeouts": 0}
        self._counts_lock = threading.Lock()

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        for _ in range(self._size):
            self._spawn()
        self._heartbeat.start()

    def _spawn(self) -> None:
        with self._slots_lock:
            self._serial += 1
            slot = _Slot()
            thread = threading.Thread(
                target=self._work_loop, args=(slot,), name=f"fence-worker-{self._serial}", daemon=True
            )
            self._slots[thread] = slot
        thread.start()

    def wake(self) -> None:
        """Tell idle workers that new work may be due."""
        with self._work:
            self._work_seq += 1
            self._work.notify_all()

    def stop(self) -> None:
        """Stop claiming; running handlers finish (see :meth:`join`). Safe from any thread, a handler included."""
        self._stop.set()
        self.wake()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the workers, then stop the heartbeat; ``True`` when all ended.

        A handler still running after ``timeout`` is abandoned: its lease is no longer renewed, so
        its update is reclaimed after the lease and its fenced writes are refused from then on.
        """
        deadline = time.monotonic() + timeout
        with self._slots_lock:
            threads = list(self._slots)
        ok = True
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            ok = ok and not thread.is_alive()
        self._hb_stop.set()
        if self._heartbeat.ident is not None:
            self._heartbeat.join(max(0.5, deadline - time.monotonic()))
            ok = ok and not self._heartbeat.is_alive()
        return ok

    @property
    def alive(self) -> int:
        with self._slots_lock:
            return sum(1 for t, s in self._slots.items() if t.is_alive() and not s.abandoned)

    def in_flight(self) -> int:
        with self._slots_lock:
            slots = [s for s in self._slots.values() if not s.abandoned]
        return sum(len(s.live()) for s in slots)

    def _count(self, key: str, n: int = 1) -> None:
        with self._counts_lock:
            self.counts[key] += n

    # --- workers --------------------------------------------------------------------------------

    def _claim_size(self, slot: _Slot) -> int:
        """How many updates to claim at once: enough that a batch takes about ``_BATCH_SECONDS`` of handler time.

        Fast handlers get big batches (fewer transactions); slow ones claim one at a time, so an
        idle worker is never kept from a chat whose next update sits unstarted in a busy worker's batch.
        """
        if slot.handler_time <= 0:
            return min(self._batch, 4)
        return max(1, min(self._batch, int(_BATCH_SECONDS / slot.handler_time)))

    def _claim(self, slot: _Slot) -> list[Claim]:
        store = self._store
        if self._claim_many is not None:
            return list(self._claim_many(self._lease, self._claim_size(slot), max_attempts=self._max_attempts))
        claim = store.claim_owned(self._lease, max_attempts=self._max_attempts)
        return [claim] if claim is not None else []

    def _wait_for_work(self, seen: int) -> None:
        """Wait until woken after ``seen``, or briefly: rows also become due by time alone."""
        with self._work:
            if self._work_seq == seen and not self._stop.is_set():
                self._work.wait(min(1.0, self._lease / 4))

    def _work_loop(self, slot: _Slot) -> None:
        while not self._stop.is_set() and not slot.abandoned:
            seen = self._work_seq
            try:
                claims = self._claim(slot)
            except Exception:
                log.error("claiming updates failed; retrying", exc_info=True)
                self._stop.wait(1.0)
                continue
            if not claims:
                self._wait_for_work(seen)
                continue
            contexts = [AttemptContext(self._store, claim) for claim in claims]
            with slot.lock:
                slot.pending.extend(contexts)
            self._run_batch(slot)
        self._give_back(slot)

    def _run_batch(self, slot: _Slot) -> None:
        while not self._stop.is_set() and not slot.abandoned:
            with slot.lock:
                if not slot.pending:
                    break
                ctx = slot.pending.popleft()
                ctx.started = time.monotonic()
                slot.current = ctx
            outcome = self._attempt(ctx)
            elapsed = time.monotonic() - ctx.started
            slot.handler_time = elapsed if slot.handler_time <= 0 else 0.7 * slot.handler_time + 0.3 * elapsed
            with slot.lock:
                slot.current = None
                if slot.abandoned:
                    return
            if outcome == "settle":
                with slot.lock:
                    slot.finished.append(ctx)
        self._settle(slot)

    def _attempt(self, ctx: AttemptContext) -> str:
        """Run one attempt; returns ``"settle"`` when the update should be settled with the batch."""
        extra = {"update_id": ctx.update_id, "attempt": ctx.attempt, "claim_id": ctx.identity.claim_id}
        try:
            update = self._parse(ctx.raw)
        except Exception as exc:
            self._exhaust(ctx, f"the update could not be parsed: {error_text(exc)}", extra)
            return "exhausted"
        try:
            self._handle(update, ctx)
        except OwnershipLost:
            self._count("lost")
            log.warning("attempt lost ownership; its writes were refused", extra=extra)
            return "lost"
        except Exception as exc:
            return self._failed(ctx, exc, extra)
        if ctx.completed:
            self._count("handled")
            return "completed"
        return "settle"

    def _failed(self, ctx: AttemptContext, exc: Exception, extra: dict[str, Any]) -> str:
        text = error_text(exc)
        try:
            delay = self._retry(exc, ctx.attempt)
        except Exception:
            log.error("the retry policy raised; using its default delay", exc_info=True, extra=extra)
            delay = 60.0
        if delay is None or ctx.attempt >= self._max_attempts:
            self._exhaust(ctx, text, extra)
            return "exhausted"
        at = self._store.clock() + max(0.0, float(delay)) if hasattr(self._store, "clock") else time.time() + delay
        log.warning("handler failed; will retry", extra={**extra, "retry_in": delay, "err": exc})
        if self._store.retry_owned(ctx.identity, at, text):
            self._count("retried")
        else:
            self._count("lost")
        return "retried"

    def _exhaust(self, ctx: AttemptContext, text: str, extra: dict[str, Any]) -> None:
        exhaust = getattr(self._store, "exhaust", None)
        if exhaust is None:
            # A store without exhaustion support: keep retrying later rather than drop the update.
            self._store.retry_owned(ctx.identity, time.time() + 900, text)
            log.error("handler failed for good but the store cannot keep exhaustions; retrying later",
                      extra=extra)
            return
        if exhaust(ctx.identity, text):
            self._count("exhausted")
            log.error("update exhausted", extra={**extra, "error": text.splitlines()[-1] if text else ""})
            self._on_exhausted()
        else:
            self._count("lost")

    def _settle(self, slot: _Slot) -> None:
        with slot.lock:
            done, slot.finished = slot.finished, []
        if not done:
            return
        identities = [ctx.identity for ctx in done]
        try:
            if self._settle_many is not None:
                settled = self._settle_many(identities)
            else:
                settled = sum(1 for identity in identities if self._store.settle_owned(identity))
        except Exception:
            log.error("settling finished updates failed; they will run again", exc_info=True)
            return
        self._count("handled", settled)
        if settled != len(identities):
            self._count("lost", len(identities) - settled)
            log.warning("some finished updates were no longer owned when settled",
                        extra={"finished": len(identities), "settled": settled})
        self._on_progress()

    def _give_back(self, slot: _Slot) -> None:
        """On stop: settle what finished, and hand back claims that never started (attempt not counted)."""
        if slot.abandoned:
            return
        self._settle(slot)
        with slot.lock:
            unstarted, slot.pending = list(slot.pending), deque()
        for ctx in unstarted:
            try:
                if self._release is not None:
                    self._release(ctx.identity, attempt_counts=False)
            except Exception:
                log.warning("could not hand back a claim; it is reclaimed after its lease",
                            extra={"update_id": ctx.update_id}, exc_info=True)

    # --- heartbeat ------------------------------------------------------------------------------

    def _beat(self) -> None:
        interval = max(0.05, self._lease / 3)
        while not self._hb_stop.wait(interval):
            try:
                self._renew()
                self._check_timeouts()
            except Exception:
                log.error("heartbeat failed", exc_info=True)
            try:
                self._on_tick()
            except Exception:
                log.error("supervisor tick failed", exc_info=True)

    def _renew(self) -> None:
        with self._slots_lock:
            slots = [s for s in self._slots.values() if not s.abandoned]
        contexts = [ctx for slot in slots for ctx in slot.live()]
        if not contexts:
            return
        identities = [ctx.identity for ctx in contexts]
        now = self._store.clock() if hasattr(self._store, "clock") else time.time()
        try:
            if self._renew_many is not None:
                kept = self._renew_many(identities, self._lease)
            else:
                kept = {i for i in identities if self._store.renew_owned(i, self._lease)}
        except Exception:
            log.error("renewing leases failed", exc_info=True)
            kept = set()
            for ctx in contexts:
                if now >= ctx.lease_until:
                    ctx.owner_lost.set()
            return
        for ctx in contexts:
            if ctx.identity in kept:
                ctx.lease_until = now + self._lease
            else:
                if not ctx.owner_lost.is_set():
                    log.warning("lease lost", extra={"update_id": ctx.update_id, "attempt": ctx.attempt,
                                                     "claim_id": ctx.identity.claim_id})
                ctx.owner_lost.set()
        lost = {ctx.identity for ctx in contexts if ctx.owner_lost.is_set()}
        if lost:
            for slot in slots:
                with slot.lock:
                    slot.pending = deque(c for c in slot.pending if c.identity not in lost)
                    slot.finished = [c for c in slot.finished if c.identity not in lost]

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        with self._slots_lock:
            slots = [s for s in self._slots.values() if not s.abandoned]
        for slot in slots:
            with slot.lock:
                ctx = slot.current
                if ctx is None or ctx.started is None or now - ctx.started < self._handler_timeout:
                    continue
                slot.abandoned = True
                unstarted, slot.pending = list(slot.pending), deque()
            self._count("timeouts")
            ctx.owner_lost.set()
            log.error("handler exceeded handler_timeout; its update is taken away and a new worker started",
                      extra={"update_id": ctx.update_id, "attempt": ctx.attempt, "claim_id": ctx.identity.claim_id,
                             "handler_timeout": self._handler_timeout})
            if self._release is not None:
                self._release(ctx.identity, attempt_counts=True)
                for other in unstarted:
                    self._release(other.identity, attempt_counts=False)
            self._settle(slot)
            if not self._stop.is_set():
                self._spawn()
            self.wake()
