"""Delivery: messages that leave the bot with at-least-once or at-most-once promises.

Broadcast (and its journal), the capture outbox, the operator channel. May import: the store,
:mod:`telegram_fence.telegram`, :mod:`telegram_fence.retry`, :mod:`telegram_fence.errors`,
:mod:`telegram_fence.updates`. Never the runtime, ingress or CLI.
"""
