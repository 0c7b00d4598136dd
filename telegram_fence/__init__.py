"""telegram_fence: durable, fenced update handling for pyTelegramBotAPI bots.

Nothing Telegram delivered is lost (it is recorded before it is confirmed), no stale worker commits
a write (the database decides who owns an update), no terminal failure is forgotten.

Start with ``sys.exit(Fence(bot, "bot.db").run())`` where the script had ``bot.infinity_polling()``;
``help(telegram_fence.Fence)`` explains every option, ``telegram-fence --help`` the command line, and
docs/api.md every public name.

The names below import on first use (a module ``__getattr__``): ``import telegram_fence`` loads only the
version and the errors, so a bot that never broadcasts, captures or serves a webhook does not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .errors import (
    Ambiguous,
    BroadcastConflict,
    BroadcastError,
    BroadcastLocked,
    CallMismatch,
    CallUncertain,
    CaptureConflict,
    ConfigurationError,
    Conflict,
    Fatal,
    FenceError,
    FileAccessRefused,
    InvalidUpdate,
    MessageRefused,
    OwnershipLost,
    RecipientGone,
    RetryAfter,
    SchemaError,
    StateMissing,
    StateNotStorable,
    StepUncertain,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    TelegramError,
    Transient,
    Unauthorized,
    WebhookTaken,
)

if TYPE_CHECKING:
    from .calls import Rates, UncertainCall, queue_calls, uncertain_calls
    from .conversation import FenceHandlerBackend, FenceStateStorage
    from .delivery.broadcast import Broadcast, BroadcastReport
    from .delivery.operator import OperatorChannel
    from .delivery.outbox import CaptureRule, Outbox, capture_key
    from .files import DirectoryCheck, LocalFiles
    from .ingress.webhook import WebhookIntake
    from .jsonlog import JsonFormatter, JsonLineHandler, configure_logging
    from .retry import backoff, default_retry
    from .runtime.attempt import AttemptContext
    from .runtime.fence import Fence
    from .steps import step, step_key
    from .store.contract import Claim, DurableUpdateStore, Exhaustion, FencedUpdateStore, Identity, Step, UpdateStore
    from .store.sqlite import SqliteUpdateStore

#: Where each lazily imported public name lives (module relative to this package).
_LAZY: dict[str, str] = {
    "Rates": ".calls",
    "UncertainCall": ".calls",
    "queue_calls": ".calls",
    "uncertain_calls": ".calls",
    "FenceHandlerBackend": ".conversation",
    "FenceStateStorage": ".conversation",
    "Broadcast": ".delivery.broadcast",
    "BroadcastReport": ".delivery.broadcast",
    "OperatorChannel": ".delivery.operator",
    "CaptureRule": ".delivery.outbox",
    "Outbox": ".delivery.outbox",
    "capture_key": ".delivery.outbox",
    "DirectoryCheck": ".files",
    "LocalFiles": ".files",
    "WebhookIntake": ".ingress.webhook",
    "JsonFormatter": ".jsonlog",
    "JsonLineHandler": ".jsonlog",
    "configure_logging": ".jsonlog",
    "backoff": ".retry",
    "default_retry": ".retry",
    "AttemptContext": ".runtime.attempt",
    "Fence": ".runtime.fence",
    "Claim": ".store.contract",
    "DurableUpdateStore": ".store.contract",
    "Exhaustion": ".store.contract",
    "FencedUpdateStore": ".store.contract",
    "Identity": ".store.contract",
    "Step": ".store.contract",
    "UpdateStore": ".store.contract",
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
    "Ambiguous",
    "AttemptContext",
    "Broadcast",
    "BroadcastConflict",
    "BroadcastError",
    "BroadcastLocked",
    "BroadcastReport",
    "CallMismatch",
    "CallUncertain",
    "CaptureConflict",
    "CaptureRule",
    "Claim",
    "ConfigurationError",
    "Conflict",
    "DirectoryCheck",
    "DurableUpdateStore",
    "Exhaustion",
    "Fatal",
    "Fence",
    "FenceError",
    "FenceHandlerBackend",
    "FenceStateStorage",
    "FencedUpdateStore",
    "FileAccessRefused",
    "Identity",
    "InvalidUpdate",
    "JsonFormatter",
    "JsonLineHandler",
    "LocalFiles",
    "MessageRefused",
    "OperatorChannel",
    "Outbox",
    "OwnershipLost",
    "Rates",
    "RecipientGone",
    "RetryAfter",
    "SchemaError",
    "SqliteUpdateStore",
    "StateMissing",
    "StateNotStorable",
    "Step",
    "StepUncertain",
    "StoreCorrupt",
    "StoreError",
    "StoreUnavailable",
    "TelegramError",
    "Transient",
    "Unauthorized",
    "UncertainCall",
    "UpdateStore",
    "WebhookIntake",
    "WebhookTaken",
    "backoff",
    "capture_key",
    "configure_logging",
    "default_retry",
    "queue_calls",
    "step",
    "step_key",
    "uncertain_calls",
]
