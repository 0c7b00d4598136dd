"""telegram_fence: durable, fenced update handling for pyTelegramBotAPI bots."""

from __future__ import annotations

__version__ = "0.1.0"
