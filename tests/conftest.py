"""Project-wide test settings. Fixtures come from telegram_fence's own pytest plugin (fake_bot_api, ...)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

#: Long forms of the soak tests run with TF_SOAK=1; CI runs their short forms.
SOAK = os.environ.get("TF_SOAK") == "1"
