"""``telegram-fence calls|steps|states|outbox DB``: what a bot's handlers left in its store (the call journal, the
durable steps, the conversations, the capture outbox), read-only but for ``outbox --requeue-failed``; exit 2 when
the store is not a current telegram_fence one."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

from ..calls.journal import CallRow, list_calls
from ..conversation.sql import list_states
from ..conversation.sql import list_steps as list_handlers
from ..delivery.outbox.queries import STATES, failed_captures, outbox_stats, requeue_failed
from ..steps.core import StepRow, list_steps
from .database import is_conninfo, open_current, read_only, require_current
from .updates import when

_LIMIT = 100_000  # rows shown at most: journal and steps are pruned with their updates, so they stay small
_SHOWN = 60  # characters of a step's result on a text line (``--json`` prints it whole)

def _list_rows(args: argparse.Namespace, lister: Callable[..., Iterable[Any]], line: Callable[[Any, float], str],
               nothing: str) -> int:
    """The rows ``lister`` reads (``--update``, ``--uncertain``) as a JSON array, or each as ``line(row, now)`` then
    a count per state (``nothing`` when none)."""
    with read_only(args.db, args.table, args.timeout) as conn:  # a current store: every table is there
        rows = list(lister(conn, update_id=args.update, uncertain=args.uncertain, limit=_LIMIT))
    if args.json:
        print(json.dumps([row.as_dict() for row in rows], ensure_ascii=False))
        return 0
    if not rows:
        print(nothing + (" with an unknown outcome" if args.uncertain else ""))
        return 0
    now = time.time()
    counts: dict[str, int] = {}
    for row in rows:
        print(line(row, now))
        counts[row.state] = counts.get(row.state, 0) + 1
    print(", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    return 0


def _call_line(row: CallRow, now: float) -> str:
    chat = "-" if row.chat_id is None else str(row.chat_id)
    status = "-" if row.status is None else str(row.status)
    return (f"{row.update_id:>12}  {row.seq:>3}  {row.method:<24} {row.state:<9}  chat {chat:<14} "
            f"HTTP {status:<4} attempt {row.attempt}  {max(0.0, now - row.changed_at):.0f} s ago")


def _step_line(row: StepRow, now: float) -> str:
    result = "-" if row.result is None else row.result
    if len(result) > _SHOWN:
        result = result[: _SHOWN - 1] + "…"
    return (f"{row.update_id:>12}  {row.name:<24} {row.state:<9}  attempt {row.attempt}  runs {row.runs}  "
            f"{max(0.0, now - row.changed_at):.0f} s ago  {result}")


def cmd_calls(args: argparse.Namespace) -> int:
    return _list_rows(args, list_calls, _call_line, "no journaled calls")


def cmd_steps(args: argparse.Namespace) -> int:
    return _list_rows(args, list_steps, _step_line, "no durable steps")


def cmd_states(args: argparse.Namespace) -> int:
    """List the telebot states (with their data) and the next-step and reply handlers kept (``--chat``)."""
    with read_only(args.db, args.table, args.timeout) as conn:
        states, steps = list_states(conn, args.chat), list_handlers(conn, args.chat)
    if args.json:
        print(json.dumps({"states": states, "handlers": steps}, sort_keys=True, ensure_ascii=False))
        return 0
    where = f" of chat {args.chat}" if args.chat is not None else ""
    print(f"states{where}: {len(states)}")
    for row in states:
        extra = "".join(f" {name}={row[name]}" for name in ("bot_id", "business_connection_id", "message_thread_id")
                        if row[name] is not None)
        data = json.dumps(row["data"], ensure_ascii=False, sort_keys=True)
        print(f"  chat {row['chat_id']} user {row['user_id']}{extra}: {row['state']!r} {data} "
              f"(update {row['update_id']}, {when(row['changed_at'])})")
    print(f"handlers{where}: {len(steps)}")
    for row in steps:
        group = "chat" if row["kind"] == "next_step" else "reply to message"
        print(f"  {row['kind']} {group} {row['group']} #{row['seq']}: {row['callback']} "
              f"(update {row['update_id']}, {when(row['registered_at'])})")
    return 0


def cmd_outbox(args: argparse.Namespace) -> int:
    """Counts by state, the oldest pending age and the failed captures; with ``--requeue-failed`` (a short write)
    those named, or all, back to pending first (1 when a key named was not a failed capture)."""
    status, requeued = 0, None
    if args.requeue_failed is None:  # a listing only: read-only, within --timeout
        if is_conninfo(args.db):
            require_current(args.db)  # refuses a connection string: this command takes a SQLite file
        with read_only(args.db, "fence_updates", args.timeout) as conn:
            view = SimpleNamespace(write=lambda durable=False: nullcontext(conn), clock=time.time)
            stats, failed = outbox_stats(view), failed_captures(view, args.failed) if args.failed else []
    else:
        keys = args.requeue_failed
        with open_current(args.db) as store:
            done = requeue_failed(store, keys or None)
            requeued = len(done)
            stats, failed = outbox_stats(store), failed_captures(store, args.failed) if args.failed else []
        for key in sorted(set(keys) - done):
            print(f"telegram-fence: capture {key}: not re-queued: it is not a failed capture", file=sys.stderr)
            status = 1
    if args.json:
        print(json.dumps({**stats, "requeued": requeued, "failed_captures": failed}, sort_keys=True))
        return status
    if requeued is not None:
        asked = "" if not args.requeue_failed else f" of {len(set(args.requeue_failed))} named"
        print(f"re-queued {requeued}{asked} failed capture(s)")
    print(f"outbox of {args.db}")
    for state in STATES:
        print(f"  {state:<11} {stats[state]:>8}")
    age = stats["oldest_pending_age"]
    print(f"  oldest pending age: {'none' if age is None else f'{age:.1f} s'}")
    if failed:
        print("failed captures (oldest first):")
        for row in failed:
            print(f"  {row['key']}  attempts={row['attempts']}  status={row['last_status']}  {row['last_error'] or ''}")
    return status
