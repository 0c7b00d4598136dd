"""What other threads hand to the writer (the dispatcher thread), and the answers they wait on.

One job: the requests the dispatcher's mailbox carries to the one thread that owns the store's writes:
:class:`RecordRequest` (a batch to record: the poller's, the webhook intake's) and :class:`WriteRequest`
(any other store write: a retry, an exhaustion, renewals, a release), each an answer its sender waits on;
and :class:`Writes`, a round's other writes joined into its transaction. May import the standard library only.

Thread safety: the dispatcher calls ``keep`` or ``fail`` before ``finish``; the sending thread reads
``outcome`` only after ``wait`` returned ``True`` (the event orders them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Generic, TypeVar

__all__ = ["Answer", "RecordRequest", "WriteRequest", "Writes"]

T = TypeVar("T")


class Answer(Generic[T]):
    """The answer to one request, set once by the writer thread (see the module docstring)."""

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
    """A store write ``fn()`` to run on the writer's thread; its result or exception is the answer.

    ``durable``: the write may need the store's strongest commit (an exhaustion, an acknowledgement, a generation:
    a SQLite store refuses to nest those in a transaction that commits weaker); a round holding one commits
    durably. ``False`` for the frequent ones that commit at the work level (retries, renewals, releases).
    """

    __slots__ = ("_fn", "durable")

    def __init__(self, fn: Callable[[], Any], durable: bool = True) -> None:
        super().__init__(None)
        self._fn = fn
        self.durable = durable

    def run(self, savepoint: Callable[[], AbstractContextManager[Any]] | None = None) -> None:
        """Run the write now (writer thread) and keep its result or its ``Exception``; does not finish.
        ``savepoint``: run it inside that block (a savepoint of the round's transaction), so a write that raises
        undoes only its own changes."""
        try:
            if savepoint is None:
                self.keep(self._fn())
            else:
                with savepoint():
                    self.keep(self._fn())
        except Exception as exc:
            self.fail(exc)


class Writes:
    """The other threads' writes taken by one round (writer thread only).

    Joined into the round's transaction (:meth:`joined`) where the store nests its calls: one commit for them and
    the round, each write in a savepoint of its own, each answered only once that transaction ended. Otherwise
    (:meth:`alone`) each is its own transaction, answered at once.
    """

    def __init__(self, writes: Sequence[WriteRequest]) -> None:
        self._writes = writes

    def __bool__(self) -> bool:
        return bool(self._writes)

    @property
    def durable(self) -> bool:
        """Whether one of them asks for the store's strongest commit."""
        return any(write.durable for write in self._writes)

    def alone(self) -> None:
        """Run each write in a transaction of its own and answer it."""
        for write in self._writes:
            write.run()
            write.finish()

    @contextmanager
    def joined(self, transaction: Callable[[], AbstractContextManager[Any]]) -> Iterator[None]:
        """Open ``transaction()`` (the round's), run each write inside it in a savepoint (``transaction()`` again,
        nested), then the block (the rest of the round); answer the writes after the transaction ended.

        A write that raises fails alone (its savepoint is undone, the round goes on). When the round fails (its
        block or its commit raised an ``Exception``) nothing of it was stored, these writes included: each is then
        run again on its own, so it fails only for a reason of its own; the round's exception is raised. (On
        PostgreSQL a commit whose answer was lost may have stored them after all; the writes the runtime hands over
        are fenced by the attempt's identity or idempotent, so running one again then changes nothing, at worst
        it answers "not owned".) A ``BaseException`` fails them all with it.
        """
        try:
            with transaction():
                for write in self._writes:
                    write.run(transaction)
                yield
        except Exception:
            for write in self._writes:
                write.run()
            raise
        except BaseException as exc:
            for write in self._writes:
                write.fail(exc)
            raise
        finally:
            for write in self._writes:
                write.finish()
