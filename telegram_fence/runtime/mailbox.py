"""The writer's mailbox: everything that reaches the ``fence-dispatcher`` thread from the others.

One job: hold what the next round needs and wake the writer when that changes: batches to record and other writes
(:mod:`.handoff`), attempts whose handler returned (to settle), where claimable work may be (the chats just freed or
given updates, a full scan due), and when this pool's retries become due; and the writer's wait for all of that
(:meth:`Mailbox.next_round`). May import ``runtime.attempt``, ``runtime.decisions``, ``runtime.handoff``,
``store`` (types), ``updates`` and the standard library.

Thread safety: any thread may post or file; :meth:`Mailbox.next_round` and the hint methods are the writer's. One
lock guards it all, taken by the methods; ``room()`` (the workers') is called with it held and takes only its own.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ..store import Identity
from ..updates import chat_id_of
from . import decisions
from .attempt import AttemptContext
from .handoff import Answer, RecordRequest, WriteRequest

__all__ = ["SETTLE_HOLD", "Hints", "Mailbox", "Round"]

#: Seconds a finished attempt of a quiet chat (nothing known to wait behind it) may wait for a round that runs anyway
#: (a batch to record, a write, another settle) before a round runs for it alone.
SETTLE_HOLD = 0.1


class Round(NamedTuple):
    """What one round is given: ``closing`` (the writer's last round), the batches to record, the other writes, the
    attempts to settle and the room to claim in (0 once the pool stops)."""

    closing: bool
    requests: list[RecordRequest]
    writes: list[WriteRequest]
    finished: list[AttemptContext]
    room: int


class Hints(NamedTuple):
    """Where a round looks for claimable work: these chats and chatless updates, or everything (``scan``)."""

    chats: set[int]
    chatless: set[int]
    scan: bool


class Mailbox:
    """What the writer's next round needs (see the module docstring)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._room: Callable[[], int] = lambda: 0
        self._on_wakeup: Callable[[], None] = lambda: None
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._requests: list[RecordRequest] = []
        self._writes: list[WriteRequest] = []
        self._finished: list[AttemptContext] = []
        self._urgent = False  # a finished attempt's chat may have work waiting: settle it in the next round
        self._held_since: float | None = None  # when the oldest finished attempt of a quiet chat was filed
        self._quiet: set[int] = set()  # chats whose live claim has nothing known to wait behind it
        self._closed = False
        self._woken = True  # a chat was freed or given work since the last round looked
        self._scan_due = True
        self._chats: set[int] = set()
        self._chatless: set[int] = set()
        self._due: list[float] = []  # when retries this pool recorded become due (monotonic, a heap)

    def attach(self, stop: threading.Event, room: Callable[[], int], on_wakeup: Callable[[], None]) -> None:
        """The pool this mailbox feeds: its stop signal, ``room()`` (how many more attempts its workers take now)
        and ``on_wakeup()`` (counts the writer's wake-ups). Called once, before the writer thread starts."""
        self._stop, self._room, self._on_wakeup = stop, room, on_wakeup

    # --- any thread ----------------------------------------------------------------------------------

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
        """Take ``request`` back if no round took it yet (the writer ended); ``True`` when it was."""
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

    def file(self, ctx: AttemptContext, settle: bool) -> None:
        """An attempt ended: settled by a coming round (``settle``), or its chat is free already (retried,
        exhausted, completed, lost). Its payload is released either way."""
        ctx.release()
        with self._lock:
            if not settle:
                self._free(ctx)
            else:
                self._finished.append(ctx)
                if ctx.chat_id not in self._quiet or ctx.chat_id in self._chats:
                    self._urgent = True
                else:  # nothing waits behind it: it may ride on the next round that runs anyway
                    self._quiet.discard(ctx.chat_id)
                    if self._held_since is not None:
                        return
                    self._held_since = time.monotonic()
            self._arrived.notify()

    def claimed(self, chats: Iterable[int], quiet: set[int], behind: set[int]) -> None:
        """The writer's round claimed in ``chats``; in those of ``quiet`` nothing is known to wait behind the claim
        (its settle may be held, :data:`SETTLE_HOLD`). Work arrived in the chats ``behind`` that the round could not
        claim: their finished attempts are settled by the next round, held ones included."""
        with self._lock:
            self._quiet.difference_update(chats)
            self._quiet |= quiet
            self._quiet -= behind
            if behind and any(ctx.chat_id in behind for ctx in self._finished):
                self._urgent = True
                self._arrived.notify()

    def wake(self, *, scan: bool = False) -> None:
        """New work may be due (``scan``: anywhere, so look at the whole backlog)."""
        with self._lock:
            self._woken = True
            self._scan_due = self._scan_due or scan
            self._arrived.notify()

    def retry_due(self, at: float) -> None:
        """An update this pool retried becomes due at ``at`` (monotonic)."""
        with self._lock:
            heapq.heappush(self._due, at)
            self._arrived.notify()

    def discard(self, identities: set[Identity]) -> None:
        """Forget finished attempts of ``identities`` (their leases were lost: there is nothing to settle)."""
        with self._lock:
            self._finished = [c for c in self._finished if c.identity not in identities]

    def freed(self, contexts: Iterable[AttemptContext]) -> None:
        """``contexts``' chats no longer wait on them (handed back): look at them again."""
        with self._lock:
            for ctx in contexts:
                self._free(ctx)
            self._arrived.notify()

    def _free(self, ctx: AttemptContext) -> None:
        if ctx.chat_id is not None:
            self._chats.add(ctx.chat_id)
            self._quiet.discard(ctx.chat_id)
        else:
            self._chatless.add(ctx.update_id)
        self._woken = True

    # --- the writer's side ---------------------------------------------------------------------------

    def next_round(self, scan_period: Callable[[], float]) -> Round:
        """Wait until a round is worth running (or the writer closes) and take what it needs.

        A round runs for a batch to record or another write, for finished attempts, and for room to claim where
        work may be (a wake-up, a due retry of ours). Idle, it wakes after ``scan_period()`` (a full scan then).
        Once the pool stops it claims nothing: it serves writes and settles, until closed.
        """
        with self._lock:
            while not (self._closed or self._requests or self._writes or self._urgent):
                stopping = self._stop.is_set()
                now = time.monotonic()
                held = self._held_since
                if held is not None and (stopping or now >= held + SETTLE_HOLD):
                    break
                if not stopping and self._due and self._due[0] <= now:
                    heapq.heappop(self._due)
                    self._woken = self._scan_due = True
                if not stopping and self._woken and self._room() > 0:
                    break
                timeout = None if stopping else decisions.next_wake(
                    [now + scan_period(), self._next_due(), None if held is None else held + SETTLE_HOLD], now)
                if not self._arrived.wait(timeout):
                    self._woken = self._scan_due = True
                self._on_wakeup()
            requests, self._requests = self._requests, []
            writes, self._writes = self._writes, []
            finished, self._finished = self._finished, []
            self._urgent, self._held_since = False, None
            room = 0 if self._closed or self._stop.is_set() else self._room()
            return Round(self._closed, requests, writes, finished, room)

    def _next_due(self) -> float | None:
        return self._due[0] if self._due else None

    def pause(self, seconds: float) -> None:
        """Wait up to ``seconds`` (a failed round's back-off), less when something is posted or the writer closes."""
        with self._lock:
            if not self._closed:
                self._arrived.wait(seconds)

    def give_back(self, finished: list[AttemptContext]) -> None:
        """A round failed: its finished attempts are settled by the next one."""
        with self._lock:
            self._finished = finished + self._finished
            self._urgent = self._urgent or bool(self._finished)

    def take_finished(self) -> list[AttemptContext]:
        """Everything finished (shutdown's last settle)."""
        with self._lock:
            finished, self._finished = self._finished, []
            self._urgent, self._held_since = False, None
            return finished

    def hint(self, updates: Sequence[Mapping[str, Any]], finished: Iterable[AttemptContext] = ()) -> None:
        """Note the chats of ``updates`` (just recorded) and of ``finished`` (being settled) as places where
        claimable work may be."""
        with self._lock:
            for update in updates:
                chat_id = chat_id_of(update)
                if chat_id is None:
                    self._chatless.add(update["update_id"])
                else:
                    self._chats.add(chat_id)
            for ctx in finished:
                if ctx.chat_id is not None:
                    self._chats.add(ctx.chat_id)

    def take_hints(self, scan: bool) -> Hints:
        """The hints, cleared, and whether to scan the whole backlog instead (``scan`` or a scan asked for); the
        wake-up they stand for is served by the round taking them. Give back unserved ones with :meth:`keep_hints`."""
        with self._lock:
            self._woken = False
            hints = Hints(self._chats, self._chatless, scan or self._scan_due)
            self._chats, self._chatless, self._scan_due = set(), set(), False
            return hints

    def keep_hints(self, hints: Hints) -> None:
        """Hints a round did not serve stay for the next one, which they wake."""
        with self._lock:
            self._chats |= hints.chats
            self._chatless |= hints.chatless
            self._scan_due = self._scan_due or hints.scan
            self._woken = self._woken or bool(hints.chats or hints.chatless or hints.scan)
