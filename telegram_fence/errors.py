"""Every error telegram_fence raises, in one tree under :class:`FenceError` (listed in docs/api.md); foreign
exceptions are translated at one boundary each and chained with ``raise ... from exc``."""

from __future__ import annotations

__all__ = [
    "Ambiguous", "BroadcastConflict", "BroadcastError", "BroadcastLocked", "CallMismatch", "CallUncertain",
    "CaptureConflict", "ConfigurationError", "Conflict", "Fatal", "FenceError", "FileAccessRefused", "InvalidUpdate",
    "LeadershipLost", "MessageRefused", "OwnershipLost", "RecipientGone", "RetryAfter", "SchemaError", "StateMissing",
    "StateNotStorable", "StepNotStorable", "StepUncertain", "StoreCorrupt", "StoreError", "StoreUnavailable",
    "TelegramError", "Transient", "Unauthorized", "WebhookTaken"
]


class FenceError(Exception):
    """Root of every error raised by telegram_fence."""


class ConfigurationError(FenceError, ValueError):
    """An argument or setting cannot work; the message names it and what to pass instead."""


class StoreError(FenceError):
    """The update store could not complete an operation; nothing partial was committed."""


class StoreUnavailable(StoreError):
    """The database could not be opened, or a transaction could not start (the message says how long and why)."""


class StoreCorrupt(StoreError):
    """The database is damaged or not a usable SQLite database; the fence ends, the message says what to do."""


class SchemaError(StoreError):
    """The file's schema cannot be used by this version of the library."""


class InvalidUpdate(StoreError, ValueError):
    """An update handed to the store is malformed; the batch it came in was not stored."""


class OwnershipLost(FenceError):
    """The attempt no longer owns its update (claim expired, reclaimed, settled, pruned): its write was rolled back.

    Let it propagate from ``ctx.transaction()``: the fence ends the stale attempt, not counting a failure."""

    def __init__(self, identity: object, reason: str = "") -> None:
        self.identity, self.reason = identity, reason
        detail = f" ({reason})" if reason else ""
        super().__init__(f"attempt {identity} no longer owns its update{detail}; its writes were rolled back and "
                         "another attempt will (or did) handle the update")


class LeadershipLost(FenceError):
    """This process lost poll leadership (PostgreSQL): nothing of its batch was stored, the cursor did not move."""

    def __init__(self, epoch: object, current: object = None) -> None:
        self.epoch, self.current = epoch, current
        super().__init__(f"poll leadership epoch {epoch} is no longer current (the database holds epoch {current}); "
                         "the batch was not recorded and this process stops polling until it leads again")


class TelegramError(FenceError):
    """A Bot API call failed (built by :func:`telegram_fence.telegram.classify`): ``method`` when known,
    ``description`` (token masked), ``error_code`` (``None`` for network errors)."""

    def __init__(self, description: str, *, error_code: int | None = None, method: str | None = None) -> None:
        self.description, self.error_code, self.method = description, error_code, method
        where = f"{method}: " if method else ""
        code = f"[{error_code}] " if error_code is not None else ""
        super().__init__(f"{where}{code}{description}")


class RetryAfter(TelegramError):
    """Telegram asked to wait ``seconds`` before the next call (HTTP 429)."""

    def __init__(self, seconds: float, description: str = "Too Many Requests", **kw: object) -> None:
        self.seconds = float(seconds)
        super().__init__(f"{description} (retry after {self.seconds:g} s)", **kw)  # type: ignore[arg-type]


class Transient(TelegramError):
    """The call certainly did not take effect (refused, unreachable, connect timeout, 408); retrying is safe."""


class Ambiguous(TelegramError):
    """The request may have been executed (a 5xx, a read timeout, a reset or TLS error after connecting)."""


class MessageRefused(TelegramError):
    """Telegram refused the message itself (too long, bad entities, …); repeating cannot help."""


class RecipientGone(TelegramError):
    """The recipient cannot receive messages (blocked the bot, deactivated, kicked, chat not found)."""


class Conflict(TelegramError):
    """Another poller or a webhook is using this token (HTTP 409)."""


class Unauthorized(TelegramError):
    """The bot token is wrong or was revoked (HTTP 401). Get a new one from @BotFather."""


class Fatal(TelegramError):
    """A Bot API failure that fits no other class; not retried automatically."""


class CallMismatch(FenceError):
    """A retried handler's call at position ``seq`` is another method than the one journaled there; nothing sent."""

    def __init__(self, update_id: int, seq: int, recorded: str, method: str) -> None:
        self.update_id, self.seq, self.recorded, self.method = update_id, seq, recorded, method
        super().__init__(f"update {update_id}: call {seq} is {method}, but an earlier attempt journaled {recorded} "
                         "there; make the handler's Bot API calls in the same order on every attempt (nothing was "
                         "sent)")


class CallUncertain(FenceError):
    """A journaled call may or may not have reached Telegram; never sent again (``uncertain_calls="raise"``)."""

    def __init__(self, update_id: int, seq: int, method: str, reason: str = "") -> None:
        self.update_id, self.seq, self.method = update_id, seq, method
        detail = f" ({reason})" if reason else ""
        super().__init__(f"update {update_id}: call {seq} ({method}) may or may not have reached Telegram{detail}; it "
                         "is recorded uncertain and will not be sent again (see telegram-fence calls DB --uncertain)")


class StepUncertain(FenceError):
    """A durable step began in an earlier attempt that ended before recording its outcome; not run again."""

    def __init__(self, update_id: int, name: str) -> None:
        self.update_id, self.name = update_id, name
        super().__init__(f"update {update_id}: step {name!r} began in an earlier attempt that ended before recording "
                         "its outcome, so it may or may not have happened; it is not run again (give the service "
                         "step_key(name) as its idempotency key and pass retry_uncertain=True to repeat it safely; "
                         "telegram-fence steps DB --uncertain lists these)")


class StepNotStorable(FenceError, TypeError):
    """A durable step's result (or a final exception's arguments) is not JSON: nothing recorded."""


class CaptureConflict(FenceError):
    """An outbox key was enqueued again with a different payload; the first payload was kept."""


class BroadcastError(FenceError):
    """A broadcast cannot be created or run as asked."""


class BroadcastConflict(BroadcastError):
    """A broadcast of that name exists with a different audience or message."""


class BroadcastLocked(BroadcastError):
    """Another live process is running the same broadcast."""


class FileAccessRefused(FenceError):
    """A file path from the Bot API is not a file inside the bot's directory."""


class WebhookTaken(FenceError):
    """The bot's webhook is registered to ``host`` (never the URL), not this process; nothing was changed."""

    def __init__(self, host: str, detail: str = "") -> None:
        self.host = host
        extra = f" ({detail})" if detail else ""
        super().__init__(f"the bot's webhook is registered to {host}{extra}, not to this process; stop the other "
                         f"instance, or pass takeover_from={host!r} to take the webhook over")


class StateNotStorable(FenceError, ValueError):
    """A conversation state, its data or one of its ids cannot be stored (the message names it); nothing written."""


class StateMissing(FenceError, RuntimeError):
    """``set_data`` (``bot.add_data``) for a chat and user that have no state: set a state first."""
