"""The public surface: exactly these names, one error tree, typed package."""

from __future__ import annotations

import inspect
from pathlib import Path

import telegram_fence
from telegram_fence import errors

PUBLIC = {
    # runtime
    "Fence", "AttemptContext", "backoff", "default_retry",
    # store contract and implementation
    "UpdateStore", "FencedUpdateStore", "DurableUpdateStore", "SqliteUpdateStore",
    "Identity", "Step", "Claim", "Exhaustion",
    # primitives
    "Broadcast", "BroadcastReport", "Outbox", "CaptureRule", "capture_key", "OperatorChannel",
    "LocalFiles", "DirectoryCheck", "JsonFormatter", "JsonLineHandler", "configure_logging",
    # webhook ingress
    "WebhookIntake",
    # fenced calls
    "queue_calls", "uncertain_calls", "UncertainCall", "Rates",
    # conversations
    "FenceStateStorage", "FenceHandlerBackend",
    # errors
    "FenceError", "ConfigurationError", "StoreError", "StoreUnavailable", "StoreCorrupt", "SchemaError",
    "InvalidUpdate", "OwnershipLost", "TelegramError", "RetryAfter", "Transient", "Ambiguous", "MessageRefused",
    "RecipientGone", "Conflict", "Unauthorized", "Fatal", "CaptureConflict", "BroadcastError",
    "BroadcastConflict", "BroadcastLocked", "FileAccessRefused", "WebhookTaken",
    "CallUncertain", "CallMismatch",
    "StateNotStorable", "StateMissing",
}


def test_all_lists_exactly_the_public_names() -> None:
    """telegram_fence.__all__ is exactly the documented public names, and each one imports."""
    assert set(telegram_fence.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(telegram_fence, name) is not None


def test_every_error_is_a_fence_error() -> None:
    """Every exception class telegram_fence defines descends from FenceError."""
    classes = [obj for _, obj in inspect.getmembers(errors, inspect.isclass) if issubclass(obj, BaseException)]
    assert len(classes) >= 20
    for cls in classes:
        assert issubclass(cls, telegram_fence.FenceError), cls


def test_package_ships_py_typed() -> None:
    """The package is marked as typed (PEP 561)."""
    assert (Path(telegram_fence.__file__).parent / "py.typed").exists()
