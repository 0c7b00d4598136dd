"""What runs for each attempt of a ``Fence``: the one handler registered (``fence.handler``, ``fence.attempt_handler``)
or else telebot's own dispatch, inside the attempt extensions (call journal, conversations).

One job: :class:`HandlerChoice` keeps which handler was registered, refuses a second one or one registered after
the start, and runs an attempt. May import ``errors``, ``runtime.attempt`` and the standard library (layer 3,
runtime). Registration happens before the start, on one thread; :meth:`HandlerChoice.run` is then called from the
pool's threads and only reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigurationError
from .attempt import AttemptContext, AttemptExtension, run_in

__all__ = ["HandlerChoice"]


class HandlerChoice:
    """The handler of a fence: ``fn(update)``, ``fn(update, ctx)``, or ``dispatch([update])`` (telebot's
    ``process_new_updates``) when none was registered; each run inside ``extensions``, in their order."""

    def __init__(self, dispatch: Callable[[list[Any]], Any], extensions: tuple[AttemptExtension, ...]) -> None:
        self._dispatch = dispatch
        self._extensions = extensions
        self._plain: Callable[[Any], Any] | None = None
        self._attempt: Callable[[Any, AttemptContext], Any] | None = None
        self._closed = False

    @property
    def registered(self) -> bool:
        """Whether a handler of the fence's own replaces telebot's dispatch."""
        return self._plain is not None or self._attempt is not None

    def set_plain(self, fn: Callable[[Any], Any]) -> None:
        """Run ``fn(update)``; :class:`ConfigurationError` when one is registered already or after :meth:`close`."""
        self._check()
        self._plain = fn

    def set_attempt(self, fn: Callable[[Any, AttemptContext], Any]) -> None:
        """Run ``fn(update, ctx)``; :class:`ConfigurationError` as for :meth:`set_plain`."""
        self._check()
        self._attempt = fn

    def close(self) -> None:
        """The fence started: no handler may be registered from now on."""
        self._closed = True

    def run(self, update: Any, ctx: AttemptContext) -> None:
        """Run the handler on ``update`` inside the attempt extensions; what it raises propagates."""
        if self._attempt is not None:
            run_in(ctx, self._extensions, self._attempt, update, ctx)
        elif self._plain is not None:
            run_in(ctx, self._extensions, self._plain, update)
        else:
            run_in(ctx, self._extensions, self._dispatch, [update])

    def _check(self) -> None:
        if self.registered:
            raise ConfigurationError("a handler is already registered; a fence runs exactly one handler")
        if self._closed:
            raise ConfigurationError("register the handler before start()")
