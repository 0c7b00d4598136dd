"""Durable steps: a handler's call to another service happens once per update, across crashes and retries.

:func:`step` records the intent of a call in the store, calls the function, records its JSON result, and returns
it; a retry of the update (or the process started after a crash) returns the recorded result without calling the
function again. :func:`step_key` is the idempotency key to hand the service. See docs/steps.md.

:mod:`.core` runs one step and keeps its row. May import ``runtime.attempt`` (to find the running attempt),
``errors`` and :mod:`.core`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigurationError, StepNotStorable, StepUncertain
from ..runtime.attempt import current_attempt
from .core import Attempt, key_of, run_step

__all__ = ["StepNotStorable", "StepUncertain", "step", "step_key"]


def _attempt(what: str) -> Attempt:
    ctx = current_attempt()
    if ctx is None:
        raise ConfigurationError(f"{what} works only inside a handler a Fence runs (it records the step with the "
                                 "update the handler works on); outside one, call the function directly")
    return ctx


def step(name: str, fn: Callable[..., Any], /, *args: Any, final: tuple[type[BaseException], ...] = (),
         retry_uncertain: bool = False, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` at most once for this update, as the step ``name``, and return its result.

    The first time the update reaches the step, its intent is recorded (only while this attempt owns the update),
    ``fn`` is called, and its result is recorded and returned. A later attempt of the update, on this process or
    another, returns the recorded result without calling ``fn``. The result must be JSON (dict with str keys,
    list, str, int, float, bool, None; a tuple comes back as a list): what is returned is the recorded value, the
    same on every attempt. Bot API calls made inside ``fn`` are not journaled one by one (the step is recorded).

    - ``name``: unique per update (a second step of that name in one attempt raises
      :class:`~telegram_fence.errors.ConfigurationError`); in a loop, ``f"llm-{i}"``.
    - An exception ``fn`` raises is not a result: the attempt fails and the next one calls ``fn`` again, unless
      it is an instance of one of ``final`` (then it is recorded and raised again on every later attempt).
    - An intent without an outcome (the process died while ``fn`` ran) is uncertain: the next attempt raises
      :class:`~telegram_fence.errors.StepUncertain` (the update is exhausted and reported), or, with
      ``retry_uncertain=True``, calls ``fn`` again (safe when the service dedupes on :func:`step_key`).
    - A stale attempt (its lease lapsed, the update taken by another) cannot record: ``OwnershipLost``.
    - Inside ``ctx.transaction()`` the step's records commit with the block (and with the settle of
      ``complete=True``): a crash before that commit leaves no record, so ``fn`` may run again.

    Raises :class:`~telegram_fence.errors.ConfigurationError` outside a handler a fence runs.
    """
    return run_step(_attempt("step()"), name, fn, args, kwargs, final=final, retry_uncertain=retry_uncertain)


def step_key(name: str) -> str:
    """The idempotency key of step ``name`` of the update being handled: the same on every attempt and every host,
    different for another update or another name. Pass it to a service that dedupes on a key (payment providers'
    ``Idempotency-Key``), so a step it may receive twice does its work once. Raises
    :class:`~telegram_fence.errors.ConfigurationError` outside a handler a fence runs."""
    return key_of(_attempt("step_key()"), name)
