"""``telegram-fence`` / ``python -m telegram_fence``: the table of subcommands and their options, and how a command
ends: 0 done, 1 unhealthy or partly done, 2 bad input (one line on stderr), 141 quietly when its reader went away."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import apsw

from .._version import __version__
from ..errors import FenceError, StoreUnavailable
from ..store.operations import STATE_FILTERS
from ..store.schema import LATEST
from ..telegram import API_URL_ENV, mask_tokens
from .args import MAX_ID, Parser, chat_id, duration, non_negative_int, positive_float, positive_int, rate, update_id
from .broadcast import DEFAULT_DIR, DIR_ENV, cmd_create, cmd_run
from .broadcast import TOKEN_ENV as BROADCAST_TOKEN_ENV
from .broadcast import cmd_status as cmd_broadcast_status
from .database import add_timeout, unread_line
from .demo import cmd_demo
from .listings import cmd_calls, cmd_outbox, cmd_states, cmd_steps
from .updates import cmd_exhaustions, cmd_migrate, cmd_prune, cmd_retry, cmd_schema, cmd_show, cmd_status, cmd_updates
from .webhook import TOKEN_ENV, cmd_delete, cmd_info

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away


def _arg(*flags: str, **options: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    return flags, options


_DB = _arg("db", metavar="DB", help="the bot's SQLite file, or a PostgreSQL connection string (postgresql://... or "
           "'host=... dbname=...'; with --table)")
_FILE = _arg("db", metavar="DB", help="the bot's SQLite file (a SQLite file only)")
_TABLE = _arg("--table", default="fence_updates", help="the inbox table (PostgreSQL only; default fence_updates)")
_JSON = _arg("--json", action="store_true", help="print JSON instead of text")
_UNCERTAIN = _arg("--uncertain", action="store_true", help="only those whose outcome is unknown (uncertain, or an "
                  "intent left by a process that died meanwhile, or running now)")
_API_URL = _arg("--api-url", default=None, metavar="URL", help="the Bot API server (http://host:port, or telebot's "
               f"http://host:port/bot{{0}}/{{1}}; default: ${API_URL_ENV} or api.telegram.org)")
_BOT_API = [_arg("--token-env", default=TOKEN_ENV, metavar="VAR",
                 help=f"environment variable holding the bot token (default {TOKEN_ENV})"), _API_URL]
_BROADCAST = [_arg("name", metavar="NAME", help="the broadcast's name (letters, digits, _ . -)"),
              lambda parser: parser.add_argument(  # its default read when the parser is built
                  "--dir", default=os.environ.get(DIR_ENV, DEFAULT_DIR),
                  help=f"directory of broadcasts (default: ${DIR_ENV} or ./{DEFAULT_DIR})")]
_READ = [_DB, _TABLE, _JSON, add_timeout]  # what every read-only command of the inbox takes

#: Each subcommand: (name, what runs it, help, description or None, its arguments); a name of two words is a
#: subcommand of a group (``webhook info``); an argument that is a function adds itself to the parser.
_COMMANDS: list[Any] = [
    ("demo", cmd_demo, "run a fenced bot against the built-in fake Bot API server and crash it", None, [
        _arg("--updates", type=positive_int, default=300, metavar="N", help="messages to push (default 300)"),
        _arg("--kills", type=non_negative_int, default=3, metavar="K", help="SIGKILLs (default 3)"),
        _arg("--seed", type=int, default=None, help="the random moments of the kills (default: new ones each run)")]),
    ("status", cmd_status, "counts by state, cursor, poller generation and progress (read-only)", None, [
        *_READ, _arg("--max-progress-age", type=positive_float, default=None, metavar="SECONDS",
                     help="exit 1 unless the running poller or webhook made progress this recently (a poll "
                     "answered; for a webhook a delivery committed or a check of the webhook; use more than the "
                     "long-poll timeout and the webhook check interval, e.g. 90)")]),
    ("exhaustions", cmd_exhaustions, "list (or acknowledge) terminal failures", None, [
        *_READ, _arg("--ack", nargs="+", metavar="UPDATE_ID/ATTEMPT/CLAIM_ID",
                     help="acknowledge these exhaustions (makes them prunable)")]),
    ("schema", cmd_schema, "show the database's schema version (read-only), or print the PostgreSQL DDL with "
     "--postgres TABLE", None, [
         _arg("db", nargs="?", metavar="DB", help="the bot's SQLite file (a SQLite file only)"),
         _arg("--postgres", metavar="TABLE", default=None,
              help="print the PostgreSQL schema (tables, indexes, migration) for TABLE and exit")]),
    ("updates", cmd_updates, "list stored updates, newest first (read-only)", None, [
        *_READ, _arg("--state", choices=STATE_FILTERS, help="only this state (open: pending or claimed)"),
        _arg("--chat", type=chat_id, metavar="ID", help="only this chat"),
        _arg("--limit", type=positive_int, default=50, metavar="N", help="at most N rows (default 50)")]),
    ("show", cmd_show, "one update: raw update, attempts, last error, state, times (read-only)", None, [
        *_READ, _arg("update_id", type=update_id, metavar="UPDATE_ID", help="the update to show")]),
    ("retry", cmd_retry, "put exhausted updates back to pending with a fresh attempt budget (a running bot handles "
     "them)", "Put exhausted updates back to pending, due now, with a fresh attempt budget. The exhaustion counts as "
     "acknowledged: on_exhausted is not told of it (again). If the update fails again, that is a new exhaustion "
     "with a new identity, delivered as usual.", [
         _DB, _TABLE, _arg("update_ids", type=update_id, nargs="+", metavar="UPDATE_ID",
                           help="exhausted updates to retry")]),
    ("prune", cmd_prune, "delete settled/skipped updates and delivered captures older than a duration",
     "Delete settled and skipped updates, and delivered outbox captures, last changed longer ago than --older-than. "
     "Never deletes a pending, claimed or exhausted update, nor an undelivered capture.", [
         _DB, _TABLE, _JSON, _arg("--older-than", type=duration, required=True, metavar="AGE",
                                  help="a number with its unit: s seconds, m minutes, h hours, d days, w weeks (e.g. "
                                  "7d, 12h, 30m, 45s); a bare number is refused")]),
    ("migrate", cmd_migrate, f"upgrade a telegram_fence database to schema version {LATEST} (the bot does it on "
     "start too)", None, [_FILE]),
    ("broadcast create", cmd_create, "write the audience and the message once", None, [
        *_BROADCAST, _arg("--audience", required=True, metavar="FILE", help="one chat id per line; # comments"),
        lambda parser: _text_options(parser.add_mutually_exclusive_group(required=True)),
        _arg("--parse-mode", choices=("HTML", "Markdown", "MarkdownV2"), help="Telegram parse mode"),
        _arg("--silent", action="store_true", help="send without notification sound")]),
    ("broadcast run", cmd_run, f"send to everyone not yet decided (token from ${BROADCAST_TOKEN_ENV})", None, [
        *_BROADCAST, _arg("--rate", type=rate, default=25.0, metavar="R", help="messages per second (default 25)"),
        _API_URL,
        _arg("--db", default=None, metavar="DB", help="the bot's database (SQLite file or PostgreSQL connection "
             "string): share its rate limits (429 pauses) with the bot's other processes"),
        _arg("--table", default="fence_updates", help="the inbox table of --db (PostgreSQL only)"),
        _arg("--telegram-rates", action="store_true",
             help="with --db: also spend the bot's proactive Telegram-shaped token buckets (Rates())")]),
    ("broadcast status", cmd_broadcast_status, "show where a broadcast stands", None, [
        *_BROADCAST, _arg("--json", action="store_true", help="print the report as JSON")]),
    ("calls", cmd_calls, "the Bot API calls the bot's handlers made: sent, refused, uncertain (read-only)", None, [
        *_READ, _UNCERTAIN, _arg("--update", type=update_id, default=None, metavar="ID",
                                 help="only the calls of this update")]),
    ("outbox", cmd_outbox, "show the capture outbox (counts by state, oldest pending age); re-queue failed captures",
     "Show how many captures are pending, delivering, delivered and failed in DB, and how long the oldest "
     "undelivered one has waited. --requeue-failed puts failed captures back to pending; a running bot delivers "
     "them within its recheck interval.", [
         _FILE, _arg("--requeue-failed", nargs="*", metavar="KEY", default=None,
                     help="re-queue failed captures: all of them, or only the KEYs given"),
         _arg("--failed", type=non_negative_int, default=10, metavar="N",
              help="list up to N failed captures (default 10; 0: none)"),
         _JSON, lambda parser: add_timeout(parser, postgres=False)]),
    ("states", cmd_states, "the conversations the bot keeps: states, their data, next-step handlers (read-only)", None,
     [*_READ, _arg("--chat", type=chat_id, default=None, metavar="ID", help="only this chat")]),
    ("steps", cmd_steps, "the durable steps the bot's handlers recorded: done, failed, uncertain (read-only)", None, [
        *_READ, _UNCERTAIN, _arg("--update", type=update_id, default=None, metavar="ID",
                                 help="only the steps of this update")]),
    ("webhook info", cmd_info, "the webhook's host, pending update count and last error", None, [*_BOT_API, _JSON]),
    ("webhook delete", cmd_delete, "delete the webhook without dropping pending updates", None, [
        _arg("db", metavar="DB", help="the bot's SQLite file (read-only: it tells where a poller on it resumes)"),
        *_BOT_API]),
]
_GROUPS = {"webhook": ("show who holds the bot's webhook, or delete it to poll again", "{info,delete}"),
           "broadcast": ("send one message to many chats, resumable, never twice to anyone: created once under "
                         "a NAME, then run (and re-run after a crash) until every chat is decided",
                         "{create,run,status}")}


def _text_options(group: Any) -> None:
    group.add_argument("--text", help="the message")
    group.add_argument("--text-file", metavar="F", help="read the message from a UTF-8 file")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand and option (:data:`_COMMANDS`); each sets ``func(args) -> exit status``."""
    parser = Parser(prog="telegram-fence", description="Durable pyTelegramBotAPI bots: operations.")
    parser.add_argument("--version", action="version", version=f"telegram_fence {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, Any] = {}
    for name, func, help_text, description, args in _COMMANDS:
        where = sub
        if " " in name:
            group, name = name.split(" ")
            if group not in groups:
                group_help, metavar = _GROUPS[group]
                groups[group] = sub.add_parser(group, help=group_help, description=group_help).add_subparsers(
                    dest=f"{group}_command", metavar=metavar, required=True)
            where = groups[group]
        command = where.add_parser(name, help=help_text, description=description)
        for arg in args:
            if callable(arg):
                arg(command)
            else:
                command.add_argument(*arg[0], **arg[1])
        command.set_defaults(func=func)
    return parser


@contextmanager
def _escaping_output() -> Iterator[None]:
    """Within the block, stdout and stderr write what UTF-8 cannot encode (a lone surrogate a user sent) as its
    escape, ``\\ud83d``, so ``--json`` stays valid JSON that decodes back to what was stored."""
    streams = [(stream, stream.errors) for stream in (sys.stdout, sys.stderr)
               if isinstance(stream, io.TextIOWrapper) and stream.errors != "backslashreplace"]
    for stream, _errors in streams:
        stream.reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        for stream, errors in streams:
            if not stream.closed:
                stream.reconfigure(errors=errors)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (parse errors exit 2 through ``SystemExit``)."""
    with _escaping_output():
        args: argparse.Namespace | None = None
        try:
            args = build_parser().parse_args(argv)
            code = int(args.func(args) or 0)
            sys.stdout.flush()
            return code
        except BrokenPipeError:  # its reader went away: stdout to /dev/null, so the exit flush cannot fail again
            with contextlib.suppress(OSError, ValueError):  # stdout without a file descriptor (captured in a test)
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            return EXIT_BROKEN_PIPE
        except StoreUnavailable as exc:
            timeout = getattr(args, "timeout", None)
            writes = getattr(args, "ack", None) or getattr(args, "requeue_failed", None) is not None
            if timeout is None or writes:  # a write (retry, prune, --ack, --requeue-failed) found the file
                print(f"telegram-fence: {exc}", file=sys.stderr)  # locked past its busy timeout: try again later
            else:
                health = getattr(args, "func", None) is cmd_status
                shown = "so its health is unknown" if health else "so nothing is shown"
                print(f"telegram-fence: {unread_line(exc, timeout, shown)}", file=sys.stderr)
            return 1
        except FenceError as exc:  # bad input (a failed Bot API call of `webhook` says its own exit status)
            print(f"telegram-fence: {mask_tokens(str(exc))}", file=sys.stderr)
            return int(getattr(exc, "exit_code", 2))
        except (apsw.Error, OSError) as exc:  # the file or the disk, not the input: still one line, named
            print(f"telegram-fence: {type(exc).__name__}: {mask_tokens(str(exc))}", file=sys.stderr)
        except OverflowError as exc:  # a number the parsers let through that SQLite cannot bind: bad input
            print(f"telegram-fence: a number is too large for the database (at most {MAX_ID}): {exc}",
                  file=sys.stderr)
        except KeyboardInterrupt:
            return 130
        return 2
