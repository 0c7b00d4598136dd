"""Runtime: the fence and what runs stored updates (dispatcher, workers, heartbeat, attempt contexts).

It talks to the store only through the protocols of :mod:`telegram_fence.store`, so it runs unchanged on
any backend. May import: ingress, delivery, store, and the shared modules below them. Never the CLI or testing.
"""
