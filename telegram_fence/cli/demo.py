"""The crash drill: a fenced bot against the fake Bot API server, killed with SIGKILL and restarted.

``telegram-fence demo`` runs it with a few hundred messages and prints a report; the crash tests
run the same drill with more messages and more kills and check the same invariants:

- every pushed update has exactly one domain row (written with ``ctx.transaction(complete=True)``);
- the fake server's confirmed offset is past the last update (nothing left unconfirmed);
- no update is left pending or claimed, none exhausted.

The child is this module run as ``python -m telegram_fence.cli.demo child …``: the example bot below.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .drill_db import SQLITE_NOTES, DrillDb

if TYPE_CHECKING:
    from ..testing.readiness import ReadinessSocket

__all__ = ["DrillReport", "main", "run_drill"]

#: The SQLite drill's domain table (for the tests' children that write the same notes).
_DOMAIN_SCHEMA = SQLITE_NOTES

#: The environment variable that gives the drill's child a PostgreSQL connection string (``--db`` is then the
#: inbox table): kept off the command line, where a password would show in ``ps``.
DRILL_DSN = "TELEGRAM_FENCE_DRILL_DSN"


# --- the example bot (runs in the child) ---------------------------------------------------------


def run_child(api_url: str, token: str, db: str, lease: float, workers: int, long_poll: float = 1.0,
              postgres: str | None = None) -> int:
    """The example fenced bot: replies to every message and writes one note per update, fenced.

    ``api_url`` is a Bot API server (``http://host:port`` or telebot's ``…/bot{0}/{1}`` format); ``db`` the
    SQLite file, or with ``postgres`` (a connection string) the PostgreSQL inbox table (see :mod:`.drill_db`).
    """
    import telebot

    from ..errors import ConfigurationError
    from ..runtime.fence import Fence
    from ..telegram import use_api_url

    use_api_url(api_url)
    try:
        bot = telebot.TeleBot(token)
    except ValueError:
        raise ConfigurationError("the token does not look like a bot token (id:secret)") from None
    drill_db = DrillDb(db, postgres)
    store = drill_db.open_store()
    fence = Fence(bot, store, workers=workers, lease=lease, long_poll_timeout=long_poll, shutdown_timeout=5,
                  max_attempts=50)

    @fence.attempt_handler
    def take_note(update: telebot.types.Update, ctx: object) -> None:
        message = update.message
        if message is None:
            return
        # The reply goes through the fence's call journal: at most once (a kill between the reply and the
        # commit replays it from the journal instead of sending it again; one in flight at a kill is recorded
        # uncertain and never resent). The note is inside the fence: exactly once.
        bot.send_message(message.chat.id, f"noted: {message.text}")
        with ctx.transaction(complete=True) as db_conn:  # type: ignore[attr-defined]
            drill_db.insert_note(db_conn, update.update_id, message.chat.id, message.text,
                                 ctx.identity.claim_id)  # type: ignore[attr-defined]

    code = fence.run()
    store.close()
    return code


# --- the drill (runs in the parent) --------------------------------------------------------------


@dataclass
class DrillReport:
    """What a drill measured; ``ok`` tells whether every invariant held."""

    pushed: int = 0
    kills: int = 0
    handled: int = 0
    domain_rows: int = 0
    updates_with_one_row: int = 0
    replies: int = 0
    repeated_replies: int = 0
    unknown_calls: int = 0
    confirmed_offset: int = 0
    last_update_id: int = 0
    left_open: int = 0
    exhausted: int = 0
    final_exit_code: int | None = None
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        return [
            f"updates pushed          {self.pushed}",
            f"kills survived          {self.kills} (SIGKILL at random moments, then restart)",
            f"updates handled         {self.handled}",
            f"domain writes           {self.domain_rows} ({self.updates_with_one_row} updates with exactly one)",
            f"replies sent            {self.replies} for {self.pushed} updates ({self.repeated_replies} repeated; "
            f"{self.unknown_calls} were in flight at a kill: listed uncertain, never resent)",
            f"confirmed offset        {self.confirmed_offset} (last update id {self.last_update_id})",
            f"left open / exhausted   {self.left_open} / {self.exhausted}",
            f"final exit code         {self.final_exit_code}",
            f"time                    {self.seconds:.1f} s",
            "result                  " + ("OK: nothing lost, nothing written twice" if self.ok else "FAILED"),
            *(f"problem: {p}" for p in self.problems),
        ]


def _spawn(api_url: str, token: str, db: str, lease: float, workers: int,
           ready: ReadinessSocket | None = None, postgres: str | None = None) -> subprocess.Popen[bytes]:
    """The example bot in a child process; with ``ready`` it reports there once SIGTERM stops it cleanly; with
    ``postgres`` it runs on that database, ``db`` being the inbox table."""
    env = dict(os.environ, PYTHONUNBUFFERED="1") if ready is None else ready.env(PYTHONUNBUFFERED="1")
    env.pop(DRILL_DSN, None)
    if postgres is not None:
        env[DRILL_DSN] = postgres
    return subprocess.Popen(
        [sys.executable, "-m", "telegram_fence.cli.demo", "child", "--api-url", api_url, "--token", token,
         "--db", db, "--lease", str(lease), "--workers", str(workers)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=None if os.environ.get("TF_DRILL_VERBOSE") else subprocess.DEVNULL,
    )


def run_drill(
    *,
    updates: int = 300,
    kills: int = 3,
    chats: int = 20,
    workdir: str | os.PathLike[str] | None = None,
    seed: int | None = None,
    lease: float = 1.0,
    workers: int = 4,
    latency: float = 0.002,
    timeout: float = 120.0,
    say: Callable[[str], None] = lambda line: None,
    postgres: str | None = None,
    table: str = "fence_drill",
) -> DrillReport:
    """Push ``updates`` messages, SIGKILL the bot ``kills`` times at random moments, finish, and check.

    On a SQLite file in ``workdir`` (a temporary directory by default), or with ``postgres`` (a connection
    string) on the PostgreSQL inbox ``table`` and its ``{table}_notes`` (left for the caller to drop).
    Raises ``TimeoutError`` when the bot does not finish within ``timeout`` seconds.
    """
    from ..testing.fake_api import FakeBotAPI
    from ..testing.readiness import ReadinessSocket

    rng = random.Random(seed)
    report = DrillReport()
    started = time.monotonic()
    deadline = started + timeout
    with tempfile.TemporaryDirectory(prefix="fence-drill-") as tmp, ReadinessSocket() as ready:
        db = str(Path(workdir or tmp) / "drill.db") if postgres is None else table
        with FakeBotAPI(max_long_poll=1.0, latency={"sendMessage": latency}) as api:
            ids = api.push_messages(updates, chats=list(range(1, chats + 1)), text="note {i}")
            report.pushed = len(ids)
            report.last_update_id = ids[-1] if ids else 0
            # Kill points: random counts of replies, spread over the run. Each kill may leave up to one reply per
            # running handler uncertain (never sent again), so the points stop that many replies short of the end:
            # every one of them is reached (a later one was waited for until the timeout, then the drill counted
            # fewer kills than asked).
            reachable = max(2, updates - kills * workers)
            points = sorted(rng.sample(range(1, reachable), k=min(kills, reachable - 1)))
            child = _spawn(api.api_url, api.token, db, lease, workers, ready, postgres)
            for point in points:
                if not _reach(api, point, db, updates, deadline, postgres):
                    break
                # A little random jitter so kills land at different phases (claim, handle, settle, record).
                time.sleep(rng.random() * 0.02)
                child.send_signal(signal.SIGKILL)
                child.wait()
                report.kills += 1
                say(f"killed the bot (kill {report.kills}) after {len(api.sent)} replies; restarting")
                child = _spawn(api.api_url, api.token, db, lease, workers, ready, postgres)
            done = _wait_done(db, updates, deadline, postgres)
            # The last kill may land after the last note: the restarted bot is then still starting, and a
            # SIGTERM before its handlers are in place would kill it (exit -15). It says when they are.
            if ready.wait_ready(child, timeout=max(1.0, deadline - time.monotonic())):
                child.send_signal(signal.SIGTERM)
            else:
                report.problems.append("the bot did not report ready (READY=1 on $NOTIFY_SOCKET) before the "
                                       "timeout" if child.poll() is None else "the bot exited on its own")
                child.kill()
            try:
                report.final_exit_code = child.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
                report.problems.append("the bot did not stop within the timeout after SIGTERM")
            if not done:
                report.problems.append("the bot did not handle every update before the timeout")
            sent = api.sent
            report.replies = len(sent)
            per_text = Counter((s.chat_id, s.text) for s in sent)
            report.repeated_replies = sum(n - 1 for n in per_text.values() if n > 1)
            report.confirmed_offset = api.confirmed_offset
        _check_db(db, ids, report, postgres)
    report.seconds = time.monotonic() - started
    if report.final_exit_code != 0:
        report.problems.append(f"the bot exited with {report.final_exit_code} after SIGTERM, not 0")
    if report.repeated_replies:
        report.problems.append(f"{report.repeated_replies} replies reached Telegram twice (the call journal "
                               "sends each at most once)")
    missing = report.pushed - (report.replies - report.repeated_replies)
    if missing > report.unknown_calls:
        report.problems.append(f"{missing} updates got no reply, but only {report.unknown_calls} calls are "
                               "listed uncertain")
    if report.unknown_calls > report.kills * (workers + 1):
        report.problems.append(f"{report.unknown_calls} uncertain calls for {report.kills} kills (at most one per "
                               f"handler thread per kill: {workers} workers and the dispatcher)")
    if report.confirmed_offset <= report.last_update_id:
        report.problems.append(
            f"Telegram was left with unconfirmed updates (offset {report.confirmed_offset}, "
            f"last id {report.last_update_id})"
        )
    return report


def _sent_at_least(api: Any, count: int) -> bool:
    return len(api.sent) >= count


def _reach(api: Any, point: int, db: str, updates: int, deadline: float, postgres: str | None = None) -> bool:
    """Wait until the fake has seen ``point`` replies (a kill point); ``False`` at the deadline, or as soon as every
    note is written: a reply a kill left uncertain is never sent again, so a late kill point may never be reached,
    and the drill waited for its whole timeout (600 s in the tests) with all the work done."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if api.wait_for(functools.partial(_sent_at_least, api, point), timeout=min(1.0, remaining)):
            return True
        try:
            if _count_notes(db, postgres) >= updates:
                return False
        except Exception:  # the file or the table is being made: not done
            pass


def _count_notes(db: str, postgres: str | None = None) -> int:
    return DrillDb(db, postgres).count_notes()


def _wait_done(db: str, expected: int, deadline: float, postgres: str | None = None) -> bool:
    """Wait until the notes table holds ``expected`` rows (read-only, from outside the bot)."""
    drill_db = DrillDb(db, postgres)
    pause = 0.05
    while time.monotonic() < deadline:
        if postgres is not None or os.path.exists(db):
            try:
                row_count = drill_db.count_notes()
            except Exception:  # the file or the table is being made: not there yet
                row_count = 0
            if row_count >= expected:
                return True
        time.sleep(pause)  # another process's progress: nothing in this process to wait on
        pause = min(0.5, pause * 1.5)
    return False


def _check_db(db: str, ids: Sequence[int], report: DrillReport, postgres: str | None = None) -> None:
    DrillDb(db, postgres).check(ids, report)


def main(argv: Sequence[str] | None = None) -> int:
    """``telegram-fence demo`` (and the child mode used by the drill); bad input exits 2 with one line."""
    from ..errors import FenceError
    from .args import Parser, non_negative_int, positive_float, positive_int

    parser = Parser(prog="telegram-fence demo", description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode")
    child = sub.add_parser("child", help="run the example bot (used by the drill)")
    child.add_argument("--api-url", required=True)
    child.add_argument("--token", required=True)
    child.add_argument("--db", required=True)
    child.add_argument("--lease", type=positive_float, default=1.0)
    child.add_argument("--workers", type=positive_int, default=4)
    parser.add_argument("--updates", type=positive_int, default=300, help="messages to push (default 300)")
    parser.add_argument("--kills", type=non_negative_int, default=3, help="SIGKILLs at random moments (default 3)")
    parser.add_argument("--seed", type=int, default=None, help="seed for the kill moments")
    parser.add_argument("--api-url", default=None, metavar="URL",
                        help="run the demo bot alone against this Bot API server (token from $TELEGRAM_BOT_TOKEN)")
    parser.add_argument("--db", default="demo.db", help="the demo bot's database with --api-url (default demo.db)")
    args = parser.parse_args(argv)
    try:
        if args.mode == "child":
            return run_child(args.api_url, args.token, args.db, args.lease, args.workers,
                             postgres=os.environ.get(DRILL_DSN) or None)
        if args.api_url is not None:
            return _run_against(args.api_url, args.db)
    except FenceError as exc:
        print(f"telegram-fence demo: {exc}", file=sys.stderr)
        return 2
    print(f"telegram_fence demo: a fenced bot against the built-in fake Bot API server, {args.updates} "
          f"messages, {args.kills} SIGKILLs")
    report = run_drill(updates=args.updates, kills=args.kills, seed=args.seed, say=print)
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


def _refuse_foreign(db: str) -> None:
    """Refuse (:class:`DatabaseRefused`) a ``--db`` that exists and is not a telegram_fence database of this
    version or older: the demo would switch another application's file to WAL and add its tables to it.
    A missing or empty file is fine (the demo creates it)."""
    from .database import DatabaseRefused, inspect

    if not os.path.lexists(db) or (os.path.isfile(db) and not os.path.islink(db) and os.path.getsize(db) == 0):
        return
    found = inspect(db)  # raises DatabaseRefused for anything but a fence database
    from ..store.schema import LATEST

    if found.version > LATEST:
        raise DatabaseRefused(f"{db}: schema version {found.version} is newer than this telegram_fence ({LATEST})")


def _run_against(api_url: str, db: str) -> int:
    """The demo bot alone against a Bot API server, until SIGINT/SIGTERM (no drill: nothing to push or kill)."""
    from ..errors import ConfigurationError
    from ..telegram import api_url_formats

    api_url_formats(api_url)  # a malformed URL is refused before anything starts
    token = os.environ.get("TELEGRAM_BOT_TOKEN", "").strip()
    if not token:
        raise ConfigurationError("TELEGRAM_BOT_TOKEN is not set: the demo bot needs a token for --api-url")
    _refuse_foreign(db)
    print(f"telegram_fence demo: the demo bot against {api_url}, database {db}; Ctrl-C stops it")
    return run_child(api_url, token, db, lease=30.0, workers=4, long_poll=25.0)


if __name__ == "__main__":
    sys.exit(main())
