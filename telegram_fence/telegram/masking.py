"""Bot tokens out of text: :func:`mask_tokens` and the pattern of a token. Every log path and every error message
the library builds from Telegram's or telebot's text goes through it. Pure; safe from any thread.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["mask_tokens", "token_pattern"]

#: A bot token: the bot's numeric id, a colon, and a 30+ character secret (35 in practice).
# The trailing group swallows a second token glued to the first ("<id>:<secret><id>:<secret>"), whose
# id the greedy secret class would otherwise eat, leaving the second secret visible.
token_pattern = re.compile(r"(?<![0-9])([0-9]{3,20}):[A-Za-z0-9_-]{30,}(?::[A-Za-z0-9_-]{30,})*")

_MASK = r"\1:***"


def mask_tokens(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` with every bot token (but its public numeric id) and every string in ``secrets`` replaced by
    ``***``. Never raises for a ``str``."""
    masked = token_pattern.sub(_MASK, text) if ":" in text else text  # every token has a colon
    for secret in secrets:
        if secret and secret in masked:
            masked = masked.replace(secret, "***")
    return masked
