"""``telegram-fence broadcast create|run|status``: the broadcast subcommand.

Exit status: 0 every recipient decided (or created / status shown), 1 the run halted, 2 bad input or a conflict
(a :class:`FenceError`, one line from ``main``), 3 another process runs the broadcast, 130 stopped by SIGINT/SIGTERM
(resumable). The bot token comes from
``TELEGRAM_BOT_TOKEN`` (only ``run`` needs it) and is never printed; ``run --db DB`` shares the bot's rate limits
through its store (:func:`telegram_fence.calls.limits.shared_limits`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import IO

from ..calls.limits import Rates, shared_limits
from ..delivery.broadcast import Broadcast, BroadcastReport
from ..errors import BroadcastLocked, ConfigurationError
from ..telegram import mask_tokens, use_api_url
from .database import is_conninfo, open_current, open_postgres

__all__ = ["cmd_create", "cmd_run", "cmd_status"]

TOKEN_ENV = "TELEGRAM_BOT_TOKEN"
DIR_ENV = "TELEGRAM_FENCE_BROADCAST_DIR"
DEFAULT_DIR = "broadcasts"

EXIT_OK, EXIT_HALTED, EXIT_LOCKED, EXIT_STOPPED = 0, 1, 3, 130  # 2: a FenceError, said by main


def read_audience(path: str | os.PathLike[str]) -> list[int | str]:
    """The chat ids of a text file, one a line (``#`` comments); :class:`ConfigurationError` naming a bad line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read audience file {os.fspath(path)!r}: {exc}") from exc
    entries: list[int | str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            entries.append(line if line.startswith("@") else int(line))
        except ValueError:
            raise ConfigurationError(
                f"{os.fspath(path)}:{number}: {line!r} is not a chat id (an integer or an @channelusername)"
            ) from None
    return entries


def _check_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigurationError(f"--dir {path!r} is not a directory; pass the directory that holds the broadcasts")


def cmd_create(args: argparse.Namespace) -> int:
    """Write the broadcast's audience and message once (again with the same ones: a no-op)."""
    _check_dir(args.dir)
    text = args.text
    if args.text_file is not None:
        try:
            text = Path(args.text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"cannot read text file {args.text_file!r}: {exc}") from exc
    audience = read_audience(args.audience)
    broadcast = Broadcast(None, args.dir, args.name)
    created = broadcast.create(audience, text, parse_mode=args.parse_mode, disable_notification=args.silent or None)
    verb = "created" if created else "already exists (same audience and message)"
    print(f"broadcast {args.name!r} {verb}: {broadcast.status().total} recipients in {os.fspath(broadcast.path)}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """Where the broadcast stands (``--json``: its report as an object)."""
    _check_dir(args.dir)
    report = Broadcast(None, args.dir, args.name).status()
    print(json.dumps(dataclasses.asdict(report), sort_keys=True) if args.json else report.summary())
    return EXIT_OK


class ProgressPrinter:
    """Prints a run's summary line at the start, every 10 % and on a halt."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self._last_step = -1

    def __call__(self, report: BroadcastReport) -> None:
        step = report.decided * 10 // max(report.total, 1)
        if step != self._last_step or report.halted:
            self._last_step = step
            print(report.summary(), file=self.stream, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    """Send to every recipient not yet decided, resumable; see the module for the exit status."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ConfigurationError(f"{TOKEN_ENV} is not set: export the bot token from @BotFather to run a broadcast")
    if args.telegram_rates and args.db is None:
        raise ConfigurationError("--telegram-rates needs --db: the buckets are the ones the bot keeps in its database")
    try:
        with contextlib.ExitStack() as stack:
            _check_dir(args.dir)
            if args.db is not None:
                # the bot's current store (nothing created or migrated), its rate-limit tables checked there
                store = stack.enter_context(open_postgres(args.db, args.table, pool_size=2) if is_conninfo(args.db)
                                            else open_current(args.db))
                stack.enter_context(shared_limits(store, rates=Rates() if args.telegram_rates else None))
            use_api_url(args.api_url)
            import telebot

            try:
                bot = telebot.TeleBot(token, threaded=False)  # it only sends: no handler pool threads
            except ValueError:
                raise ConfigurationError(f"{TOKEN_ENV} does not look like a bot token (id:secret)") from None
            broadcast = Broadcast(bot, args.dir, args.name)
            received: list[int] = []

            def stop(signum: int, _frame: object) -> None:
                received.append(signum)
                broadcast.stop()  # after the send in progress: resumable

            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    stack.callback(signal.signal, sig, signal.signal(sig, stop))
            report = broadcast.run(rate=args.rate, progress=ProgressPrinter(sys.stderr))
    except BroadcastLocked as exc:
        print(f"telegram-fence: {mask_tokens(str(exc))}", file=sys.stderr)
        return EXIT_LOCKED
    print(report.summary())
    if report.halted:
        print("the message itself was refused; it cannot change under this name: fix it and create a new "
              f"broadcast ({report.pending} recipients never got it)" if report.halt_final
              else "fix the cause and run again to go on where it stopped", file=sys.stderr)
        return EXIT_HALTED
    if received or not report.done:
        print(f"stopped with {report.pending} recipients pending; run again to resume", file=sys.stderr)
        return EXIT_STOPPED
    return EXIT_OK
