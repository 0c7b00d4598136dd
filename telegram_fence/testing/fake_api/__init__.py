"""A real HTTP fake of the Telegram Bot API on ``127.0.0.1``, for tests, benchmarks and the demo."""

from __future__ import annotations

from .answers import ApiError, Call, Sent, UploadedFile
from .fake import FakeBotAPI

__all__ = ["ApiError", "Call", "FakeBotAPI", "Sent", "UploadedFile"]
