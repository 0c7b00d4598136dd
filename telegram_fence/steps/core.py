"""One durable step of one attempt, and its row in the store: record the intent, call the function, record its
result; or return what an earlier attempt recorded.

One row per (update, step name) in ``fence_step_results`` (PostgreSQL: ``{table}_step_results``). Its ``state``:
``intent`` (the function runs, or its process died while it ran), ``done`` (``result`` is its JSON result),
``failed`` (``result`` is a final exception as JSON), ``uncertain`` (a later attempt found the intent). Works on
any attempt-like object (``identity``, ``raw``, ``completed``, ``store``). May import ``errors``, ``store``
(types), ``calls.frame``, ``calls.journal`` (the statements' dialect) and the standard library. Thread safety: a
step runs on its attempt's thread; the counters are kept under a lock.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import Any, NamedTuple, Protocol

from ..calls.frame import unjournaled
from ..calls.journal import JournalStore, OneTripJournalStore, listed, pg_text, reader, run
from ..errors import ConfigurationError, OwnershipLost, StepNotStorable, StepUncertain
from ..store import Identity

__all__ = ["DONE", "FAILED", "INTENT", "UNCERTAIN", "Attempt", "StepRow", "key_of",
           "list_steps", "run_step", "stats"]

INTENT, DONE, FAILED, UNCERTAIN = "intent", "done", "failed", "uncertain"
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


class StepRow(NamedTuple):
    """One step as the store keeps it (``result``: JSON text, or ``None`` while no outcome is recorded)."""

    update_id: int
    name: str
    state: str
    attempt: int
    claim_id: str | None
    runs: int
    result: str | None
    created_at: float
    changed_at: float

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values (what ``telegram-fence steps --json`` prints; the claim id left out)."""
        return {name: getattr(self, name) for name in self._fields if name != "claim_id"}


_COLUMNS = "update_id, name, state, attempt, claim_id, runs, result, created_at, changed_at"
FIND = f"SELECT {_COLUMNS} FROM fence_step_results WHERE update_id = :u AND name = :name"
LAPSED = ("UPDATE fence_step_results SET state = 'uncertain', changed_at = :now "
          "WHERE update_id = :u AND name = :name AND state = 'intent'")
TAKE_OVER = ("UPDATE fence_step_results SET state = 'intent', attempt = :attempt, claim_id = :claim, "
             "runs = runs + 1, changed_at = :now "
             "WHERE update_id = :u AND name = :name AND state IN ('intent', 'uncertain')")
FORGET = ("DELETE FROM fence_step_results "
          "WHERE update_id = :u AND name = :name AND claim_id = :claim AND state = 'intent'")
# The intent and the outcome; the ``_OWNED`` forms check the claim in the same statement (``owned_statement``'s
# ``fence_owner``, PostgreSQL only: hence the casts).
_OPEN = ("INSERT INTO fence_step_results(update_id, name, state, attempt, claim_id, created_at, changed_at) "
         "SELECT CAST(:u AS bigint), CAST(:name AS text), 'intent', CAST(:attempt AS integer), CAST(:claim AS text), "
         "CAST(:now AS float8), CAST(:now AS float8) /*owner*/ ON CONFLICT (update_id, name) DO NOTHING RETURNING runs")
_FINISH = ("UPDATE fence_step_results SET state = CAST(:state AS text), result = CAST(:result AS text), "
           "changed_at = CAST(:now AS float8) /*owner*/ WHERE update_id = CAST(:u AS bigint) "
           "AND name = CAST(:name AS text) AND claim_id = CAST(:claim AS text) AND state = 'intent' RETURNING runs")
OPEN, OPEN_OWNED = _OPEN.replace("/*owner*/", "WHERE true"), _OPEN.replace("/*owner*/", "FROM fence_owner")
FINISH, FINISH_OWNED = _FINISH.replace("/*owner*/ ", ""), _FINISH.replace("/*owner*/", "FROM fence_owner")


class _Names(threading.local):
    """The names this thread's running attempt gave its steps so far: ``(the attempt, its names)``."""

    current: tuple[Any, set[str]] | None = None


_NAMES = _Names()
_LOCK = threading.Lock()
_COUNTS: Counter[str] = Counter()
OUTCOMES = ("called", "replayed", "uncertain", "repeated", "failed", "refused")


def _count(name: str) -> None:
    with _LOCK:
        _COUNTS[name] += 1


def stats(store: Any) -> dict[str, Any]:
    """This process's steps since it started: ``called`` (the function ran), ``replayed`` (a recorded result or
    final error returned), ``uncertain`` (``StepUncertain`` raised), ``repeated`` (an uncertain step ran again),
    ``failed`` (a final exception recorded), ``refused`` (an outcome a stale attempt could not record); and
    ``stored``: the store's steps by state (all processes), or ``None`` with ``stored_error`` saying why it could
    not be read."""
    with _LOCK:
        result: dict[str, Any] = {name: _COUNTS.get(name, 0) for name in OUTCOMES}
    result["stored_error"] = None
    try:
        with reader(store)() as conn:
            rows = run(conn, "SELECT state, count(*) FROM fence_step_results GROUP BY state", {})
        result["stored"] = {str(state): int(n) for state, n in rows}
    except Exception as exc:  # stats never fail for a busy or closed store: the reason is kept instead
        result["stored"] = None
        result["stored_error"] = " ".join(str(exc).split())[:300] or type(exc).__name__
    return result


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
    """The idempotency key of step ``name`` of the update ``ctx`` handles: a digest of the update id, the name
    and the update as Telegram sent it (the same on every attempt and host, another for another update)."""
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
    """Raise again the final exception ``row`` recorded, as the type of ``final`` it names;
    :class:`ConfigurationError` when ``final`` no longer lists that type."""
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
    """Run step ``name`` of the attempt ``ctx`` (see :func:`telegram_fence.step`) and return its recorded JSON value.

    Raises :class:`ConfigurationError` for a repeated name or a settled update, :class:`OwnershipLost` for a stale
    attempt (its result then not recorded), :class:`StepUncertain` for an intent an earlier attempt left (unless
    ``retry_uncertain``), :class:`StepNotStorable` for a result that is not JSON, and what ``fn`` raised (recorded
    first when it is one of ``final``).
    """
    if not isinstance(final, tuple) or not all(isinstance(c, type) and issubclass(c, BaseException) for c in final):
        raise ConfigurationError(f"final= takes a tuple of exception classes, not {final!r:.80}")
    _claim_name(ctx, name)
    if ctx.completed:
        raise ConfigurationError(f"update {ctx.identity.update_id}: step {name!r} comes after the update was "
                                 "settled (ctx.transaction(complete=True)); run steps before or inside that block")
    store: JournalStore = ctx.store
    identity = ctx.identity
    row, repeated = _open(store, identity, name, time.time(), take_over=retry_uncertain)
    if row is not None:
        if row.state == DONE:
            _count("replayed")
            return json.loads(row.result or "null")
        if row.state == FAILED:
            _count("replayed")
            return _raise_recorded(row, final)
        _count("uncertain")
        raise StepUncertain(identity.update_id, name)
    _count("repeated" if repeated else "called")
    try:
        with unjournaled(ctx):
            value = fn(*args, **kwargs)
    except final as error:
        _record(store, identity, name, FAILED, _error_json(name, error))
        _count("failed")
        raise
    except BaseException:
        # A stale attempt or a failing store keeps the intent: the next attempt meets the step as uncertain.
        with suppress(Exception), store.transaction(identity) as conn:
            run(conn, FORGET, _key(identity, name))
        raise
    text = _encode(name, value)
    _record(store, identity, name, DONE, text)
    return json.loads(text)


def _key(identity: Identity, name: str) -> dict[str, Any]:
    return {"u": identity.update_id, "name": name, "claim": identity.claim_id, "attempt": identity.attempt}


def _open(store: JournalStore, identity: Identity, name: str, now: float, *,
          take_over: bool) -> tuple[StepRow | None, bool]:
    """Record the intent of step ``name`` and return ``(None, repeated)``, or ``(the row recorded earlier, False)``.

    Fenced: :class:`OwnershipLost` (nothing written) for a stale attempt. An ``intent`` row is recorded and
    returned ``uncertain``; with ``take_over`` an ``intent`` or ``uncertain`` row becomes this attempt's intent
    (``(None, True)``)."""
    params = {**_key(identity, name), "now": now}
    if isinstance(store, OneTripJournalStore):
        # the first reach in one round trip; a recorded outcome in one more; an intent left over as below
        if store.owned_statement(identity, pg_text(OPEN_OWNED, store.table), params):
            return None, False
        with store.read() as conn:
            found = run(conn, FIND, params)
        if found and found[0][2] in (DONE, FAILED):
            return StepRow(*found[0]), False
    with store.transaction(identity) as conn:
        if run(conn, OPEN, params):
            return None, False
        row = StepRow(*run(conn, FIND, params)[0])
        if row.state in (INTENT, UNCERTAIN) and take_over:
            run(conn, TAKE_OVER, params)
            return None, True
        if row.state == INTENT:
            run(conn, LAPSED, params)
            row = row._replace(state=UNCERTAIN, changed_at=now)
        return row, False


def _record(store: JournalStore, identity: Identity, name: str, state: str, text: str) -> None:
    """Record the step's outcome onto this attempt's intent; :class:`OwnershipLost` (counted ``refused``) when
    this attempt is stale or a later one took the intent over."""
    params = {**_key(identity, name), "state": state, "result": text, "now": time.time()}
    try:
        if isinstance(store, OneTripJournalStore):
            recorded = bool(store.owned_statement(identity, pg_text(FINISH_OWNED, store.table), params))
        else:
            with store.transaction(identity) as conn:
                recorded = bool(run(conn, FINISH, params))
    except OwnershipLost:
        _count("refused")
        raise
    if not recorded:
        _count("refused")
        raise OwnershipLost(identity, f"step {name!r} was taken over by a later attempt")


def list_steps(conn: Any, *, update_id: int | None = None, uncertain: bool = False,
               limit: int = 1000) -> Iterator[StepRow]:
    """Recorded steps read on ``conn`` (any connection), by update and name; ``uncertain=True``: only ``uncertain``
    and ``intent`` ones."""
    select = f"SELECT {_COLUMNS} FROM fence_step_results"
    return (StepRow(*values) for values in listed(conn, select, "name", update_id, uncertain, limit))
