"""The webhook intake's group commit: checked deliveries queued, committed together, each answered after its commit.

One job: :class:`GroupCommit`, which the intake (``ingress.webhook``) gives each checked delivery and which returns
its status once the transaction holding it ended; what a commit writes is the intake's (``record``). Two ways:

- **Its own committer** (``fence-webhook-commit``, started when a delivery first has to wait): it takes everything
  queued, records it in one ``record`` call, answers those requests, and at once takes what queued meanwhile. A
  delivery that finds nobody committing, on a thread that served a delivery before (a server's thread pool), commits
  on its own thread instead: no hand-off to the committer and back when deliveries come one at a time. A new thread
  per request (the standard library server) always queues, so the store does not open a connection per request.
- **A writer's hand-off** (:class:`GroupHandOff`, a fence's): the first delivery queued while no group is posted
  posts one; the writer takes everything queued by the time its round begins and answers it once the round
  committed, on its own thread. No committer thread, and no thread waits for the writer in between. While no
  writer takes posts (before it starts, after it ended) the poster commits what is queued on its own thread.

Either way each request thread blocks on a lock of its own until the commit that holds its update ended. The
committer (or a poster committing on its own thread) wakes the first request of the group, each woken request the
next before anything else it does (a relay): one wake-up per request, and two threads at a time, not the whole
group, compete for the interpreter lock. A writer wakes every request of its group itself: its thread goes on to
its handlers and its next round, and a relay then reached the group's last request only after each of the others
had taken the interpreter lock in turn. When a group's transaction
fails its updates are recorded one by one, so one bad update fails only its own request.

Imports: the standard library and ``ingress.webhook_body`` (its 503 refusal).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from itertools import pairwise
from typing import Any, Protocol, runtime_checkable

from .webhook_body import Rejected

__all__ = ["Delivery", "GroupCommit", "GroupHandOff"]

log = logging.getLogger("telegram_fence.webhook_group")

#: How often a delivery posted to a hand-off looks whether its writer is still there (seconds).
_LOOK = 0.5

#: What a group's ``record`` call is given: the updates and the ``record`` keywords.
Taken = tuple[list[Mapping[str, Any]], dict[str, Any]]


@runtime_checkable
class GroupHandOff(Protocol):
    """A writer that takes the intake's groups itself, with no thread of the intake waiting in between (a fence's:
    its dispatcher takes what is queued when its round begins and answers it once the round committed).

    ``post(take, done)`` asks the writer to call ``take()`` (on its thread, when it begins to write: the updates
    queued by then and the ``record`` keywords, or ``None`` for nothing) and, after the transaction holding them
    ended, ``done(error)`` (``None``: committed); it returns a ticket, or ``None`` when no writer takes groups now
    (the caller then commits them itself). ``orphaned(ticket)`` is ``True`` when the writer went away without
    taking that post, which it then never takes."""

    def post(self, take: Callable[[], Taken | None], done: Callable[[BaseException | None], None]) -> object | None:
        """Post a group for the writer's next round (see the class docstring)."""
        ...

    def orphaned(self, ticket: object) -> bool:
        """Whether ``ticket``'s post was withdrawn because its writer went away (see the class docstring)."""
        ...


class Delivery:
    """One checked update waiting for its commit: ``status`` (and ``after``, the next delivery of the group,
    which its request thread wakes; ``redo``, a group its writer failed to record, which its thread records one
    by one) is set before ``ready`` is released."""

    __slots__ = ("after", "raw", "ready", "redo", "skip", "status", "update")

    def __init__(self, update: dict[str, Any], raw: bytes, skip: bool) -> None:
        self.update = update
        self.raw = raw
        self.skip = skip
        self.status = 500
        self.after: Delivery | None = None  # the next of its group to release, once this one is awake
        self.redo: list[Delivery] | None = None  # the group the writer failed to record: this thread records it
        self.ready = threading.Lock()  # held until the commit ended: the request thread blocks on it
        self.ready.acquire()


class _Ticket:
    """The one group posted to a :class:`GroupHandOff` and not yet taken (``token``: what ``post`` returned;
    ``group``: the deliveries the writer took)."""

    __slots__ = ("group", "token")

    def __init__(self) -> None:
        self.token: object | None = None
        self.group: list[Delivery] = []


class _ThreadMemory(threading.local):
    """What is remembered per request thread: ``served``, whether it served a delivery before."""

    served: bool = False


class GroupCommit:
    """Commits checked deliveries in groups (see the module docstring).

    ``record(group)``: one transaction for ``group``, each status 200 once it committed (raises what the store
    raised); ``prepare(group)``: the updates and keywords of that ``record`` call, and ``stored(group)``: the group
    committed (for the writer's hand-off, which makes the call itself); ``failed(delivery, exc)``: its own
    transaction failed too; ``count(key)``: ``received``, ``inline`` and ``fallbacks`` counted (``received`` with
    this object's lock held: ``count`` must not call back into it). Thread safety: any number of
    request threads call :meth:`submit` at once; :meth:`close` and :meth:`waiting` from any thread.
    """

    def __init__(
        self,
        *,
        record: Callable[[list[Delivery]], None],
        prepare: Callable[[list[Delivery]], Taken],
        stored: Callable[[list[Delivery]], None],
        failed: Callable[[Delivery, Exception], None],
        count: Callable[[str], None],
        hand_off: GroupHandOff | None = None,
    ) -> None:
        self._record = record
        self._prepare = prepare
        self._stored = stored
        self._failed = failed
        self._count = count
        self._hand_off = hand_off
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the committer waits here while nothing is queued
        self._queue: list[Delivery] = []
        self._committer: threading.Thread | None = None
        self._idle = False  # the committer waits for work
        self._inline = False  # a request thread commits on its own now (nobody else was committing)
        self._ticket: _Ticket | None = None  # the group posted to the hand-off and not taken yet (or being committed
        # by its poster while no writer takes posts)
        self._in_writer = 0  # groups the hand-off's writer took and has not answered yet
        self._threads = _ThreadMemory()
        self._closed = False

    def submit(self, delivery: Delivery) -> int:
        """Commit ``delivery`` and return its status once the commit that holds it ended; ``Rejected(503)`` after
        :meth:`close`."""
        if self._hand_off is not None:
            return self._handed(delivery, self._hand_off)
        known = self._threads
        inline = known.served  # a pool thread: it has its own store connection already
        known.served = True
        with self._lock:
            if self._closed:
                raise Rejected(503, "the intake is closed")
            self._count("received")
            if inline and not self._queue and not self._inline and (self._committer is None or self._idle):
                self._inline = True  # nobody commits: no hand-off to the committer and back
            else:
                inline = False
                self._queue.append(delivery)
                if self._committer is None:
                    self._committer = threading.Thread(target=self._run, name="fence-webhook-commit", daemon=True)
                    self._committer.start()
                elif self._idle:
                    self._idle = False
                    self._wake.notify()
        if not inline:
            delivery.ready.acquire()
            after = delivery.after
            if after is not None:  # the relay: wake the next of the group before anything of this request
                after.ready.release()
            return delivery.status
        self._count("inline")
        try:
            self.commit([delivery])
        finally:
            with self._lock:
                self._inline = False
                if self._closed:
                    self._wake.notify_all()  # close() waits for this commit
        return delivery.status

    def commit(self, group: list[Delivery]) -> None:
        """Record ``group`` in one transaction on this thread; when that fails, each in one of its own."""
        try:
            self._record(group)
        except Exception as exc:
            if len(group) == 1:
                self._failed(group[0], exc)
                return
            self._count("fallbacks")
            log.warning("a group commit failed; recording its updates one by one",
                        extra={"updates": len(group), "err": exc})
            self._one_by_one(group)

    def waiting(self) -> int:
        """Deliveries queued now for the next commit."""
        with self._lock:
            return len(self._queue)

    def close(self, timeout: float | None = 10.0) -> bool:
        """Refuse later deliveries (503); what is queued is still committed and answered, then the committer ends.
        Waits up to ``timeout`` seconds for that (and for commits on request threads or in the writer); returns
        whether all ended. Safe from any thread; idempotent."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            committer = self._committer
        if committer is not None and committer is not threading.current_thread():
            committer.join(timeout)
            if committer.is_alive():
                return False
        with self._lock:
            return self._wake.wait_for(
                lambda: not self._inline and not self._in_writer and self._ticket is None,
                None if deadline is None else max(0.0, deadline - time.monotonic()))

    # --- through a writer's hand-off ------------------------------------------------------------

    def _handed(self, delivery: Delivery, hand_off: GroupHandOff) -> int:
        """:meth:`submit` through the hand-off: queue ``delivery``; the first delivery queued while no group is
        posted posts one. When no writer takes it, or its writer went away without taking it, the poster commits
        what is queued on its own thread."""
        with self._lock:
            if self._closed:
                raise Rejected(503, "the intake is closed")
            self._count("received")
            self._queue.append(delivery)
            if self._ticket is not None:
                ticket = None  # a posted group takes it along
            else:
                ticket = self._ticket = _Ticket()
        if ticket is not None:
            self._post(ticket, delivery, hand_off)
        while not delivery.ready.acquire(timeout=_LOOK):
            with self._lock:
                waiting = self._ticket
            if waiting is not None and waiting.token is not None and hand_off.orphaned(waiting.token):
                waiting.token = None
                self._post(waiting, None, hand_off)  # the writer went away: this thread commits what is queued
        redo, after = delivery.redo, delivery.after
        if redo is not None:  # the writer could not record the group: one by one, from this thread
            self._one_by_one(redo)
            self._release(redo[1:])
        if after is not None:  # the relay: wake the next of the group before anything of this request
            after.ready.release()
        return delivery.status

    def _post(self, ticket: _Ticket, mine: Delivery | None, hand_off: GroupHandOff) -> None:
        """Post ``ticket`` to the hand-off; while no writer takes it, commit what is queued on this thread and wake
        it (``mine``, this thread's own delivery, is only marked answered)."""
        while True:
            token = hand_off.post(partial(self._take, ticket), partial(self._done, ticket))
            if token is not None:
                ticket.token = token
                return
            with self._lock:
                group, self._queue = self._queue, []
                self._inline = True
            try:
                if group:
                    self.commit(group)
            finally:
                with self._lock:
                    self._inline = False
                    more = bool(self._queue)
                    if not more:
                        self._ticket = None
                    if self._closed:
                        self._wake.notify_all()  # close() waits for this commit
                self._release([d for d in group if d is not mine])
                if mine is not None and mine in group:
                    mine.ready.release()  # committed here: its own wait returns at once
            if not more:
                return

    def _take(self, ticket: _Ticket) -> Taken | None:
        """The hand-off's writer begins its round: everything queued is its group (writer's thread)."""
        with self._lock:
            if self._ticket is ticket:
                self._ticket = None  # the next delivery posts the next group
            group, self._queue = self._queue, []
            if group:
                self._in_writer += 1
        ticket.group = group
        if not group:
            return None
        return self._prepare(group)

    def _done(self, ticket: _Ticket, error: BaseException | None) -> None:
        """The transaction holding ``ticket``'s group ended (writer's thread): wake every delivery of it. A group that
        failed is recorded one by one by its first delivery's thread."""
        group = ticket.group
        if not group:
            return
        try:
            if error is None:
                self._stored(group)
                for delivery in group:  # each woken here: none waits for another request thread to pass it on
                    delivery.ready.release()
            else:
                self._count("fallbacks")
                log.warning("a group commit failed; recording its updates one by one",
                            extra={"updates": len(group), "err": error})
                group[0].redo = group
                group[0].ready.release()
        finally:
            with self._lock:
                self._in_writer -= 1
                if self._closed:
                    self._wake.notify_all()

    # --- the committer ----------------------------------------------------------------------------

    def _run(self) -> None:
        """The committer: commit everything queued in one transaction, answer it, repeat until closed."""
        while True:
            with self._lock:
                while not self._queue:
                    if self._closed:
                        return
                    self._idle = True
                    self._wake.wait()
                self._idle = False
                group, self._queue = self._queue, []
            try:
                self.commit(group)
            except BaseException:  # never leave a request waiting, whatever happened
                log.critical("the webhook committer failed; its requests answer 500", exc_info=True)
            finally:
                self._release(group)

    def _one_by_one(self, group: list[Delivery]) -> None:
        """Record each of ``group`` in a transaction of its own (after its group failed)."""
        for delivery in group:
            try:
                self._record([delivery])
            except Exception as one:
                self._failed(delivery, one)

    @staticmethod
    def _release(group: list[Delivery]) -> None:
        """Wake ``group`` (its commit ended): the first here, each woken one the next."""
        for delivery, after in pairwise(group):
            delivery.after = after
        if group:
            group[0].ready.release()
