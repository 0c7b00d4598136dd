"""Liveness and readiness of a running fence, as plain functions of its ``stats()`` snapshot, and the bounded
write check of the store that readiness rests on.

- **live**: the fence was started, did not end on its own, and every thread it runs is alive (the dispatcher,
  the heartbeat, the poller of a polling bot, the exhaustion delivery; a worker thread that cannot go on ends the
  fence). A supervisor restarts a fence that is not live.
- **ready**: live, not stopping, the store can take a write now (:func:`check_write`: proven within a bound,
  without writing, so a scrape never changes the store), and the
  door in use makes progress: for a polling bot the poller answered a ``getUpdates`` (or, not leading on
  PostgreSQL, a leadership check) within ``max_progress_age`` seconds and is not paused; for a webhook bot the
  intake is open and its last delivery was stored (or none came yet).

May import ``store`` (types) and the standard library. The functions are pure but :func:`check_write`, which
asks the store (safe from any thread, as the store is) and writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["BoundedReads", "Verdict", "WriteProbe", "bounded_reads", "check_write", "liveness", "readiness"]


@runtime_checkable
class WriteProbe(Protocol):
    """A store that can prove it takes a write now, within a bound, without writing (both backends of this
    package)."""

    def probe_writable(self, timeout: float) -> None:
        """Return within ``timeout`` seconds when a write would be taken now (nothing is written), else raise
        (``StoreUnavailable`` when locked or read-only)."""
        ...


@runtime_checkable
class BoundedReads(Protocol):
    """A store whose reads on the calling thread can be bounded in time (both backends of this package)."""

    def bounded(self, seconds: float) -> AbstractContextManager[None]:
        """Within the block, this thread's reads wait at most ``seconds`` in all, else raise ``StoreUnavailable``."""
        ...


def bounded_reads(store: object, seconds: float) -> AbstractContextManager[None]:
    """``store.bounded(seconds)``, or a block that bounds nothing for a store without :class:`BoundedReads`."""
    return store.bounded(seconds) if isinstance(store, BoundedReads) else nullcontext()


@dataclass(frozen=True)
class Verdict:
    """``ok``, and the reasons it is not (one short line each; empty when ``ok``)."""

    ok: bool
    reasons: tuple[str, ...] = field(default=())

    def text(self) -> str:
        """The body of a health answer: ``ok`` or the reasons, one per line, ending in a newline."""
        return "ok\n" if self.ok else "".join(f"{reason}\n" for reason in self.reasons)


def _verdict(reasons: list[str]) -> Verdict:
    return Verdict(not reasons, tuple(reasons))


def check_write(store: object, timeout: float) -> str | None:
    """``None`` when ``store`` showed within ``timeout`` seconds that it takes a write now, else why not (one line).
    Nothing is written.

    A store without :class:`WriteProbe` is reported as not checkable rather than assumed writable.
    Never raises.
    """
    if not isinstance(store, WriteProbe):
        return f"the store {type(store).__name__} cannot be checked for writes (it has no probe_writable)"
    try:
        store.probe_writable(timeout)
    except Exception as exc:
        line = " ".join(str(exc).split()) or type(exc).__name__
        return f"the store cannot take a write (checked for {timeout:.2g} s): {line[:300]}"
    return None


def liveness(stats: Mapping[str, Any], *, polling: bool, exhaustions: bool = True) -> Verdict:
    """Whether the fence whose snapshot is ``stats`` runs every thread it should (see the module docstring).

    ``polling``: whether it polls (else a webhook
    intake feeds it); ``exhaustions``: whether it runs the exhaustion delivery thread.
    """
    reasons: list[str] = []
    if stats.get("ended_reason"):
        reasons.append(f"the fence ended: {stats['ended_reason']}")
    threads = stats.get("threads") or {}
    if not threads.get("started"):
        reasons.append("the fence is not started")
        return _verdict(reasons)
    for name in ("dispatcher", "heartbeat"):
        if not threads.get(name):
            reasons.append(f"the {name} thread is not alive")
    if exhaustions and not threads.get("exhaustions"):
        reasons.append("the exhaustion delivery thread is not alive")
    poller = stats.get("poller")
    if polling and not (poller and poller.get("alive")):
        reasons.append("the poller thread is not alive")
    return _verdict(reasons)


def readiness(
    stats: Mapping[str, Any],
    live: Verdict,
    *,
    write_error: str | None,
    max_progress_age: float,
) -> Verdict:
    """Whether the fence does its work now (see the module docstring); ``live`` is :func:`liveness`'s verdict,
    ``write_error`` :func:`check_write`'s answer."""
    reasons = list(live.reasons)
    if stats.get("stopping"):
        reasons.append("the fence is stopping")
    if "store_error" in stats:
        reasons.append(f"the store could not be read: {stats['store_error']}")
    calls = stats.get("calls")
    if isinstance(calls, Mapping) and calls.get("journal_error"):
        reasons.append(f"the calls journal could not be read: {calls['journal_error']}")
    steps = stats.get("steps")
    if isinstance(steps, Mapping) and steps.get("stored_error"):
        reasons.append(f"the durable steps could not be read: {steps['stored_error']}")
    if write_error is not None:
        reasons.append(write_error)
    webhook = stats.get("webhook")
    poller = stats.get("poller")
    if webhook is not None:
        intake = webhook.get("intake") or {}
        if intake.get("closed"):
            reasons.append("the webhook intake is closed")
        if intake.get("last_failed"):
            reasons.append("the webhook's last delivery could not be stored (answered 500)")
    elif poller is not None:
        if poller.get("paused"):
            reasons.append("paused: the poller fetches nothing until resume()")
        else:
            age = poller.get("progress_age")
            if age is None or age > max_progress_age:
                what = "getUpdates answer" if poller.get("leading", True) else "poll leadership check"
                shown = "never" if age is None else f"{age:.0f} s ago"
                reasons.append(f"no progress at the poller: the last {what} was {shown} "
                               f"(the bound is {max_progress_age:g} s)")
    return _verdict(reasons)
