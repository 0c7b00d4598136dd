"""Public test support for users of telegram_fence: a fake Bot API server, a store conformance suite, fixtures."""

from .fake_api import ApiError, Call, FakeBotAPI, Sent, UploadedFile
from .readiness import ReadinessSocket

__all__ = ["ApiError", "Call", "FakeBotAPI", "ReadinessSocket", "Sent", "UploadedFile"]
