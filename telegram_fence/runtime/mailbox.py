"""The dispatcher's mailbox: everything that reaches the ``fence-dispatcher`` thread from the others.

One job: hold what the dispatcher's next round needs and wake it when that changes: batches to record
(:class:`~telegram_fence.runtime.handoff.RecordRequest`), attempts whose handler returned (to settle),
where claimable work may be (the chats just freed or given updates, a full scan due), and when this
pool's retries become due; and the dispatcher's wait for all of that (:meth:`Mailbox.next_round`).
May import ``runtime.attempt``, ``runtime.decisions``, ``runtime.handoff``, ``runtime.state``,
``store`` (types), ``updates`` and the standard library.

Thread safety: any thread may post; :meth:`Mailbox.next_round` and the hint methods are the
dispatcher's. One lock (``_lock``) guards it all, taken by the methods; while it is held the mailbox
calls into ``runtime.state``'s parts (room, leases), never the other way round.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..records import Record
from ..store import Identity
from ..updates import chat_id_of
from . import decisions
from .attempt import AttemptContext
from .handoff import Answer, RecordRequest, WriteRequest
from .state import PoolState

__all__ = ["Mailbox", "Round"]


class Round(Record):
    """What one dispatcher round is given: ``closing`` (the writer's last round), ``stopping`` (no claims),
    the batches to record, the other writes, the attempts to settle, the room to claim in, and whether more
    may be claimable than the hints say (``more_due``)."""

    __slots__ = ("closing", "finished", "more_due", "requests", "room", "stopping", "writes")
    closing: bool
    stopping: bool
    requests: list[RecordRequest]
    writes: list[WriteRequest]
    finished: list[AttemptContext]
    room: int
    more_due: bool

    def __init__(self, closing: bool, stopping: bool, requests: list[RecordRequest], writes: list[WriteRequest],
                 finished: list[AttemptContext], room: int, more_due: bool) -> None:
        object.__setattr__(self, "closing", closing)
        object.__setattr__(self, "stopping", stopping)
        object.__setattr__(self, "requests", requests)
        object.__setattr__(self, "writes", writes)
        object.__setattr__(self, "finished", finished)
        object.__setattr__(self, "room", room)
        object.__setattr__(self, "more_due", more_due)


class Mailbox:
    """What the dispatcher's next round needs (see the module docstring)."""

    def __init__(self, state: PoolState) -> None:
        self._state = state
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._requests: list[RecordRequest] = []
        self._writes: list[WriteRequest] = []
        self._closed = False
        self._finished: list[AttemptContext] = []
        self._finished_at = 0.0  # when the oldest of them finished
        self._woken = True
        # Where claimable work may be: the chats (and chatless updates) that were just freed or just
        # received updates. Anything else becomes claimable only by time (retries, lapsed leases) or
        # through another process, which a periodic full scan finds.
        self._scan_due = True
        self._chats: set[int] = set()
        self._chatless: set[int] = set()
        # Chats whose open claim was taken as its update was recorded (``record_and_claim``: the chat had no open row)
        # and behind which this pool has recorded nothing since: freeing one has nothing to look at (what another
        # process recorded behind it is found by a full scan, as anything of another process is).
        self._alone: set[int] = set()
        self._due: list[float] = []  # when retries this pool recorded become due (monotonic, a heap)
        self._waiting = False

    # --- posting (any thread) ----------------------------------------------------------------------

    def post(self, request: Answer[Any]) -> None:
        """A batch to record (:class:`RecordRequest`) or another write (:class:`WriteRequest`) for the next round."""
        with self._lock:
            if isinstance(request, RecordRequest):
                self._requests.append(request)
            else:
                assert isinstance(request, WriteRequest)
                self._writes.append(request)
            self._arrived.notify()

    def withdraw(self, request: Answer[Any]) -> bool:
        """Take ``request`` back if no round took it yet (the dispatcher ended); ``True`` when it was."""
        with self._lock:
            for waiting in (self._requests, self._writes):
                if request in waiting:
                    waiting.remove(request)  # type: ignore[arg-type]
                    return True
            return False

    def close(self) -> None:
        """The writer's last round comes next: it serves what was posted, settles what finished and ends."""
        with self._lock:
            self._closed = True
            self._arrived.notify_all()

    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def file(self, ctx: AttemptContext, outcome: str, now: float) -> None:
        """File an attempt's outcome (see ``Workers.attempt``): ``"settle"`` is settled in a coming round;
        any other (retried, exhausted, completed, lost) ends the pool's lease and frees its chat. Either way the
        attempt's payload is released (:meth:`AttemptContext.release`): a finished attempt waiting for its settle
        would otherwise keep its update's dicts alive while the next rounds run."""
        ctx.release()
        if outcome == "settle":
            self.finished(ctx, now)
        else:
            self._state.leases.drop((ctx,))
            self.freed(ctx)

    def file_many(self, done: Sequence[tuple[AttemptContext, str, float]]) -> None:
        """:meth:`file` each ``(ctx, outcome, when)`` of ``done`` (in order), taking the lock once for them all (each
        attempt's payload released, as there)."""
        if not done:
            return
        for ctx, _outcome, _when in done:
            ctx.release()
        state = self._state
        ended = [ctx for ctx, outcome, _when in done if outcome != "settle"]
        if ended:
            state.leases.drop(ended)
        with self._lock:
            for ctx, outcome, when in done:
                if outcome == "settle":
                    self._finish_locked(ctx, when)
                else:
                    self._free_locked(ctx)
            if self._waiting:
                self._arrived.notify()

    def finished(self, ctx: AttemptContext, now: float) -> None:
        """``ctx``'s handler returned: settle it in a coming round."""
        with self._lock:
            self._finish_locked(ctx, now)
            if self._waiting:
                self._arrived.notify()

    def freed(self, ctx: AttemptContext) -> None:
        """``ctx``'s chat no longer waits on it (retried, exhausted, completed, lost or handed back)."""
        with self._lock:
            self._free_locked(ctx)
            if self._waiting:
                self._arrived.notify()

    def _finish_locked(self, ctx: AttemptContext, now: float) -> None:
        """Queue ``ctx`` for a coming round's settles (the first one queued since a round took them sets
        ``_finished_at``). The caller holds the lock and notifies a waiting dispatcher."""
        if not self._finished:
            self._finished_at = now
        self._finished.append(ctx)

    def _free_locked(self, ctx: AttemptContext) -> None:
        """Mark ``ctx``'s chat (or, chatless, its update) as free to claim again, and the mailbox as woken. The caller
        holds the lock and notifies a waiting dispatcher."""
        if ctx.chat_id is not None:
            self._chats.add(ctx.chat_id)
            self._alone.discard(ctx.chat_id)
        else:
            self._chatless.add(ctx.update_id)
        self._woken = True

    def wake(self, *, scan: bool = False) -> None:
        """New work may be due (``scan``: anywhere, so look at the whole backlog)."""
        with self._lock:
            self._woken = True
            self._scan_due = self._scan_due or scan
            self._arrived.notify()

    def notify_all(self) -> None:
        """Wake a waiting dispatcher to look at the pool's stop."""
        with self._lock:
            self._arrived.notify_all()

    def retry_due(self, at: float) -> None:
        """An update this pool retried becomes due at ``at`` (monotonic)."""
        with self._lock:
            heapq.heappush(self._due, at)
            if self._waiting:
                self._arrived.notify()

    def discard(self, identities: set[Identity]) -> None:
        """Forget finished attempts of ``identities`` (their leases were lost: there is nothing to settle)."""
        with self._lock:
            self._finished = [c for c in self._finished if c.identity not in identities]

    # --- the dispatcher's side ---------------------------------------------------------------------

    def next_round(self, more_due: bool, scan_period: Callable[[bool], float]) -> Round:
        """Wait until a round is worth running (or the writer closes) and take what it needs.

        A round runs for a batch to record or another write, for room to claim where work may be
        (``more_due``, a wake-up, a due retry of ours), and for finished attempts once they waited
        ``settle_hold``. Idle, it wakes for ``scan_period(idle)`` (a full scan then) and for this pool's next
        due retry. Once the pool stops it claims nothing: it serves writes and settles at once, until closed.
        """
        state = self._state
        with self._lock:
            while not self._closed and not self._requests and not self._writes:
                now = time.monotonic()
                if state.stop.is_set():
                    if self._finished:
                        break
                    timeout: float | None = None
                else:
                    if self._due and self._due[0] <= now:  # a retry of ours is due: look at the whole backlog
                        more_due = self._scan_due = True
                    if state.room() > 0 and (more_due or self._woken):
                        break
                    timeout = decisions.next_wake([now + scan_period(not state.leases), self._next_due(now)], now)
                    if self._finished:
                        hold = state.handler_time.settle_hold(self._finished_at, now)
                        if hold <= 0:
                            break
                        timeout = hold
                self._waiting = True
                timed_out = not self._arrived.wait(timeout) and not self._finished
                self._waiting = False
                state.counters.add("dispatcher_wakeups")
                if timed_out:
                    more_due = self._scan_due = True
            closing = self._closed
            stopping = closing or state.stop.is_set()
            requests, self._requests = self._requests, []
            writes, self._writes = self._writes, []
            room = 0 if stopping else state.room()
            finished: list[AttemptContext] = []
            if self._finished or room > 0:
                self._woken = False
                finished, self._finished = self._finished, []
        return Round(closing, stopping, requests, writes, finished, room, more_due)

    def pause(self, seconds: float) -> None:
        """Wait up to ``seconds`` (a failed round's back-off), less when something is posted or the writer closes."""
        with self._lock:
            if not self._closed:
                self._arrived.wait(seconds)

    def give_back(self, finished: list[AttemptContext]) -> None:
        """A round failed: its finished attempts are settled by the next one."""
        with self._lock:
            self._finished = finished + self._finished

    def take_finished(self) -> list[AttemptContext]:
        """Everything finished (shutdown's last settle)."""
        with self._lock:
            finished, self._finished = self._finished, []
            return finished

    def hint(self, updates: Sequence[Mapping[str, Any]]) -> None:
        """Note the chats of ``updates`` (just recorded, not claimed) as places where claimable work may be."""
        with self._lock:
            for update in updates:
                chat_id = chat_id_of(update)
                if chat_id is None:
                    self._chatless.add(update["update_id"])
                else:
                    self._chats.add(chat_id)
                    self._alone.discard(chat_id)  # something waits behind its claim
            self._woken = True

    def claimed_fresh(self, chats: Iterable[int | None]) -> None:
        """``chats`` were just given claims of updates recorded in the same call (``record_and_claim``: none of them
        had an open row): unless this pool records more of theirs before they are freed, freeing them hints
        nothing (:meth:`hint_freed`). Call it before :meth:`hint` for the same batch's waiting updates."""
        with self._lock:
            self._alone.update(chat for chat in chats if chat is not None)

    def hint_freed(self, finished: Iterable[AttemptContext]) -> None:
        """Note the chats of ``finished`` (settled in this round) as freed: each is looked at again, but for a chat
        claimed fresh with nothing recorded behind it since (:meth:`claimed_fresh`), which has nothing to claim."""
        with self._lock:
            chats = {ctx.chat_id for ctx in finished if ctx.chat_id is not None}
            alone = chats & self._alone
            if alone:
                self._alone -= alone
                chats -= alone
            self._chats |= chats

    def unhint(self, chats: Iterable[int | None]) -> None:
        """``chats`` were just given a claim: nothing else is claimable in them now."""
        with self._lock:
            self._chats.difference_update(chats)

    def take_hints(self, scan: bool) -> tuple[set[int], set[int], bool]:
        """The hinted chats and chatless updates, and whether to scan the whole backlog instead (``scan``
        or a scan asked for); the hints are cleared, and so is the wake-up they stand for (the round taking them
        serves it: a round recording a batch would otherwise be followed by an empty one, woken by its own
        hints). Give them back with :meth:`keep_hints` if unserved."""
        with self._lock:
            self._woken = False
            scan = scan or self._scan_due
            chats, self._chats = self._chats, set()
            chatless, self._chatless = self._chatless, set()
            self._scan_due = False
            return chats, chatless, scan

    def keep_hints(self, chats: set[int], chatless: set[int], scan: bool = False) -> None:
        """Hints a round did not serve stay for the next one (``scan``: a full scan is still due), which they
        wake."""
        with self._lock:
            self._chats |= chats
            self._chatless |= chatless
            self._scan_due = self._scan_due or scan
            if chats or chatless or scan:
                self._woken = True

    def _next_due(self, now: float) -> float | None:
        """The earliest noted retry time still ahead of ``now`` (passed ones are dropped; lock held)."""
        due = self._due
        while due and due[0] <= now:
            heapq.heappop(due)
        return due[0] if due else None
