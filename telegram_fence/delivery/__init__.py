"""Delivery: broadcasts, the capture outbox and the operator channel (never imports the runtime, ingress or CLI)."""
