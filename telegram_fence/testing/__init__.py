"""Public test support for users of telegram_fence: a fake Bot API server, a store conformance suite, fixtures."""

from .fake_api import Call, FakeBotAPI, Sent, UploadedFile

__all__ = ["Call", "FakeBotAPI", "Sent", "UploadedFile"]
