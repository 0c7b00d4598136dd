"""The dispatcher: one thread that records the poller's batches and runs the pool's settle-and-claim rounds.

One job: the ``fence-dispatcher`` loop. In a single transaction per round it records the poller's
batch (handed over by :meth:`Dispatcher.record`), settles every update whose handler returned since
the last round and claims due updates for the workers about to be free (or, in inline mode, runs
them itself through :class:`~telegram_fence.runtime.inline.Inline`). So the store's write lock is
taken by one thread, and a transaction covers many updates. An update is acknowledged only after its
handler returned. May import ``retry``, ``store`` (types), ``runtime.attempt``, ``runtime.decisions``,
``runtime.exchange``, ``runtime.guard``, ``runtime.handoff``, ``runtime.inline``, ``runtime.state``,
``runtime.workers`` and the standard library. Logs as ``telegram_fence.dispatcher``.

Thread safety: :meth:`Dispatcher.record` and :meth:`Dispatcher.fetching` are called on the poller's
thread; :meth:`Dispatcher.loop` runs on the (current) dispatcher thread; :meth:`Dispatcher.final_flush`
on the joining thread once the dispatchers ended. Shared state is touched under the pool's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..retry import exponential
from ..store import Claim
from . import decisions
from .attempt import AttemptContext
from .capabilities import StoreCapabilities
from .exchange import Exchanger
from .guard import can_outlive, guarded
from .handoff import RecordRequest
from .inline import Inline
from .state import PoolState
from .workers import Workers

__all__ = ["Dispatcher"]

log = logging.getLogger("telegram_fence.dispatcher")


class Dispatcher:
    """The ``fence-dispatcher`` thread's work; owned by the pool."""

    def __init__(
        self,
        state: PoolState,
        *,
        store: StoreCapabilities,
        lease: float,
        exchanger: Exchanger,
        workers: Workers,
        on_progress: Callable[[], None],
        on_claimed: Callable[[Sequence[AttemptContext]], None] = lambda contexts: None,
    ) -> None:
        """``on_claimed(contexts)`` is told each round's new attempts on the dispatcher's thread, after their
        claims committed and before any of them begins (durable conversations ask the store once per round
        which of their chats have anything stored); it must not raise."""
        self._state = state
        self._caps = store
        self._store = store.store
        self._lease = lease
        self._exchanger = exchanger
        self._on_progress = on_progress
        self._on_claimed = on_claimed
        self.inline = Inline(state, attempt=workers.attempt, exchanger=exchanger, make_dispatcher=self.thread)

    def thread(self) -> threading.Thread:
        """A new (unstarted) dispatcher thread."""
        return threading.Thread(target=guarded(self.loop, self._state.on_fatal), name="fence-dispatcher", daemon=True)

    # --- the poller's hand-off --------------------------------------------------------------------

    def record(self, updates: Sequence[Mapping[str, Any]], next_offset: int, **kwargs: Any) -> int:
        """``store.record`` run on the dispatcher thread; blocks until it is done and returns its result.

        All of the pool's write transactions then come from one thread: the poller's inbox write
        and the dispatcher's settle-and-claim rounds no longer queue for the store's lock against
        each other (measured: that contention, not SQLite, held the throughput down). Raises what
        ``store.record`` raised. Falls back to recording on the calling thread when the
        dispatcher is not running.
        """
        state = self._state
        request = RecordRequest(updates, next_offset, kwargs)
        with state.lock:
            dispatcher = state.dispatcher
            direct = state.stop.is_set() or dispatcher is None or not dispatcher.is_alive()
            if not direct:
                state.record_request = request
                state.dispatcher_wake.notify()
        if direct:
            return int(self._store.record(updates, next_offset, **kwargs))
        while not request.done.wait(0.5):
            dispatcher = state.dispatcher
            if dispatcher is None or not dispatcher.is_alive():
                with state.lock:
                    if state.record_request is request:
                        state.record_request = None
                if not request.done.is_set():
                    return int(self._store.record(updates, next_offset, **kwargs))
        if request.error is not None:
            raise request.error
        return request.result

    def fetching(self) -> None:
        """The poller is about to call ``getUpdates`` (called on the poller's thread)."""
        self._state.fetch_started.set()

    def _wait_for_fetch(self) -> None:
        """Before running a batch's handlers here, let the poller send its next ``getUpdates``.

        The handlers hold the interpreter lock for milliseconds; a poller woken by the commit would
        wait for them before it could even send the request. Sent first, Telegram's answer is
        on its way while they run. Waits at most ``FETCH_WAIT`` (the poller may have no room).
        """
        self._state.fetch_started.wait(decisions.FETCH_WAIT)

    def _serve_record(self, request: RecordRequest, claim: int = 0) -> list[Claim]:
        """Record the poller's batch (dispatcher thread); an error is kept for the poller, not raised.

        With ``claim`` > 0 (and a store that can) up to that many of the new updates are claimed as
        they are stored (see ``record_and_claim``) and returned. Does not set ``request.done``: when
        the write joins a round's transaction, the batch is recorded only once that transaction committed.
        """
        claims: list[Claim] = []
        batched = self._caps.batched
        try:
            if claim > 0 and batched is not None:
                request.result, claims = batched.record_and_claim(
                    request.updates, request.next_offset, lease=self._lease, limit=claim, run=decisions.INLINE_RUN,
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
            self._exchanger.offer(fresh)
            with self._state.lock:
                self._state.hint(fresh)
                self._state.woken = True
        return claims

    # --- rounds -----------------------------------------------------------------------------------

    def loop(self) -> None:
        """The dispatcher thread: wait for work, run rounds, until the pool stops or this thread hands over."""
        state = self._state
        more_due = True
        failures = 0  # consecutive failed rounds
        while True:
            with state.lock:
                while not state.stop.is_set():
                    room = state.room()
                    if state.record_request is not None:
                        break
                    now = time.monotonic()
                    if state.due and state.due[0] <= now:  # a retry of ours is due: look at the whole backlog
                        more_due = state.scan_due = True
                    if room > 0 and (more_due or state.woken):
                        break
                    # Rows also become due by time alone: our retries (waited for exactly), lapsed leases
                    # and other processes' rows (found by a scan, rarely while the pool holds nothing).
                    scan = decisions.idle_scan_interval(self._lease) if state.idle() else \
                        decisions.scan_interval(self._lease)
                    timeout = decisions.next_wake([now + scan, state.next_due(now)], now)
                    if state.finished:
                        hold = decisions.settle_hold(state.handler_time, state.finished_at, now)
                        if hold <= 0:
                            break
                        timeout = hold
                    state.dispatcher_waiting = True
                    timed_out = not state.dispatcher_wake.wait(timeout) and not state.finished
                    state.dispatcher_waiting = False
                    state.counts["dispatcher_wakeups"] += 1
                    if timed_out:
                        more_due = state.scan_due = True
                stopping = state.stop.is_set()
                request, state.record_request = state.record_request, None
                if request is not None:
                    state.fetch_started.clear()
                room = state.room()
                finished: list[AttemptContext] = []
                if not stopping and (state.finished or room > 0):
                    state.woken = False
                    finished, state.finished = state.finished, []
            if stopping or (request is not None and not finished and room <= 0):
                # Only a batch to record (or stopping): no round to run.
                if request is not None:
                    self._serve_record(request)
                    request.done.set()
                if stopping:
                    return
                continue
            runs = state.inline_mode()  # claim several updates per chat, and run them here
            try:
                claims, more_due = self.round(request, finished, max(0, room), runs)
            except Exception as exc:
                with state.lock:
                    state.finished = finished + state.finished
                if not can_outlive(exc):
                    raise  # the guard ends the fence with the reason
                failures += 1
                delay = exponential(failures, 0.1, 2.0)
                log.error("settling or claiming failed; retrying in %g s", delay, exc_info=True)
                state.stop.wait(delay)
                continue
            failures = 0
            if claims:
                contexts = [AttemptContext(self._store, claim) for claim in claims]
                self._on_claimed(contexts)
                if runs and request is not None:
                    self._wait_for_fetch()
                if runs and not self.inline.run(contexts):
                    return  # handed over: another thread is the dispatcher now
                if contexts:
                    state.enqueue(contexts)
            if finished:
                self._on_progress()

    def round(
        self, request: RecordRequest | None, finished: list[AttemptContext], room: int, runs: bool = False
    ) -> tuple[list[Claim], bool]:
        """Record the poller's batch (if any), settle ``finished`` and claim up to ``room``.

        With a store whose calls nest (``nests_writes``) all of it is one transaction: one commit
        (one fsync) per round instead of one per step. ``request.done`` is set once the batch is
        committed, or failed (the poller then asks Telegram for the same offset again). In inline
        mode (``runs``) ``finished`` is settled first and the batch's updates whose chats are then
        free are claimed as they are stored: no second write of those rows to claim them.
        Raises what settling or claiming raised (nothing of the round is then stored).
        """
        exchanger = self._exchanger
        if request is None:
            return exchanger.exchange(finished, room, runs)
        store = self._caps.batched
        if store is None or not self._caps.nests_writes:
            self._serve_record(request)
            request.done.set()
            return exchanger.exchange(finished, room, runs)
        early = runs and room > 0
        try:
            with store.write(durable=True):
                if not early:
                    self._serve_record(request)
                    return exchanger.exchange(finished, room, runs)
                exchanger.settle_first(finished)
                fresh = self._serve_record(request, claim=room)
                if fresh:  # a chat just given a claim has nothing else claimable now
                    with self._state.lock:
                        self._state.hint_chats.difference_update(c.chat_id for c in fresh)
                claims, more = exchanger.exchange([], room - len(fresh), runs)
                return claims + fresh, more  # the older updates (other chats) first
        except BaseException as exc:
            # The commit (or the round) failed: nothing of it was stored, the batch included.
            request.error, request.result = exc, 0
            raise
        finally:
            request.done.set()

    def final_flush(self) -> None:
        """On shutdown: settle what finished, and hand back claims that never started (attempt not counted)."""
        state = self._state
        with state.lock:
            finished, state.finished = state.finished, []
            unstarted, state.queue = list(state.queue), deque()
        try:
            self._exchanger.settle(finished)
        except Exception:
            log.error("settling finished updates at shutdown failed; they will run again", exc_info=True)
        for ctx in unstarted:
            self._exchanger.hand_back(ctx, hint=False)
        if finished:
            self._on_progress()
