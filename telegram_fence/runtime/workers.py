"""The worker pool: claim → handle → settle, retry or exhaust; and the heartbeat that keeps leases.

One dispatcher thread talks to the store for the pool: in a single transaction per round it
settles every update whose handler returned since the last round and claims due updates (at
most one per chat) for the workers that are about to be free. Workers only run handlers (and,
rarely, record a retry or an exhaustion). So the store's write lock is taken by two threads (the
poller and the dispatcher), not by every worker, and a transaction covers many updates. An
update is acknowledged only after its handler returned.

The heartbeat renews every lease the pool holds, sets ``owner_lost`` on attempts whose lease
could not be kept, and takes an update away from a handler that ran past ``handler_timeout``
(starting a replacement worker, so the pool keeps its capacity).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import OwnershipLost
from ..retry import RetryPolicy
from ..store import Claim, Identity
from ..telegram import mask_tokens
from ..updates import chat_id_of

__all__ = ["AttemptContext", "WorkerPool"]

log = logging.getLogger("telegram_fence.workers")

_MAX_ERROR_TEXT = 4000
#: Handler time the claimed-but-unstarted queue should hold per worker (see WorkerPool._target).
_QUEUE_SECONDS = 0.004
#: Handlers faster than this on average run on the dispatcher itself (see WorkerPool._run_inline).
_INLINE_MAX = 0.0005
#: Handler time one inline round may spend before the rest of its claims go to the workers.
_INLINE_BUDGET = 0.05
#: An inline handler running longer than this hands the dispatcher's job to a new thread.
_INLINE_STALL = 0.2
#: Claims per inline round, and consecutive updates of one chat claimed at once for it.
_INLINE_ROUND = 256
#: In inline mode, how long finished attempts wait for the poller's next batch to be settled with it.
_SETTLE_HOLD = 0.02
#: In inline mode, how long the dispatcher waits for the poller to send its next request (see _wait_for_fetch).
_FETCH_WAIT = 0.002
_INLINE_RUN = 16

Handler = Callable[[Any, "AttemptContext"], None]
_LOST_LOCK = threading.Lock()
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

    __slots__ = ("_lost", "_store", "chat_id", "completed", "identity", "lease_until", "raw", "started")

    def __init__(self, store: Any, claim: Claim) -> None:
        self._store = store
        self.identity: Identity = claim.identity
        self.raw: Mapping[str, Any] = claim.update
        self.chat_id = claim.chat_id
        self._lost: threading.Event | None = None  # made on first use: most attempts never need one
        self.lease_until = claim.lease_until
        self.completed = False
        self.started: float | None = None

    @property
    def owner_lost(self) -> threading.Event:
        """Set when this attempt's lease could not be kept (advisory: the database is the authority)."""
        lost = self._lost
        if lost is None:
            with _LOST_LOCK:
                lost = self._lost
                if lost is None:
                    lost = self._lost = threading.Event()
        return lost

    @property
    def lost(self) -> bool:
        """Whether ``owner_lost`` is set (without creating the event)."""
        return self._lost is not None and self._lost.is_set()

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


class _RecordRequest:
    """A batch the poller asks the dispatcher to record (see :meth:`WorkerPool.record`)."""

    __slots__ = ("done", "error", "kwargs", "next_offset", "result", "updates")

    def __init__(self, updates: Sequence[Mapping[str, Any]], next_offset: int, kwargs: dict[str, Any]) -> None:
        self.updates = updates
        self.next_offset = next_offset
        self.kwargs = kwargs
        self.done = threading.Event()
        self.result = 0
        self.error: BaseException | None = None


@dataclass(eq=False)
class _Slot:
    """One worker thread and the attempt it is running."""

    current: AttemptContext | None = None
    abandoned: bool = False
    #: a former dispatcher, stuck in an inline handler: it ends after that attempt (no replacement)
    demoted: bool = False


def _log_extra(ctx: AttemptContext) -> dict[str, Any]:
    return {"update_id": ctx.update_id, "attempt": ctx.attempt, "claim_id": ctx.identity.claim_id}


def error_text(error: BaseException) -> str:
    """The error as the store keeps it: type, message and traceback, tokens masked, bounded in size."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    text = mask_tokens(text)
    if len(text) > _MAX_ERROR_TEXT:
        text = text[:200] + "\n…\n" + text[-(_MAX_ERROR_TEXT - 210):]
    return text


class WorkerPool:
    """Threads ``fence-dispatcher``, ``fence-worker-N`` and ``fence-heartbeat``.

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
        self._clock: Callable[[], float] = getattr(store, "clock", time.time)
        self._claim_many = getattr(store, "claim_many", None)
        self._settle_many = getattr(store, "settle_many", None)
        self._renew_many = getattr(store, "renew_many", None)
        self._release = getattr(store, "release", None)
        #: update dicts the poller just recorded, by id: claims take them instead of reading payloads back
        self._fresh: dict[int, Mapping[str, Any]] = {}
        self._stop = threading.Event()
        self._hb_stop = threading.Event()
        lock = threading.Lock()
        self._work_cv = threading.Condition(lock)  # workers wait here for queued claims
        self._disp_cv = threading.Condition(lock)  # the dispatcher waits here for results and wake-ups
        self._queue: deque[AttemptContext] = deque()
        self._finished: list[AttemptContext] = []
        self._finished_at = 0.0  # when the oldest of them finished
        self._fetch_started = threading.Event()
        self._woken = True
        # Where claimable work may be (guarded by the lock): the chats (and chatless updates) that
        # were just freed or just received updates. Anything else becomes claimable only by time
        # (retries, lapsed leases) or through another process, which a periodic full scan finds.
        self._scan_due = True
        self._next_scan = 0.0
        self._hint_chats: set[int] = set()
        self._hint_chatless: set[int] = set()
        self._record_request: _RecordRequest | None = None
        self._running = 0  # workers inside a handler, not abandoned
        self._dispatcher_waiting = False
        self._handler_time = 0.0
        self._slots: dict[threading.Thread, _Slot] = {}
        self._serial = 0
        # Inline mode: the dispatcher's own claims, not started yet, and the one it is running.
        self._inline: deque[AttemptContext] = deque()
        self._inline_current: AttemptContext | None = None
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="fence-dispatcher", daemon=True)
        self._retired: list[threading.Thread] = []  # dispatchers that handed over (see _hand_over)
        self._heartbeat = threading.Thread(target=self._beat, name="fence-heartbeat", daemon=True)
        self.counts = {"handled": 0, "retried": 0, "exhausted": 0, "lost": 0, "timeouts": 0, "handovers": 0}

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        for _ in range(self._size):
            self._spawn()
        self._dispatcher.start()
        self._heartbeat.start()

    def _spawn(self) -> None:
        with self._work_cv:
            self._serial += 1
            slot = _Slot()
            thread = threading.Thread(
                target=self._work_loop, args=(slot,), name=f"fence-worker-{self._serial}", daemon=True
            )
            self._slots[thread] = slot
        thread.start()

    def record(self, updates: Sequence[Mapping[str, Any]], next_offset: int, **kwargs: Any) -> int:
        """``store.record`` run on the dispatcher thread; blocks until it is done and returns its result.

        All of the pool's write transactions then come from one thread: the poller's inbox write
        and the dispatcher's settle-and-claim rounds no longer queue for the store's lock against
        each other (measured: that contention, not SQLite, held the throughput down). Raises what
        ``store.record`` raised. Falls back to recording on the calling thread when the
        dispatcher is not running.
        """
        request = _RecordRequest(updates, next_offset, kwargs)
        with self._disp_cv:
            direct = self._stop.is_set() or not self._dispatcher.is_alive()
            if not direct:
                self._record_request = request
                self._disp_cv.notify()
        if direct:
            return int(self._store.record(updates, next_offset, **kwargs))
        while not request.done.wait(0.5):
            if not self._dispatcher.is_alive():
                with self._disp_cv:
                    if self._record_request is request:
                        self._record_request = None
                if not request.done.is_set():
                    return int(self._store.record(updates, next_offset, **kwargs))
        if request.error is not None:
            raise request.error
        return request.result

    def _serve_record(self, request: _RecordRequest, claim: int = 0) -> list[Claim]:
        """Record the poller's batch (dispatcher thread); an error is kept for the poller, not raised.

        With ``claim`` > 0 (and a store that can) up to that many of the new updates are claimed as
        they are stored (see ``record_and_claim``) and returned. Does not set ``request.done``: when
        the write joins a round's transaction, the batch is recorded only once that transaction committed.
        """
        claims: list[Claim] = []
        try:
            if claim > 0:
                request.result, claims = self._store.record_and_claim(
                    request.updates, request.next_offset, lease=self._lease, limit=claim, run=_INLINE_RUN,
                    **request.kwargs,
                )
            else:
                request.result = int(self._store.record(request.updates, request.next_offset, **request.kwargs))
        except Exception as exc:
            request.error = exc
            return []
        skip = request.kwargs.get("skip", ())
        taken = {c.update_id for c in claims}
        fresh = [u for u in request.updates if u["update_id"] not in skip and u["update_id"] not in taken]
        if fresh:
            self._offer(fresh)
            with self._disp_cv:
                self._hint(fresh)
                self._woken = True
        return claims

    def _hint(self, updates: Sequence[Mapping[str, Any]]) -> None:
        """Note the chats of ``updates`` as places where claimable work may be (call with the lock held)."""
        for update in updates:
            chat_id = chat_id_of(update)
            if chat_id is None:
                self._hint_chatless.add(update["update_id"])
            else:
                self._hint_chats.add(chat_id)

    def _offer(self, updates: list[Mapping[str, Any]]) -> None:
        """Keep update dicts just recorded, so claiming them needs no read-back of their payloads."""
        fresh = self._fresh
        if len(fresh) > 4096:  # claimed elsewhere (another process) or skipped: never taken from here
            fresh.clear()
        for update in updates:
            fresh[update["update_id"]] = update

    def wake(self) -> None:
        """Tell the dispatcher that new work may be due anywhere (it looks at the whole backlog)."""
        with self._disp_cv:
            self._woken = True
            self._scan_due = True
            self._disp_cv.notify()

    def stop(self) -> None:
        """Stop claiming; running handlers finish (see :meth:`join`). Safe from any thread, a handler included."""
        self._stop.set()
        with self._work_cv:
            self._work_cv.notify_all()
            self._disp_cv.notify_all()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for running handlers, settle what finished, hand back what never started.

        Returns ``True`` when every thread ended. A handler still running after ``timeout`` is
        abandoned: its lease is no longer renewed, so its update is reclaimed after the lease and
        its fenced writes are refused from then on.
        """
        deadline = time.monotonic() + timeout
        with self._work_cv:
            threads = list(self._slots)
        ok = True
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            ok = ok and not thread.is_alive()
        with self._work_cv:
            dispatchers = [self._dispatcher, *self._retired]
        for dispatcher in dispatchers:
            if dispatcher.ident is not None:
                dispatcher.join(max(0.5, deadline - time.monotonic()))
                ok = ok and not dispatcher.is_alive()
        self._final_flush()
        self._hb_stop.set()
        if self._heartbeat.ident is not None:
            self._heartbeat.join(max(0.5, deadline - time.monotonic()))
            ok = ok and not self._heartbeat.is_alive()
        return ok

    @property
    def alive(self) -> int:
        with self._work_cv:
            return sum(1 for t, s in self._slots.items() if t.is_alive() and not s.abandoned)

    def in_flight(self) -> int:
        with self._work_cv:
            return len(self._live())

    def _live(self) -> list[AttemptContext]:
        """Every attempt whose lease the pool holds (call with the lock held)."""
        running = [s.current for s in self._slots.values() if s.current is not None and not s.abandoned]
        if self._inline_current is not None:
            running.append(self._inline_current)
        return [*self._queue, *self._inline, *running, *self._finished]

    def _count(self, key: str, n: int = 1) -> None:
        with self._work_cv:
            self.counts[key] += n

    # --- dispatcher -----------------------------------------------------------------------------

    def _target(self) -> int:
        """How many attempts to hold (queued + running): enough queued work for about ``_QUEUE_SECONDS``.

        Fast handlers get a deep queue (many updates per transaction); slow ones (a handler that
        calls Telegram) one spare per pool, so claimed-but-unstarted updates never hold chats that
        an idle worker could serve.
        """
        if self._inline_mode():
            return _INLINE_ROUND
        per_worker = self._batch if self._handler_time <= 0 else int(_QUEUE_SECONDS / self._handler_time)
        per_worker = max(1, min(self._batch, per_worker))
        return self._size * per_worker + 1

    @property
    def inline(self) -> bool:
        """Whether the dispatcher currently runs the handlers itself (they measured as fast)."""
        return self._inline_mode()

    def _inline_mode(self) -> bool:
        """Whether the dispatcher runs the handlers itself: they are measured and take microseconds.

        Handing each update to a worker thread then costs more than the handler (thread switches,
        and the interpreter lock taken back after every SQL statement); the dispatcher alone
        runs them in order, one chat's updates several at a time.
        """
        return 0 < self._handler_time <= _INLINE_MAX

    def _dispatch_loop(self) -> None:
        more_due = True
        while True:
            with self._disp_cv:
                while not self._stop.is_set():
                    room = self._target() - len(self._queue) - self._running
                    if self._record_request is not None:
                        break
                    if room > 0 and (more_due or self._woken):
                        break
                    timeout = min(1.0, self._lease / 4)
                    if self._finished:
                        hold = self._settle_hold()
                        if hold <= 0:
                            break
                        timeout = hold
                    self._dispatcher_waiting = True
                    # Rows also become due by time alone (retries, lapsed leases, other processes).
                    timed_out = not self._disp_cv.wait(timeout) and not self._finished
                    self._dispatcher_waiting = False
                    if timed_out:
                        more_due = self._scan_due = True
                stopping = self._stop.is_set()
                request, self._record_request = self._record_request, None
                if request is not None:
                    self._fetch_started.clear()
                room = self._target() - len(self._queue) - self._running
                finished: list[AttemptContext] = []
                if not stopping and (self._finished or room > 0):
                    self._woken = False
                    finished, self._finished = self._finished, []
            if stopping or (request is not None and not finished and room <= 0):
                # Only a batch to record (or stopping): no round to run.
                if request is not None:
                    self._serve_record(request)
                    request.done.set()
                if stopping:
                    return
                continue
            runs = self._inline_mode()  # claim several updates per chat, and run them here
            try:
                claims, more_due = self._round(request, finished, max(0, room), runs)
            except Exception:
                log.error("settling or claiming failed; retrying", exc_info=True)
                with self._disp_cv:
                    self._finished = finished + self._finished
                self._stop.wait(0.5)
                continue
            if claims:
                contexts = [AttemptContext(self._store, claim) for claim in claims]
                if runs and request is not None:
                    self._wait_for_fetch()
                if runs and not self._run_inline(contexts):
                    return  # handed over: another thread is the dispatcher now
                if contexts:
                    with self._work_cv:
                        self._queue.extend(contexts)
                        self._work_cv.notify(len(contexts))
            if finished:
                self._on_progress()

    def fetching(self) -> None:
        """The poller is about to call ``getUpdates`` (called on the poller's thread)."""
        self._fetch_started.set()

    def _wait_for_fetch(self) -> None:
        """Before running a batch's handlers here, let the poller send its next ``getUpdates``.

        The handlers hold the interpreter lock for milliseconds; a poller woken by the commit would
        wait for them before it could even send the request. Sent first, Telegram's answer is
        on its way while they run. Waits at most ``_FETCH_WAIT`` (the poller may have no room).
        """
        self._fetch_started.wait(_FETCH_WAIT)

    def _settle_hold(self) -> float:
        """How much longer finished attempts may wait for the poller's next batch (call with the lock held).

        In inline mode the batch is usually on its way: settling with it costs no commit of its
        own. The wait is short, and the leases of what waits are renewed meanwhile.
        """
        if not self._inline_mode():
            return 0.0
        return _SETTLE_HOLD - (time.monotonic() - self._finished_at)

    def _run_inline(self, contexts: list[AttemptContext]) -> bool:
        """Run ``contexts`` on this (the dispatcher's) thread, in order; ``False`` once it is no longer the
        dispatcher (a handler stalled and the heartbeat handed the job to a new thread).

        What it does not run (out of budget, handlers no longer fast, stopping) is left in
        ``contexts`` for the workers, at most one per chat; further updates of a chat are handed back.
        """
        me = threading.current_thread()
        deadline = time.monotonic() + _INLINE_BUDGET
        with self._work_cv:
            self._inline.extend(contexts)
        contexts.clear()
        while True:
            with self._work_cv:
                if self._dispatcher is not me:
                    return False
                if not self._inline:
                    return True
                if self._stop.is_set() or not self._inline_mode() or time.monotonic() > deadline:
                    leftover = list(self._inline)
                    self._inline.clear()
                    break
                ctx = self._inline.popleft()
                ctx.started = time.monotonic()
                self._inline_current = ctx
            outcome = self._attempt(ctx)
            elapsed = time.monotonic() - ctx.started
            with self._work_cv:
                demoted = self._dispatcher is not me
                if demoted:
                    slot = self._slots.get(me)
                    if slot is not None and not slot.abandoned:
                        slot.current = None
                        self._running -= 1
                else:
                    self._inline_current = None
                self._measured(elapsed)
                self._done(ctx, outcome)
                if demoted:
                    return False
        contexts.extend(self._one_per_chat(leftover))
        return True

    def _one_per_chat(self, contexts: list[AttemptContext]) -> list[AttemptContext]:
        """The first context of each chat; the others are handed back to the store (not an attempt)."""
        seen: set[int] = set()
        kept = []
        for ctx in contexts:
            if ctx.chat_id is not None and ctx.chat_id in seen:
                self._hand_back(ctx)
                continue
            if ctx.chat_id is not None:
                seen.add(ctx.chat_id)
            kept.append(ctx)
        return kept

    def _hand_back(self, ctx: AttemptContext, *, hint: bool = True) -> None:
        """Return an unstarted claim to the store (attempt not counted); ``hint``: look at its chat again."""
        try:
            if self._release is not None:
                self._release(ctx.identity, attempt_counts=False)
        except Exception:
            log.warning("could not hand back a claim; it is reclaimed after its lease",
                        extra={"update_id": ctx.update_id}, exc_info=True)
        if not hint:
            return
        with self._disp_cv:
            if ctx.chat_id is not None:
                self._hint_chats.add(ctx.chat_id)
            else:
                self._hint_chatless.add(ctx.update_id)
            self._woken = True

    def _hand_over(self, now: float) -> None:
        """Heartbeat: when the dispatcher is stuck in an inline handler, start a new dispatcher.

        The stuck thread becomes a worker for that one attempt (renewed, and timed out by
        ``handler_timeout`` like any other) and ends after it; the claims it had not started go to
        the workers (one per chat, the rest handed back); handlers count as slow from now on.
        """
        with self._work_cv:
            ctx = self._inline_current
            if ctx is None or ctx.started is None or now - ctx.started < _INLINE_STALL:
                return
            old = self._dispatcher
            self._slots[old] = _Slot(current=ctx, demoted=True)
            self._running += 1
            self._inline_current = None
            busy = {ctx.chat_id}
            leftover = list(self._inline)
            self._inline.clear()
            self._handler_time = max(self._handler_time, now - ctx.started)
            new = threading.Thread(target=self._dispatch_loop, name="fence-dispatcher", daemon=True)
            self._dispatcher = new
            self._retired.append(old)
            self.counts["handovers"] += 1
        log.warning("a handler has run on the dispatcher for %.1f s; a new dispatcher takes over", now - ctx.started,
                    extra={"update_id": ctx.update_id, "attempt": ctx.attempt})
        queued = []
        for kept in self._one_per_chat(leftover):
            if kept.chat_id is not None and kept.chat_id in busy:
                self._hand_back(kept)
            else:
                queued.append(kept)
        with self._work_cv:
            self._queue.extend(queued)
            self._work_cv.notify(len(queued))
        new.start()

    def _round(
        self, request: _RecordRequest | None, finished: list[AttemptContext], room: int, runs: bool = False
    ) -> tuple[list[Claim], bool]:
        """Record the poller's batch (if any), settle ``finished`` and claim up to ``room``.

        With a store whose calls nest (``nests_writes``) all of it is one transaction: one commit
        (one fsync) per round instead of one per step. ``request.done`` is set once the batch is
        committed, or failed (the poller then asks Telegram for the same offset again). In inline
        mode (``runs``) ``finished`` is settled first and the batch's updates whose chats are then
        free are claimed as they are stored: no second write of those rows to claim them.
        """
        if request is None:
            return self._exchange(finished, room, runs)
        store = self._store
        if not getattr(store, "nests_writes", False):
            self._serve_record(request)
            request.done.set()
            return self._exchange(finished, room, runs)
        early = runs and room > 0 and hasattr(store, "record_and_claim") and hasattr(store, "exchange")
        try:
            with store.write(durable=True):
                if not early:
                    self._serve_record(request)
                    return self._exchange(finished, room, runs)
                self._settle_first(finished)
                fresh = self._serve_record(request, claim=room)
                if fresh:  # a chat just given a claim has nothing else claimable now
                    with self._disp_cv:
                        self._hint_chats.difference_update(c.chat_id for c in fresh)
                claims, more = self._exchange([], room - len(fresh), runs)
                return claims + fresh, more  # the older updates (other chats) first
        except BaseException as exc:
            # The commit (or the round) failed: nothing of it was stored, the batch included.
            request.error, request.result = exc, 0
            raise
        finally:
            request.done.set()

    def _settle_first(self, finished: list[AttemptContext]) -> None:
        """Settle ``finished`` (inside the round's transaction) and note their chats as freed."""
        if not finished:
            return
        settled, _claims, _more = self._store.exchange([c.identity for c in finished], self._lease, 0)
        self._settled(len(finished), settled)
        with self._disp_cv:
            self._hint_freed(finished)

    def _hint_freed(self, finished: list[AttemptContext]) -> None:
        """Note the chats of ``finished`` (settled in this round) as freed (call with the lock held)."""
        for ctx in finished:
            if ctx.chat_id is not None:
                self._hint_chats.add(ctx.chat_id)

    def _exchange(self, finished: list[AttemptContext], room: int, runs: bool = False) -> tuple[list[Claim], bool]:
        """Settle ``finished`` and claim up to ``room`` updates, in one transaction when the store allows.

        Returns the claims and whether more may be claimable now. Looks only where work may have
        appeared (the chats just freed or just given updates) unless a full scan is due.
        """
        known = self._fresh
        exchange = getattr(self._store, "exchange", None)
        if exchange is not None and room <= 0:  # settle only: the hints and a due scan wait for room
            if finished:
                self._settle_first(finished)
            return [], False
        if exchange is None:
            self._settle(finished)
            claims = self._claim(room)
            more = bool(claims)
        else:
            now = time.monotonic()
            with self._disp_cv:
                self._hint_freed(finished)  # settled below, in the same transaction
                scan = self._scan_due or now >= self._next_scan
                chats, self._hint_chats = self._hint_chats, set()
                chatless, self._hint_chatless = self._hint_chatless, set()
                self._scan_due = False
            try:
                settled, claims, more = exchange(
                    [c.identity for c in finished], self._lease, room, max_attempts=self._max_attempts,
                    known=known, chats=None if scan else chats, chatless=chatless, run=_INLINE_RUN if runs else 1,
                )
            except BaseException:
                with self._disp_cv:
                    self._hint_chats |= chats
                    self._hint_chatless |= chatless
                    self._scan_due = self._scan_due or scan
                raise
            self._settled(len(finished), settled)
            if scan:
                self._next_scan = now + min(1.0, self._lease / 4)
            with self._disp_cv:
                if scan and more:
                    self._scan_due = True
                elif more:  # cut off by the room: the chats not served yet stay candidates
                    taken = set() if runs else {claim.chat_id for claim in claims}
                    self._hint_chats |= chats - taken
                    self._hint_chatless |= chatless - {claim.update_id for claim in claims}
        for claim in claims:
            known.pop(claim.update_id, None)
        return claims, more

    def _claim(self, room: int) -> list[Claim]:
        if room <= 0:
            return []
        if self._claim_many is not None:
            return list(self._claim_many(self._lease, room, max_attempts=self._max_attempts))
        claims = []
        for _ in range(room):
            claim = self._store.claim_owned(self._lease, max_attempts=self._max_attempts)
            if claim is None:
                break
            claims.append(claim)
        return claims

    def _settle(self, done: list[AttemptContext]) -> None:
        if not done:
            return
        identities = [ctx.identity for ctx in done]
        if self._settle_many is not None:
            settled = self._settle_many(identities)
        else:
            settled = sum(1 for identity in identities if self._store.settle_owned(identity))
        self._settled(len(identities), settled)

    def _settled(self, finished: int, settled: int) -> None:
        if not finished:
            return
        self._count("handled", settled)
        if settled != finished:
            self._count("lost", finished - settled)
            log.warning("some finished updates were no longer owned when settled",
                        extra={"finished": finished, "settled": settled})

    def _final_flush(self) -> None:
        """On shutdown: settle what finished, and hand back claims that never started (attempt not counted)."""
        with self._work_cv:
            finished, self._finished = self._finished, []
            unstarted, self._queue = list(self._queue), deque()
        try:
            self._settle(finished)
        except Exception:
            log.error("settling finished updates at shutdown failed; they will run again", exc_info=True)
        for ctx in unstarted:
            self._hand_back(ctx, hint=False)
        if finished:
            self._on_progress()

    # --- workers --------------------------------------------------------------------------------

    def _work_loop(self, slot: _Slot) -> None:
        while True:
            with self._work_cv:
                while not self._queue and not self._stop.is_set() and not slot.abandoned:
                    self._work_cv.wait()
                if self._stop.is_set() or slot.abandoned:
                    return
                ctx = self._queue.popleft()
                ctx.started = time.monotonic()
                slot.current = ctx
                self._running += 1
            outcome = self._attempt(ctx)
            elapsed = time.monotonic() - ctx.started
            with self._work_cv:
                slot.current = None
                if slot.abandoned:
                    return
                self._running -= 1
                self._measured(elapsed)
                self._done(ctx, outcome)
                if self._dispatcher_waiting:
                    self._disp_cv.notify()

    def _measured(self, elapsed: float) -> None:
        """Fold one handler's run time into the average (call with the lock held)."""
        self._handler_time = elapsed if self._handler_time <= 0 else 0.8 * self._handler_time + 0.2 * elapsed

    def _done(self, ctx: AttemptContext, outcome: str) -> None:
        """File an attempt's outcome for the dispatcher (call with the lock held)."""
        if outcome == "settle":
            if not self._finished:
                self._finished_at = time.monotonic()
            self._finished.append(ctx)
        else:  # retried, exhausted, completed or lost: the chat no longer waits on this attempt
            if ctx.chat_id is not None:
                self._hint_chats.add(ctx.chat_id)
            self._woken = True

    def _attempt(self, ctx: AttemptContext) -> str:
        """Run one attempt; returns ``"settle"`` when the dispatcher should settle the update."""
        try:
            update = self._parse(ctx.raw)
        except Exception as exc:
            self._exhaust(ctx, f"the update could not be parsed: {error_text(exc)}", _log_extra(ctx))
            return "exhausted"
        try:
            self._handle(update, ctx)
        except OwnershipLost:
            self._count("lost")
            log.warning("attempt lost ownership; its writes were refused", extra=_log_extra(ctx))
            return "lost"
        except Exception as exc:
            return self._failed(ctx, exc, _log_extra(ctx))
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
        log.warning("handler failed; will retry", extra={**extra, "retry_in": delay, "err": exc})
        try:
            retried = self._store.retry_owned(ctx.identity, self._clock() + max(0.0, float(delay)), text)
        except Exception:
            log.error("recording the retry failed; the update is retried after its lease", exc_info=True,
                      extra=extra)
            return "retried"
        self._count("retried" if retried else "lost")
        return "retried"

    def _exhaust(self, ctx: AttemptContext, text: str, extra: dict[str, Any]) -> None:
        exhaust = getattr(self._store, "exhaust", None)
        try:
            if exhaust is None:
                # A store without exhaustion support: retry much later rather than drop the update.
                self._store.retry_owned(ctx.identity, self._clock() + 900, text)
                log.error("handler failed for good but the store cannot keep exhaustions; retrying later",
                          extra=extra)
                return
            exhausted = exhaust(ctx.identity, text)
        except Exception:
            log.error("recording the exhaustion failed; the update is retried after its lease", exc_info=True,
                      extra=extra)
            return
        if exhausted:
            self._count("exhausted")
            log.error("update exhausted", extra={**extra, "error": text.splitlines()[-1] if text else ""})
            self._on_exhausted()
        else:
            self._count("lost")

    # --- heartbeat ------------------------------------------------------------------------------

    def _beat(self) -> None:
        interval = max(0.05, self._lease / 3)
        next_beat = time.monotonic() + interval
        while True:
            # Wake often enough to see an inline handler stall (a lock and a comparison per wake-up):
            # inline mode may begin at any moment, so the shorter wait applies always.
            wait = min(next_beat - time.monotonic(), _INLINE_STALL / 2)
            if self._hb_stop.wait(max(0.0, wait)):
                return
            now = time.monotonic()
            try:
                self._hand_over(now)
            except Exception:
                log.error("handing the dispatcher over failed", exc_info=True)
            if now < next_beat:
                continue
            next_beat = now + interval
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
        with self._work_cv:
            contexts = self._live()
        if not contexts:
            return
        identities = [ctx.identity for ctx in contexts]
        now = self._clock()
        try:
            if self._renew_many is not None:
                kept = self._renew_many(identities, self._lease)
            else:
                kept = {i for i in identities if self._store.renew_owned(i, self._lease)}
        except Exception:
            log.error("renewing leases failed", exc_info=True)
            for ctx in contexts:
                if now >= ctx.lease_until:
                    ctx.owner_lost.set()
            return
        missing = [ctx for ctx in contexts if ctx.identity not in kept]
        for ctx in contexts:
            if ctx.identity in kept:
                ctx.lease_until = now + self._lease
        if not missing:
            return
        with self._work_cv:
            # Settled by the dispatcher since the snapshot: done, not lost.
            still_held = {id(ctx) for ctx in self._live()}
        lost = set()
        for ctx in missing:
            if id(ctx) not in still_held:
                continue
            if not ctx.lost:
                log.warning("lease lost", extra={"update_id": ctx.update_id, "attempt": ctx.attempt,
                                                 "claim_id": ctx.identity.claim_id})
            ctx.owner_lost.set()
            lost.add(ctx.identity)
        if lost:
            with self._work_cv:
                self._queue = deque(c for c in self._queue if c.identity not in lost)
                self._finished = [c for c in self._finished if c.identity not in lost]

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        stuck: list[tuple[AttemptContext, bool]] = []
        with self._work_cv:
            for slot in self._slots.values():
                ctx = slot.current
                if slot.abandoned or ctx is None or ctx.started is None or now - ctx.started < self._handler_timeout:
                    continue
                slot.abandoned = True
                self._running -= 1
                stuck.append((ctx, slot.demoted))
        for ctx, demoted in stuck:
            self._count("timeouts")
            ctx.owner_lost.set()
            log.error("handler exceeded handler_timeout; its update is taken away and a new worker started",
                      extra={"update_id": ctx.update_id, "attempt": ctx.attempt, "claim_id": ctx.identity.claim_id,
                             "handler_timeout": self._handler_timeout})
            if self._release is not None:
                self._release(ctx.identity, attempt_counts=True)
            if not self._stop.is_set() and not demoted:  # a former dispatcher was not a worker
                self._spawn()
        if stuck:
            self.wake()
