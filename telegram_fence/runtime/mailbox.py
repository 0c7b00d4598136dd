"""The writer's mailbox: batches and writes to do, finished attempts, hints of where work may be, due retries, and
the writer's wait for them.

The requests it carries (:class:`RecordRequest`, :class:`WriteRequest`) are answers their senders wait on; the other
threads post them through :class:`Writer` and wait. Any thread may post or file; :meth:`Mailbox.next_round` and the
hint methods are the writer's. One lock guards it all.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Generic, NamedTuple, TypeVar, cast

from ..store import Identity
from ..updates import chat_id_of
from .attempt import AttemptContext

__all__ = ["SETTLE_HOLD", "Abandoned", "Answer", "Hints", "Mailbox", "RecordRequest", "Round", "WriteRequest", "Writer",
           "joined"]

T = TypeVar("T")


class Answer(Generic[T]):
    """The answer to one request, set once by the writer thread: ``keep`` or ``fail``, then ``finish``; the sender
    reads ``outcome`` only after ``wait`` returned ``True``."""

    __slots__ = ("_done", "_error", "_result")

    def __init__(self, empty: T) -> None:
        self._done = threading.Event()
        self._result: T = empty
        self._error: BaseException | None = None

    def keep(self, result: T) -> None:
        """The request's result (final once :meth:`finish` is called; replaces a failure kept before)."""
        self._result = result
        self._error = None

    def fail(self, error: BaseException) -> None:
        """The request failed (or the transaction holding it did): nothing of it was stored."""
        self._error = error

    def finish(self) -> None:
        """The answer is final: wake the sending thread."""
        self._done.set()

    def wait(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds for the answer; ``True`` once it is final."""
        return self._done.wait(timeout)

    def outcome(self) -> T:
        """The result; raises what the request raised (call after :meth:`wait` returned ``True``)."""
        if self._error is not None:
            raise self._error
        return self._result


class RecordRequest(Answer[int]):
    """A batch to record (``store.record(updates, next_offset, **kwargs)``) on the writer's thread."""

    __slots__ = ("kwargs", "next_offset", "updates")

    def __init__(self, updates: Sequence[Mapping[str, Any]], next_offset: int, kwargs: dict[str, Any]) -> None:
        super().__init__(0)
        self.updates = updates
        self.next_offset = next_offset
        self.kwargs = kwargs


class WriteRequest(Answer[Any]):
    """A store write ``fn()`` to run on the writer's thread; its result or exception is the answer. ``durable``: it
    needs the store's strongest commit (a round holding one commits durably); ``False`` for retries, renewals and
    releases."""

    __slots__ = ("_fn", "durable")

    def __init__(self, fn: Callable[[], Any], durable: bool = True) -> None:
        super().__init__(None)
        self._fn = fn
        self.durable = durable

    def run(self, savepoint: Callable[[], AbstractContextManager[Any]] | None = None) -> None:
        """Run the write now, inside ``savepoint()`` when given, and keep its result or its ``Exception``."""
        try:
            if savepoint is None:
                self.keep(self._fn())
            else:
                with savepoint():
                    self.keep(self._fn())
        except Exception as exc:
            self.fail(exc)


@contextmanager
def joined(writes: Sequence[WriteRequest], transaction: Callable[[], AbstractContextManager[Any]]) -> Iterator[None]:
    """Run each of a round's ``writes`` in a savepoint of ``transaction()`` (the round's), then the block; answer them
    once it ended. A write that raises fails alone. When the round fails (an ``Exception``) each write runs again on
    its own (they are fenced or idempotent, so a commit whose answer was lost changes nothing) and the round's
    exception is raised; a ``BaseException`` fails them all with it. Writer thread only.
    """
    try:
        with transaction():
            for write in writes:
                write.run(transaction)
            yield
    except Exception:
        for write in writes:
            write.run()
        raise
    except BaseException as exc:
        for write in writes:
            write.fail(exc)
        raise
    finally:
        for write in writes:
            write.finish()


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
        """The pool this mailbox feeds: its stop, ``room()`` (how many more attempts its workers take now) and
        ``on_wakeup()``. Called once, before the writer thread starts."""
        self._stop, self._room, self._on_wakeup = stop, room, on_wakeup

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

    def file(self, ctx: AttemptContext, settle: bool, ended: Callable[[], None] | None = None) -> None:
        """An attempt ended: settled by a coming round (``settle``), or its chat is free already. Its payload is
        released either way. ``ended()`` runs under the lock the round takes its room with, so no round sees the
        worker's room free before it sees the attempt to settle (claims stay within ``workers``)."""
        ctx.release()
        with self._lock:
            if ended is not None:
                ended()
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
        """A round claimed in ``chats``; in ``quiet`` nothing is known to wait behind the claim (its settle may be
        held); in ``behind`` work waits that it could not claim (their finished attempts are settled next round)."""
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

    def _free(self, ctx: AttemptContext) -> None:
        if ctx.chat_id is not None:
            self._chats.add(ctx.chat_id)
            self._quiet.discard(ctx.chat_id)
        else:
            self._chatless.add(ctx.update_id)
        self._woken = True

    def next_round(self, scan_period: Callable[[], float]) -> Round:
        """Wait until a round is worth running (a batch, a write, finished attempts, room where work may be) or the
        writer closes, and take what it needs. Idle, it wakes after ``scan_period()``; once the pool stops it claims
        nothing."""
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
                deadlines = [now + scan_period(), *self._due[:1], *([] if held is None else [held + SETTLE_HOLD])]
                timeout = None if stopping else max(0.0, min(deadlines) - now)
                if not self._arrived.wait(timeout):
                    self._woken = self._scan_due = True
                self._on_wakeup()
            requests, self._requests = self._requests, []
            writes, self._writes = self._writes, []
            finished, self._finished = self._finished, []
            self._urgent, self._held_since = False, None
            room = 0 if self._closed or self._stop.is_set() else self._room()
            return Round(self._closed, requests, writes, finished, room)

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
        """Note the chats of ``updates`` (just recorded) and ``finished`` (being settled) as places work may be."""
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
        """The hints, cleared, and whether to scan the whole backlog instead (``scan`` or a scan asked for)."""
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


#: How often a waiting sender looks whether the writer is still there (seconds).
_LOOK = 0.5


class Abandoned(Exception):
    """The sender stopped waiting for its write (``while_waiting`` said so); the write may still run later."""


class Writer:
    """The way to the one writer: every store write of a running fence posted to the writer thread and waited for.
    Called on the writer thread itself, or while no writer serves (before ``start``, after the join, a writer that
    died), a write runs on the calling thread instead (``record`` is the store's, for that). Any thread may call it.
    """

    def __init__(self, mailbox: Mailbox, record: Callable[..., int]) -> None:
        self.mailbox = mailbox
        self._record = record
        self._thread: threading.Thread | None = None

    def serve(self, thread: threading.Thread) -> None:
        """``thread`` (the pool's ``fence-dispatcher``) takes the writes from now on, while it is alive."""
        self._thread = thread

    def serving(self) -> bool:
        """Whether a writer thread runs and takes writes."""
        thread = self._thread
        return thread is not None and thread.is_alive() and not self.mailbox.closed()

    def _direct(self) -> bool:
        return threading.current_thread() is self._thread or not self.serving()

    def record(self, updates: Sequence[Mapping[str, Any]], next_offset: int, **kwargs: Any) -> int:
        """``store.record(updates, next_offset, **kwargs)`` done by the writer; returns once it committed.
        Raises what ``store.record`` (or the transaction holding it) raised."""
        if self._direct():
            return int(self._record(updates, next_offset, **kwargs))
        request = RecordRequest(updates, next_offset, kwargs)
        if not self._wait(request, None):
            return int(self._record(updates, next_offset, **kwargs))
        return request.outcome()

    def call(self, fn: Callable[[], T], *, while_waiting: Callable[[], bool] | None = None,
             durable: bool = True) -> T:
        """``fn()`` (a store write) done by the writer; returns its result or raises its exception once the round
        holding it committed. ``durable=False``: ``fn`` commits at the store's work level (a retry, a renewal, a
        release). ``while_waiting()`` is asked every 50 ms; when it returns ``False`` the wait ends with
        :class:`Abandoned`."""
        if self._direct():
            return fn()
        request = WriteRequest(fn, durable)
        if not self._wait(request, while_waiting):
            return fn()
        return cast(T, request.outcome())

    def _wait(self, request: Answer[Any], while_waiting: Callable[[], bool] | None) -> bool:
        """Post ``request`` and wait for it; ``False`` when the writer went away before taking it (the caller then
        does the write itself)."""
        self.mailbox.post(request)
        look = _LOOK if while_waiting is None else 0.05
        waited = 0.0
        while not request.wait(look):
            waited += look
            if while_waiting is not None and not while_waiting():
                raise Abandoned("stopped waiting for the writer")
            if waited >= _LOOK:
                waited = 0.0
                if not self.serving() and self.mailbox.withdraw(request):
                    return False
        return True
