"""The version of telegram_fence: one place, read by the package, the CLI and setup.cfg (layer 0, imports nothing)."""

__version__ = "0.2.0"
