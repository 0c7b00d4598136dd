"""One durable step of one attempt: record the intent, call the function, record its result; or return what an
earlier attempt recorded. Also the step's idempotency key and this process's step counters.

Works on any attempt-like object (``identity``, ``raw``, ``completed``, ``store``): the runtime's
``AttemptContext``. May import ``errors``, ``store`` (types), ``calls.frame`` (to keep a step's own Bot API calls
out of the call journal), ``steps.rows`` and the standard library. Thread safety: a step runs on its attempt's
thread (the names it used are kept per thread); the counters are kept under a lock.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

from ..calls.frame import unjournaled
from ..errors import ConfigurationError, OwnershipLost, StepNotStorable, StepUncertain
from ..store import Identity
from .rows import DONE, FAILED, StepRow, StepStore, finish, forget, open_step

__all__ = ["Attempt", "counters", "key_of", "run_step"]

#: The longest step name (it is part of the row's key).
MAX_NAME = 200


class Attempt(Protocol):
    """What a step needs of the attempt it runs in (``AttemptContext`` has all of it)."""

    @property
    def identity(self) -> Identity: ...

    @property
    def raw(self) -> Any: ...

    @property
    def completed(self) -> bool: ...

    @property
    def store(self) -> Any: ...


class _Names(threading.local):
    """The names this thread's running attempt gave its steps so far: ``(the attempt, its names)``."""

    current: tuple[Any, set[str]] | None = None


_NAMES = _Names()
_LOCK = threading.Lock()
_COUNTS: Counter[str] = Counter()
#: The counters :func:`counters` reports (process-wide, since the process started).
OUTCOMES = ("called", "replayed", "uncertain", "repeated", "failed", "refused")


def _count(name: str) -> None:
    with _LOCK:
        _COUNTS[name] += 1


def counters() -> dict[str, int]:
    """This process's steps since it started: ``called`` (the function ran), ``replayed`` (a recorded result or
    final error returned without calling it), ``uncertain`` (``StepUncertain`` raised), ``repeated`` (an uncertain
    step declared safe to repeat ran again), ``failed`` (a final exception recorded), ``refused`` (an outcome a
    stale attempt could not record)."""
    with _LOCK:
        return {name: _COUNTS.get(name, 0) for name in OUTCOMES}


def _claim_name(ctx: Attempt, name: str) -> None:
    """Note that the running attempt uses ``name``; :class:`ConfigurationError` for a bad or repeated name."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise ConfigurationError(f"a step name must be a non-empty str of at most {MAX_NAME} characters, "
                                 f"not {name!r:.80}")
    current = _NAMES.current
    if current is None or current[0] is not ctx:
        current = _NAMES.current = (ctx, set())
    if name in current[1]:
        raise ConfigurationError(
            f"update {ctx.identity.update_id}: a step named {name!r} already ran in this attempt; step names are "
            f"unique per update (in a loop, number them: f\"{name}-{{i}}\")")
    current[1].add(name)


def key_of(ctx: Attempt, name: str) -> str:
    """The idempotency key of step ``name`` of the update ``ctx`` handles: the same on every attempt and every
    host, different for another update or another name (a digest of the update id, the name and the update as
    Telegram sent it, so two bots' updates with the same id differ too)."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"a step name must be a non-empty str, not {name!r:.80}")
    update_id = ctx.identity.update_id
    body = json.dumps([update_id, name, dict(ctx.raw)], sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      default=str)
    return f"tf-{update_id}-{hashlib.sha256(body.encode()).hexdigest()[:32]}"


def _encode(name: str, value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StepNotStorable(
            f"step {name!r}: its result cannot be recorded ({exc}); a step's function must return JSON values "
            "(dict with str keys, list, str, int, float, bool, None): convert it before returning") from None


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _error_json(name: str, error: BaseException) -> str:
    """A final exception as the store keeps it: its type and its arguments (JSON; their text when they are not)."""
    try:
        args = json.loads(json.dumps(list(error.args), allow_nan=False))
    except (TypeError, ValueError):
        args = [str(error)]
    return _encode(name, {"type": _type_name(type(error)), "args": args, "message": str(error)})


def _raise_recorded(row: StepRow, final: tuple[type[BaseException], ...]) -> Any:
    """Raise the final exception ``row`` recorded again: the type of ``final`` it names, made from the recorded
    arguments. :class:`ConfigurationError` when ``final`` no longer lists that type."""
    recorded = json.loads(row.result or "{}")
    wanted = str(recorded.get("type", ""))
    args = recorded.get("args", [])
    cls = next((c for c in final if _type_name(c) == wanted), None)
    if cls is None:
        raise ConfigurationError(
            f"update {row.update_id}: step {row.name!r} recorded the final error {wanted} "
            f"({recorded.get('message', '')}); pass that type in final= to have it raised again")
    try:
        error = cls(*args)
    except Exception:  # a constructor that takes other arguments than it keeps in args
        error = cls.__new__(cls)
        error.args = tuple(args)
    raise error


def run_step(ctx: Attempt, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
             final: tuple[type[BaseException], ...] = (), retry_uncertain: bool = False) -> Any:
    """Run step ``name`` of the attempt ``ctx`` (see :func:`telegram_fence.step`): its recorded result, or
    ``fn(*args, **kwargs)`` called once with its intent recorded before and its result after; the value returned
    is the JSON value recorded, the same on every attempt.

    Raises :class:`ConfigurationError` for a repeated name or an update already settled, :class:`OwnershipLost`
    when the attempt no longer owns its update (before ``fn`` runs, or after: its result is then not recorded),
    :class:`StepUncertain` for an intent an earlier attempt left (unless ``retry_uncertain``),
    :class:`StepNotStorable` for a result that is not JSON, and what ``fn`` raised (recorded first when it is an
    instance of ``final``, and raised again on every later attempt).
    """
    if not isinstance(final, tuple) or not all(isinstance(c, type) and issubclass(c, BaseException) for c in final):
        raise ConfigurationError(f"final= takes a tuple of exception classes, not {final!r:.80}")
    _claim_name(ctx, name)
    if ctx.completed:
        raise ConfigurationError(f"update {ctx.identity.update_id}: step {name!r} comes after the update was "
                                 "settled (ctx.transaction(complete=True)); run steps before or inside that block")
    store: StepStore = ctx.store
    identity = ctx.identity
    row, repeated = open_step(store, identity, name, time.time(), take_over=retry_uncertain)
    if row is not None:
        if row.state == DONE:
            _count("replayed")
            return json.loads(row.result or "null")
        if row.state == FAILED:
            _count("replayed")
            return _raise_recorded(row, final)
        _count("uncertain")  # (an intent an earlier attempt left is returned as uncertain)
        raise StepUncertain(identity.update_id, name)
    _count("repeated" if repeated else "called")
    try:
        with unjournaled(ctx):
            value = fn(*args, **kwargs)
    except final as error:
        text = _error_json(name, error)
        _record(store, identity, name, FAILED, text)
        _count("failed")
        raise
    except BaseException:
        # A stale attempt (OwnershipLost) or a store that fails keeps the intent: the next attempt meets the step as
        # uncertain rather than calling it again after work of unknown extent.
        with suppress(Exception):
            forget(store, identity, name)
        raise
    text = _encode(name, value)
    _record(store, identity, name, DONE, text)
    return json.loads(text)


def _record(store: StepStore, identity: Identity, name: str, state: str, text: str) -> None:
    """Record the step's outcome; :class:`OwnershipLost` (counted ``refused``) when this attempt is stale."""
    try:
        recorded = finish(store, identity, name, state, text, time.time())
    except OwnershipLost:
        _count("refused")
        raise
    if not recorded:
        _count("refused")
        raise OwnershipLost(identity, f"step {name!r} was taken over by a later attempt")
