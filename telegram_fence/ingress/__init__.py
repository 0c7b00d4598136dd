"""Ingress: how updates get from Telegram onto disk, through the long-poll poller or the webhook intake.

Rule of this layer: an update is recorded (committed) before Telegram is told it may forget it. May import the
layers below (``store``, ``telegram``, ``retry``, ``errors``, ``updates``, ``textlog``, ``http_serving``); never the
runtime, delivery or CLI."""
