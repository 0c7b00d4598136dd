"""Public test support for users of telegram_fence: a fake Bot API server, a store conformance suite, fixtures."""
