"""The ``telegram-fence`` command line (also ``python -m telegram_fence``): the top layer, may import anything."""

from __future__ import annotations

from .main import main

__all__ = ["main"]
