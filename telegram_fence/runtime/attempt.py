"""What one attempt of a handler knows (``AttemptContext``), and the error text the store keeps of a failure.

Also the attempt running on this thread (``current_attempt``) with the extensions taking part in it
(``AttemptExtension``, ``running``). An ``AttemptContext`` belongs to one attempt; the current attempt is per thread.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from types import MappingProxyType
from typing import Any, Protocol

from ..errors import TelegramError
from ..retry import telegram_cause
from ..store import Claim, Identity, UpdateStore
from ..telegram import mask_tokens
from ..updates import escape_lone_surrogates

__all__ = [
    "AttemptContext", "AttemptExtension", "current_attempt", "error_line", "error_text", "log_extra", "refusal",
    "running",
]

_MAX_ERROR_TEXT = 4000
_MAX_ERROR_LINE = 500

_Frame = tuple["AttemptContext", tuple["AttemptExtension", ...]]


class _Current(threading.local):
    """Each thread's running attempt: ``frame`` is ``(its context, the extensions taking part)``, or ``None``."""

    frame: _Frame | None = None


_CURRENT = _Current()


class AttemptExtension(Protocol):
    """A part of the fence that takes part in every attempt (the call journal, durable conversation state).

    The hooks run on the attempt's own thread, in the order the extensions were given to :func:`running`:

    - ``begin(ctx)`` before the handler runs;
    - ``before_commit(ctx, conn, complete)`` inside each ``ctx.transaction()``, after the caller's writes and
      before the commit (``conn`` is the store's connection in that fenced transaction): writes made here
      commit with the caller's or not at all;
    - ``after_commit(ctx, complete)`` once that transaction committed;
    - ``end(ctx, ok)`` after the handler returned (``ok=True``) or raised (``ok=False``). With ``ok=True`` an
      extension may still write, through ``ctx.transaction(complete=True)``, so its writes commit with the
      settle; an exception it raises there counts as the handler's.

    An exception from ``begin``, ``before_commit`` or ``end`` fails the attempt (it is retried like a handler's
    error); ``after_commit`` must not raise.
    """

    def begin(self, ctx: AttemptContext) -> None: ...

    def before_commit(self, ctx: AttemptContext, conn: Any, complete: bool) -> None: ...

    def after_commit(self, ctx: AttemptContext, complete: bool) -> None: ...

    def end(self, ctx: AttemptContext, ok: bool) -> None: ...


def current_attempt() -> AttemptContext | None:
    """The attempt whose handler runs on this thread, or ``None`` outside one."""
    frame = _CURRENT.frame
    return None if frame is None else frame[0]


@contextmanager
def running(ctx: AttemptContext, extensions: tuple[AttemptExtension, ...]) -> Iterator[None]:
    """Make ``ctx`` this thread's current attempt for the block, ``extensions`` taking part: ``begin`` on entry,
    ``end(ctx, ok)`` on exit. After a block that raised, an ``end`` that raises is ignored and the block's error
    propagates; after a clean one it fails the block. The previous attempt is current again afterwards."""
    previous = _CURRENT.frame
    _CURRENT.frame = (ctx, extensions)
    try:
        for ext in extensions:
            ext.begin(ctx)
        try:
            yield
        except BaseException:
            for ext in extensions:
                with suppress(Exception):
                    ext.end(ctx, False)
            raise
        for ext in extensions:
            ext.end(ctx, True)
    finally:
        _CURRENT.frame = previous


#: ``AttemptContext.raw`` once its handler returned (see :meth:`AttemptContext.release`)
_RELEASED: Mapping[str, Any] = MappingProxyType({})


class AttemptContext:
    """What an attempt-aware handler knows about its attempt.

    - ``identity``: ``Identity(update_id, attempt, claim_id)``; ``attempt``: 1 for the first try;
    - ``raw``: the update as Telegram sent it (a dict) while the attempt runs; an empty mapping once its handler
      returned (:meth:`release`: the pool keeps a finished attempt until its settle commits, and would otherwise
      keep every payload of a round with it);
    - ``owner_lost``: a ``threading.Event`` set when the lease could not be kept (advisory: stop early);
    - ``store``: the store the update is in (its fenced writes go there);
    - ``owns()``: asks the database (the authority) whether this attempt still owns the update;
    - ``transaction(complete=False)``: a write transaction that commits only while this attempt owns the
      update, raising :class:`~telegram_fence.errors.OwnershipLost` otherwise; ``complete=True`` settles the
      update in the same transaction.
    - ``step(name, fn, ...)``, ``step_key(name)``: durable steps (:func:`telegram_fence.step`);
    - ``open_transactions``: how many ``transaction()`` blocks are open right now (the call journal queues a
      Bot API call made inside one, so it is sent only once the block committed); ``transactions_begun``:
      how many were entered so far (the number of the one open now).

    Belongs to one attempt; use it from the handler's thread (``owner_lost`` may be waited on anywhere).
    """

    __slots__ = ("chat_id", "completed", "identity", "lease_until", "open_transactions", "owner_lost",
                 "raw", "started", "store", "transactions_begun")

    def __init__(self, store: UpdateStore, claim: Claim) -> None:
        self.store = store
        self.identity: Identity = claim.identity
        self.raw: Mapping[str, Any] = claim.update
        self.chat_id = claim.chat_id
        #: set when the lease could not be kept (advisory: the database is the authority)
        self.owner_lost = threading.Event()
        self.lease_until = claim.lease_until
        self.completed = False
        self.started: float | None = None  # when the handler started (monotonic)
        self.open_transactions = 0  # ctx.transaction() blocks open on this attempt's thread right now
        self.transactions_begun = 0  # ctx.transaction() blocks entered so far (names the one open now)

    def release(self) -> None:
        """The handler returned: drop the payload (an attempt waiting for its settle holds only its identity)."""
        self.raw = _RELEASED

    @property
    def lost(self) -> bool:
        """Whether ``owner_lost`` is set."""
        return self.owner_lost.is_set()

    @property
    def attempt(self) -> int:
        """This attempt's number: 1 for the first, counted per update (``identity.attempt``)."""
        return self.identity.attempt

    @property
    def update_id(self) -> int:
        """The Telegram update id this attempt handles (``identity.update_id``)."""
        return self.identity.update_id

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, final: tuple[type[BaseException], ...] = (),
             retry_uncertain: bool = False, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as the durable step ``name`` of this attempt's update: at most once per
        update, its JSON result recorded and returned on every later attempt (see :func:`telegram_fence.step`)."""
        from ..steps.core import run_step

        return run_step(self, name, fn, args, kwargs, final=final, retry_uncertain=retry_uncertain)

    def step_key(self, name: str) -> str:
        """The idempotency key of step ``name`` of this update (see :func:`telegram_fence.step_key`)."""
        from ..steps.core import key_of

        return key_of(self, name)

    def owns(self) -> bool:
        """``True`` while the database still gives this attempt the update."""
        return bool(self.store.owns(self.identity))

    @contextmanager
    def transaction(self, complete: bool = False) -> Iterator[Any]:
        """Yield the store's connection inside a fenced write transaction (see the class docstring)."""
        frame = _CURRENT.frame
        extensions = frame[1] if frame is not None and frame[0] is self else ()
        with self.store.transaction(self.identity, complete=complete) as conn:
            self.open_transactions += 1
            self.transactions_begun += 1
            try:
                yield conn
            finally:
                self.open_transactions -= 1
            for ext in extensions:
                ext.before_commit(self, conn, complete)
        if complete:
            self.completed = True
        for ext in extensions:
            ext.after_commit(self, complete)


def log_extra(ctx: AttemptContext) -> dict[str, Any]:
    """The log fields that name an attempt: ``update_id``, ``attempt``, ``claim_id``."""
    return {"update_id": ctx.update_id, "attempt": ctx.attempt, "claim_id": ctx.identity.claim_id}


def error_text(error: BaseException) -> str:
    """The error as the store keeps it: type, message and traceback, tokens masked, lone surrogates escaped,
    bounded in size. Never raises."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    text = escape_lone_surrogates(mask_tokens(text))
    if len(text) > _MAX_ERROR_TEXT:
        text = text[:200] + "\n…\n" + text[-(_MAX_ERROR_TEXT - 210):]
    return text


def refusal(error: BaseException) -> TelegramError | None:
    """The answer Telegram refused a Bot API call with, in ``error`` or its ``__cause__`` chain, or ``None`` (also
    for a network failure: no ``error_code`` and ``method``). Never raises."""
    cause = telegram_cause(error)
    if cause is None or cause.error_code is None or not cause.method:
        return None
    return cause


def error_line(error: BaseException) -> str:
    """The error on one line (``ValueError: the message``; a refusal as ``Telegram refused METHOD (error CODE):
    description``), masked, escaped and bounded as :func:`error_text`. Never raises."""
    answer = refusal(error)
    if answer is not None:
        parts = [f"Telegram refused {answer.method} (error {answer.error_code}): {answer.description}"]
    else:
        parts = traceback.format_exception_only(type(error), error)
    line = " ".join(" ".join(part.split()) for part in parts if part.strip())
    line = escape_lone_surrogates(mask_tokens(line))
    if len(line) > _MAX_ERROR_LINE:
        line = line[: _MAX_ERROR_LINE - 1] + "…"
    return line


#: Where library code lives (this package, the standard library: where ``os`` is, without loading ``sysconfig``).
_LIBRARY_DIRS = tuple({os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
                       os.path.dirname(os.path.abspath(os.__file__)) + os.sep})


def raised_at(error: BaseException) -> str | None:
    """Where in the bot's own code ``error`` came from, as ``file:line in function`` (the innermost frame outside
    this package, the standard library and installed packages), or ``None``. Never raises."""
    try:
        found = None
        for frame in traceback.extract_tb(error.__traceback__):
            path = os.path.abspath(frame.filename)
            if path.startswith(_LIBRARY_DIRS) or f"{os.sep}site-packages{os.sep}" in path \
                    or f"{os.sep}dist-packages{os.sep}" in path or frame.filename.startswith("<frozen"):
                continue
            found = frame
        if found is None:
            return None
        path = os.path.abspath(found.filename)
        shown = os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path
        return escape_lone_surrogates(f"{shown}:{found.lineno} in {found.name}")
    except Exception:  # a traceback that cannot be read: the line goes without its place
        return None
