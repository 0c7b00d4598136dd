"""The handler threads: as many as handlers in flight, up to ``workers``, each ending after a while without work.

The store gives a chat one claim at a time, so a chat's updates run in order while a slow handler holds one thread
and never another chat.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from .attempt import AttemptContext
from .state import PoolState, guarded_thread

__all__ = ["IDLE_SECONDS", "Workers"]

#: Seconds a worker thread waits for work before it ends.
IDLE_SECONDS = 10.0


class _Slot:
    """One worker thread: the attempt it runs, and whether it was abandoned (``handler_timeout``) or left."""

    __slots__ = ("abandoned", "current", "gone")

    def __init__(self) -> None:
        self.current: AttemptContext | None = None
        self.abandoned = False
        self.gone = False


class Workers:
    """The handler threads ``fence-worker-N``: as many as handlers in flight, up to ``cap``, each ending after
    :data:`IDLE_SECONDS` without work. A claim queued while no thread waits starts one; the threads start one after
    another (each, taking its claim, starts the next while claims wait), so fast handlers are run by the few threads
    they keep busy and slow ones get a thread each. ``run(ctx)`` runs one attempt and answers whether to settle it;
    ``done(ctx, settle, ended)`` files how it ended and calls ``ended()`` as it files, so the thread stops counting
    against :meth:`room` in the same step that hands its attempt to the writer. Any thread may call it; one lock
    guards the queue and the slots."""

    def __init__(self, state: PoolState, *, cap: int, run: Callable[[AttemptContext], bool],
                 done: Callable[[AttemptContext, bool, Callable[[], None]], None]) -> None:
        self._state = state
        self._cap = cap
        self._run = run
        self._done = done
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._items: deque[AttemptContext] = deque()
        self._slots: dict[threading.Thread, _Slot] = {}
        self._idle = 0  # threads waiting for work
        self._running = 0  # attempts running, not counting abandoned ones
        self._serial = 0
        self._starting = 0  # threads started that did not take a claim yet
        self._closed = False

    def put(self, contexts: list[AttemptContext]) -> None:
        """Queue ``contexts`` (in order) for the waiting threads; a new thread starts when claims are left over."""
        with self._lock:
            self._items.extend(contexts)
            if self._closed:
                return  # handed back by the writer's last round
            self._ready.notify(min(len(contexts), self._idle))
            thread = self._more()
        if thread is not None:
            thread.start()

    def _more(self) -> threading.Thread | None:
        """A new worker thread (not started) when claims wait that no waiting or starting thread will take and the
        cap allows one; else ``None``. Lock held; ended threads are joined and forgotten here."""
        if len(self._items) <= self._idle + self._starting:
            return None
        for thread in [t for t, slot in self._slots.items() if slot.gone and not t.is_alive()]:
            thread.join()
            del self._slots[thread]
        if sum(1 for slot in self._slots.values() if not slot.gone and not slot.abandoned) >= self._cap:
            return None
        self._serial += 1
        self._starting += 1
        slot = _Slot()
        thread = guarded_thread(lambda: self._loop(slot), f"fence-worker-{self._serial}", self._state.on_fatal)
        self._slots[thread] = slot
        return thread

    def _take(self, slot: _Slot, first: bool) -> tuple[AttemptContext | None, threading.Thread | None]:
        """The next attempt for ``slot``'s thread (``None``: closed, or idle too long: it ends), and a new thread to
        start when claims still wait."""
        with self._lock:
            if first:
                self._starting -= 1
            while not self._items and not self._closed:
                self._idle += 1
                woken = self._ready.wait(IDLE_SECONDS)
                self._idle -= 1
                if not woken and not self._items:
                    break
            if self._closed or not self._items:
                slot.gone = True
                return None, None
            ctx = self._items.popleft()
            slot.current = ctx
            self._running += 1
            return ctx, self._more()

    def _loop(self, slot: _Slot) -> None:
        state = self._state
        first = True
        while True:
            ctx, more = self._take(slot, first)
            first = False
            if more is not None:
                more.start()
            if ctx is None:
                state.alarm.by(time.monotonic())  # a stopped pool's heartbeat looks whether it drained
                return
            ctx.started = started = time.monotonic()
            state.alarm.by(started + state.handler_timeout)
            settle = self._run(ctx)
            with self._lock:
                slot.current = None
                if slot.abandoned:  # taken away (handler_timeout): this thread ends
                    slot.gone = True
                    return
            self._done(ctx, settle, self._ended)

    def _ended(self) -> None:
        with self._lock:
            self._running -= 1

    def room(self) -> int:
        """How many more attempts to claim now: the cap less those queued and running."""
        with self._lock:
            return self._cap - len(self._items) - self._running

    def close(self) -> None:
        """End every thread once its attempt returned; what is queued stays for :meth:`drain`."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()

    def drain(self) -> list[AttemptContext]:
        """Take everything queued (shutdown: handed back to the store)."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            return items

    def discard(self, contexts: set[AttemptContext]) -> None:
        """Drop queued ``contexts`` (their leases were lost: nobody runs them)."""
        with self._lock:
            self._items = deque(c for c in self._items if c not in contexts)

    def take_timed_out(self, now: float) -> list[AttemptContext]:
        """Abandon every thread whose handler ran ``handler_timeout`` or longer; their attempts."""
        stuck = []
        with self._lock:
            for slot in self._slots.values():
                ctx = slot.current
                if slot.abandoned or ctx is None or ctx.started is None \
                        or now - ctx.started < self._state.handler_timeout:
                    continue
                slot.abandoned = True
                self._running -= 1
                stuck.append(ctx)
        return stuck

    def earliest_start(self) -> float | None:
        """When the longest-running handler started (monotonic), ``None`` when none runs."""
        with self._lock:
            starts = [s.current.started for s in self._slots.values()
                      if not s.abandoned and s.current is not None and s.current.started is not None]
        return min(starts) if starts else None

    def running(self) -> int:
        """Attempts running now (abandoned ones not counted)."""
        with self._lock:
            return self._running

    def alive(self) -> int:
        """Worker threads alive, neither abandoned nor leaving."""
        with self._lock:
            return sum(1 for t, s in self._slots.items() if t.is_alive() and not s.abandoned and not s.gone)

    def join(self, deadline: float) -> bool:
        """Join every worker thread until ``deadline`` (monotonic); ``True`` when all ended."""
        with self._lock:
            threads = list(self._slots)
        for thread in threads:
            if thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)
