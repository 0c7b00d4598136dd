"""The crash drill: a fenced bot against the fake Bot API server, killed with SIGKILL and restarted, then checked:
every update has exactly one domain row, all are confirmed, none is left open or exhausted, no reply is sent twice.
``telegram-fence demo`` runs it briefly; the crash tests longer, on SQLite or PostgreSQL (:class:`DrillDb`)."""

from __future__ import annotations

import argparse
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

import apsw

from ..calls.journal import Journal
from ..calls.verdicts import INTENT, UNCERTAIN

if TYPE_CHECKING:
    from ..store.postgres import PostgresUpdateStore
    from ..store.sqlite import SqliteUpdateStore
    from ..testing.readiness import ReadinessSocket

#: Gives the drill's child a PostgreSQL connection string (``DB`` is then the inbox table), off its command line.
DRILL_DSN = "TELEGRAM_FENCE_DRILL_DSN"


class DrillDb:
    """The drill's database: a SQLite file ``db`` with the table ``notes``, or with ``postgres`` (a connection
    string) the PostgreSQL inbox table ``db`` and ``{db}_notes``."""

    def __init__(self, db: str, postgres: str | None = None) -> None:
        self.db = db
        self.postgres = postgres
        self._notes = "notes" if postgres is None else f"{db}_notes"

    def open_store(self) -> SqliteUpdateStore | PostgresUpdateStore:
        """The store the bot runs on, with the notes table made."""
        if self.postgres is None:
            from ..store.sqlite import SqliteUpdateStore

            store: SqliteUpdateStore | PostgresUpdateStore = SqliteUpdateStore(self.db)
            types = "INTEGER PRIMARY KEY, chat_id INTEGER NOT NULL, text TEXT, claim_id TEXT NOT NULL"
        else:
            from ..store.postgres import PostgresUpdateStore

            store = PostgresUpdateStore(self.postgres, table=self.db)
            types = "bigint PRIMARY KEY, chat_id bigint NOT NULL, text text, claim_id text NOT NULL"
        with store.write() as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self._notes}(update_id {types})")
        return store

    def insert_note(self, conn: Any, update_id: int, chat_id: int, text: str | None, claim_id: str) -> None:
        mark = "?" if self.postgres is None else "%s"
        conn.execute(f"INSERT INTO {self._notes}(update_id, chat_id, text, claim_id) VALUES "
                     f"({mark}, {mark}, {mark}, {mark})", (update_id, chat_id, text, claim_id))

    def count_notes(self) -> int:
        """How many notes are written, read from outside the bot; 0 while the database or its table is being made."""
        try:
            if self.postgres is not None:
                import psycopg

                conn: Any = psycopg.connect(self.postgres, autocommit=True)
            else:
                conn = apsw.Connection(self.db, flags=apsw.SQLITE_OPEN_READONLY)
                conn.set_busy_timeout(2000)
            try:
                row = conn.execute(f"SELECT count(*) FROM {self._notes}").fetchone()
                return int(row[0]) if row else 0
            finally:
                conn.close()
        except Exception:  # not there yet
            return 0

    def check(self, ids: Sequence[int], report: DrillReport) -> None:
        """Fill ``report`` in from the store's counts and the notes, with a problem for each broken invariant."""
        store = self.open_store()
        try:
            stats = store.stats()
            report.handled = stats["settled"]
            report.left_open = stats["pending"] + stats["claimed"]
            report.exhausted = stats["exhausted"] + stats["acknowledged"]
            # A reply in flight when its process was killed: its outcome is unknown, it is never sent again.
            calls = Journal(store).counts()
            report.unknown_calls = calls.get(UNCERTAIN, 0) + calls.get(INTENT, 0)
            with store.write() as conn:
                rows = conn.execute(f"SELECT update_id, count(*) FROM {self._notes} GROUP BY update_id").fetchall()
        finally:
            store.close()
        per_update = {row[0]: row[1] for row in rows}
        report.domain_rows = sum(per_update.values())
        report.updates_with_one_row = sum(1 for u in ids if per_update.get(u) == 1)
        if report.updates_with_one_row != len(ids):
            missing = [u for u in ids if u not in per_update][:5]
            report.problems.append(f"{len(ids) - report.updates_with_one_row} updates without exactly one domain "
                                   f"row (first missing: {missing})")
        if report.domain_rows != len(ids):
            report.problems.append(f"{report.domain_rows} domain rows for {len(ids)} updates")
        if report.left_open:
            report.problems.append(f"{report.left_open} updates left pending or claimed")
        if report.exhausted:
            report.problems.append(f"{report.exhausted} updates exhausted")


def run_child(api_url: str, token: str, db: str, lease: float, workers: int, postgres: str | None = None) -> int:
    """The drill's fenced bot: replies to every message and writes one note per update, fenced; on the SQLite
    file ``db``, or with ``postgres`` the PostgreSQL inbox table ``db``."""
    import telebot

    from ..runtime.fence import Fence
    from ..telegram import use_api_url

    use_api_url(api_url)
    bot = telebot.TeleBot(token)
    drill_db = DrillDb(db, postgres)
    store = drill_db.open_store()
    fence = Fence(bot, store, workers=workers, lease=lease, long_poll_timeout=1.0, shutdown_timeout=5,
                  max_attempts=50)

    @fence.attempt_handler
    def take_note(update: telebot.types.Update, ctx: object) -> None:
        message = update.message
        if message is None:
            return
        # The reply goes through the call journal: at most once (a kill between the reply and the commit replays it
        # from the journal; one in flight at a kill is recorded uncertain and never resent). The note: exactly once.
        bot.send_message(message.chat.id, f"noted: {message.text}")
        with ctx.transaction(complete=True) as db_conn:  # type: ignore[attr-defined]
            drill_db.insert_note(db_conn, update.update_id, message.chat.id, message.text,
                                 ctx.identity.claim_id)  # type: ignore[attr-defined]

    code = fence.run()
    store.close()
    return code


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


def _spawn(api_url: str, token: str, db: str, lease: float, workers: int, ready: ReadinessSocket,
           postgres: str | None = None) -> subprocess.Popen[bytes]:
    """The drill's bot in a child process that reports to ``ready`` once SIGTERM stops it cleanly; with
    ``postgres`` it runs on that database, ``db`` being the inbox table."""
    env = ready.env(PYTHONUNBUFFERED="1")
    env.pop(DRILL_DSN, None)
    if postgres is not None:
        env[DRILL_DSN] = postgres
    return subprocess.Popen(
        [sys.executable, "-m", "telegram_fence.cli.demo", api_url, token, db, str(lease), str(workers)],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=None if os.environ.get("TF_DRILL_VERBOSE") else subprocess.DEVNULL,
    )


def run_drill(*, updates: int = 300, kills: int = 3, chats: int = 20, workdir: str | os.PathLike[str] | None = None,
              seed: int | None = None, lease: float = 1.0, workers: int = 4, latency: float = 0.002,
              timeout: float = 120.0, say: Callable[[str], None] = lambda line: None, postgres: str | None = None,
              table: str = "fence_drill") -> DrillReport:
    """Push ``updates`` messages, SIGKILL the bot ``kills`` times at random moments, finish, and check: on a SQLite
    file in ``workdir`` (default: a temporary directory), or on ``postgres``'s ``table`` (left for the caller)."""
    from ..testing.fake_api import FakeBotAPI
    from ..testing.readiness import ReadinessSocket

    rng = random.Random(seed)
    report = DrillReport()
    started = time.monotonic()
    deadline = started + timeout
    with tempfile.TemporaryDirectory(prefix="fence-drill-") as tmp, ReadinessSocket() as ready:
        db = str(Path(workdir or tmp) / "drill.db") if postgres is None else table
        drill_db = DrillDb(db, postgres)
        with FakeBotAPI(max_long_poll=1.0, latency={"sendMessage": latency}) as api:
            ids = api.push_messages(updates, chats=list(range(1, chats + 1)), text="note {i}")
            report.pushed = len(ids)
            report.last_update_id = ids[-1] if ids else 0
            # Kill points: random counts of replies. Each kill may leave up to one reply per running handler
            # uncertain (never sent again), so the points stop that many replies short of the end.
            reachable = max(2, updates - kills * workers)
            points = sorted(rng.sample(range(1, reachable), k=min(kills, reachable - 1)))
            child = _spawn(api.api_url, api.token, db, lease, workers, ready, postgres)
            for point in points:
                if not _reach(api, point, drill_db, updates, deadline):
                    break
                time.sleep(rng.random() * 0.02)  # jitter: kills land at different phases (claim, handle, settle)
                child.send_signal(signal.SIGKILL)
                child.wait()
                report.kills += 1
                say(f"killed the bot (kill {report.kills}) after {len(api.sent)} replies; restarting")
                child = _spawn(api.api_url, api.token, db, lease, workers, ready, postgres)
            done = _wait_done(drill_db, updates, deadline)
            # The last kill may land after the last note: a SIGTERM before the restarted bot's handlers are in
            # place would kill it (exit -15). It says when they are.
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
            report.replies = len(api.sent)
            per_text = Counter((s.chat_id, s.text) for s in api.sent)
            report.repeated_replies = sum(n - 1 for n in per_text.values() if n > 1)
            report.confirmed_offset = api.confirmed_offset
        drill_db.check(ids, report)
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
        report.problems.append(f"Telegram was left with unconfirmed updates (offset {report.confirmed_offset}, "
                               f"last id {report.last_update_id})")
    return report


def _reach(api: Any, point: int, drill_db: DrillDb, updates: int, deadline: float) -> bool:
    """Wait until the fake has seen ``point`` replies (a kill point); ``False`` at the deadline, or as soon as every
    note is written (a reply a kill left uncertain is never sent again: a late kill point may never be reached)."""
    while (remaining := deadline - time.monotonic()) > 0:
        if api.wait_for(lambda: len(api.sent) >= point, timeout=min(1.0, remaining)):
            return True
        if drill_db.count_notes() >= updates:
            return False
    return False


def _wait_done(drill_db: DrillDb, expected: int, deadline: float) -> bool:
    """Wait until the notes table holds ``expected`` rows (read from outside the bot)."""
    pause = 0.05
    while time.monotonic() < deadline:
        if drill_db.count_notes() >= expected:
            return True
        time.sleep(pause)  # another process's progress: nothing in this process to wait on
        pause = min(0.5, pause * 1.5)
    return False


def cmd_demo(args: argparse.Namespace) -> int:
    """``telegram-fence demo``: the drill and its report; exit 1 when an invariant broke."""
    print(f"telegram_fence demo: a fenced bot against the built-in fake Bot API server, {args.updates} "
          f"messages, {args.kills} SIGKILLs")
    report = run_drill(updates=args.updates, kills=args.kills, seed=args.seed, say=print)
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


if __name__ == "__main__":  # the drill's child
    _api_url, _token, _db, _lease, _workers = sys.argv[1:]
    sys.exit(run_child(_api_url, _token, _db, float(_lease), int(_workers), postgres=os.environ.get(DRILL_DSN) or None))
