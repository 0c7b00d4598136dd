"""telegram_fence: durable, fenced update handling for pyTelegramBotAPI bots.

Nothing Telegram delivered is lost (it is recorded before it is confirmed), no stale worker commits
a write (the database decides who owns an update), no terminal failure is forgotten.

Start with ``sys.exit(Fence(bot, "bot.db").run())`` where the script had ``bot.infinity_polling()``;
``help(telegram_fence.Fence)`` explains every option, ``telegram-fence --help`` the command line, and
docs/api.md every public name.

This package exports what a bot author uses. The store contract for backend authors (``UpdateStore``,
``Identity``, ``Claim``, ...) lives in :mod:`telegram_fence.store`, every exception in
:mod:`telegram_fence.errors`, and the fence's own parts in their modules.

The names below import on first use (a module ``__getattr__``): ``import telegram_fence`` loads only the
version and the errors, so a bot that never broadcasts, captures or serves a webhook does not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .errors import (
    CallUncertain,
    ConfigurationError,
    FenceError,
    OwnershipLost,
    StepUncertain,
    StoreError,
    TelegramError,
    WebhookTaken,
)

if TYPE_CHECKING:
    from .calls import Rates, queue_calls, uncertain_calls
    from .delivery.broadcast import Broadcast
    from .delivery.operator import OperatorChannel
    from .delivery.outbox import CaptureRule, Outbox
    from .files import LocalFiles
    from .jsonlog import configure_logging
    from .retry import backoff, default_retry
    from .runtime.attempt import AttemptContext
    from .runtime.fence import Fence
    from .steps import step, step_key
    from .store.contract import Exhaustion
    from .store.sqlite import SqliteUpdateStore

#: Where each lazily imported public name lives (module relative to this package).
_LAZY: dict[str, str] = {
    "Rates": ".calls",
    "queue_calls": ".calls",
    "uncertain_calls": ".calls",
    "Broadcast": ".delivery.broadcast",
    "OperatorChannel": ".delivery.operator",
    "CaptureRule": ".delivery.outbox",
    "Outbox": ".delivery.outbox",
    "LocalFiles": ".files",
    "configure_logging": ".jsonlog",
    "backoff": ".retry",
    "default_retry": ".retry",
    "AttemptContext": ".runtime.attempt",
    "Fence": ".runtime.fence",
    "Exhaustion": ".store.contract",
    "SqliteUpdateStore": ".store.sqlite",
    "step": ".steps",
    "step_key": ".steps",
}


if not TYPE_CHECKING:  # a type checker sees the names imported above, and no __getattr__ that would make
    # every other name Any (a typo in an import would pass)

    def __getattr__(name: str) -> Any:
        """Import a public name's module on first use and keep the name here (later lookups cost nothing)."""
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'telegram_fence' has no attribute {name!r}")
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})


__all__ = [
    "AttemptContext",
    "Broadcast",
    "CallUncertain",
    "CaptureRule",
    "ConfigurationError",
    "Exhaustion",
    "Fence",
    "FenceError",
    "LocalFiles",
    "OperatorChannel",
    "Outbox",
    "OwnershipLost",
    "Rates",
    "SqliteUpdateStore",
    "StepUncertain",
    "StoreError",
    "TelegramError",
    "WebhookTaken",
    "backoff",
    "configure_logging",
    "default_retry",
    "queue_calls",
    "step",
    "step_key",
    "uncertain_calls",
]
