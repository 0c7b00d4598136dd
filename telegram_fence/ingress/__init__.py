"""Ingress: how updates get from Telegram onto disk. The long-poll poller and its ``getUpdates`` connection.

Rule of this layer: an update is recorded (committed) before its offset is confirmed to Telegram.
May import: :mod:`telegram_fence.store`, :mod:`telegram_fence.telegram`, :mod:`telegram_fence.retry`,
:mod:`telegram_fence.errors`, :mod:`telegram_fence.updates`. Never the runtime, delivery or CLI.
"""
