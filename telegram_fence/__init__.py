"""telegram_fence: durable, fenced update handling for pyTelegramBotAPI bots.

Nothing Telegram delivered is lost (it is recorded before it is confirmed), no stale worker commits
a write (the database decides who owns an update), no terminal failure is forgotten.
"""

from __future__ import annotations

from ._version import __version__ as __version__
from .calls import Rates, UncertainCall, queue_calls, uncertain_calls
from .conversation import FenceHandlerBackend, FenceStateStorage
from .delivery.broadcast import Broadcast, BroadcastReport
from .delivery.operator import OperatorChannel
from .delivery.outbox import CaptureRule, Outbox, capture_key
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
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    TelegramError,
    Transient,
    Unauthorized,
    WebhookTaken,
)
from .files import DirectoryCheck, LocalFiles
from .ingress.webhook import WebhookIntake
from .jsonlog import JsonFormatter, JsonLineHandler, configure_logging
from .retry import backoff, default_retry
from .runtime.attempt import AttemptContext
from .runtime.fence import Fence
from .store import (
    Claim,
    DurableUpdateStore,
    Exhaustion,
    FencedUpdateStore,
    Identity,
    Step,
    UpdateStore,
)
from .store.sqlite import SqliteUpdateStore

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
    "uncertain_calls",
]
