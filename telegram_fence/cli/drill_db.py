"""The crash drill's database on either backend: the store the drill's bot runs on, its domain table of notes,
and the parent's read of both (how many notes, one per update, nothing left open).

SQLite: ``db`` is the file, the notes are the table ``notes`` in it. PostgreSQL: ``postgres`` is the libpq
connection string, ``db`` the inbox table; the notes are ``{db}_notes``. The child writes its note inside
``ctx.transaction(complete=True)`` either way: exactly one per update, whatever kills it. May import APSW,
psycopg (PostgreSQL only), the store and the standard library (layer 4, CLI).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import apsw

from ..calls.journal import Journal
from ..calls.verdicts import INTENT, UNCERTAIN

if TYPE_CHECKING:
    from ..store.postgres import PostgresUpdateStore
    from ..store.sqlite import SqliteUpdateStore

__all__ = ["SQLITE_NOTES", "DrillDb", "Report"]

SQLITE_NOTES = (
    "CREATE TABLE IF NOT EXISTS notes("
    "update_id INTEGER PRIMARY KEY, chat_id INTEGER NOT NULL, text TEXT, claim_id TEXT NOT NULL)"
)


class Report(Protocol):
    """What :meth:`DrillDb.check` fills in (``cli.demo.DrillReport``)."""

    handled: int
    left_open: int
    exhausted: int
    domain_rows: int
    updates_with_one_row: int
    unknown_calls: int
    problems: list[str]


class DrillDb:
    """The drill's database: a SQLite file (``postgres=None``) or a PostgreSQL inbox table ``db``."""

    def __init__(self, db: str, postgres: str | None = None) -> None:
        self.db = db
        self.postgres = postgres
        self._notes = "notes" if postgres is None else f"{db}_notes"

    def open_store(self) -> SqliteUpdateStore | PostgresUpdateStore:
        """The store the bot runs on (the child's), with the notes table made."""
        if self.postgres is None:
            from ..store.sqlite import SqliteUpdateStore

            store: SqliteUpdateStore | PostgresUpdateStore = SqliteUpdateStore(self.db)
        else:
            from ..store.postgres import PostgresUpdateStore

            store = PostgresUpdateStore(self.postgres, table=self.db)
        with store.write() as conn:
            conn.execute(self._schema())
        return store

    def insert_note(self, conn: Any, update_id: int, chat_id: int, text: str | None, claim_id: str) -> None:
        """Write the note of one update on ``conn`` (the fenced transaction's connection)."""
        mark = "?" if self.postgres is None else "%s"
        conn.execute(f"INSERT INTO {self._notes}(update_id, chat_id, text, claim_id) VALUES "
                     f"({mark}, {mark}, {mark}, {mark})", (update_id, chat_id, text, claim_id))

    def count_notes(self) -> int:
        """How many notes are written (read from outside the bot; 0 before the table exists)."""
        if self.postgres is None:
            conn = apsw.Connection(self.db, flags=apsw.SQLITE_OPEN_READONLY)
            conn.set_busy_timeout(2000)
            try:
                if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'notes'").fetchone() is None:
                    return 0
                row = conn.execute("SELECT count(*) FROM notes").fetchone()
                return int(row[0]) if row else 0
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.postgres, autocommit=True) as pg:
            row = pg.execute("SELECT CASE WHEN to_regclass(%s) IS NULL THEN 0 ELSE -1 END", (self._notes,)).fetchone()
            if row is None or row[0] == 0:
                return 0
            counted = pg.execute(f"SELECT count(*) FROM {self._notes}").fetchone()
            return int(counted[0]) if counted else 0

    def check(self, ids: Sequence[int], report: Report) -> None:
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
                cursor = conn.execute(f"SELECT update_id, count(*) FROM {self._notes} GROUP BY update_id")
                rows = [tuple(row) for row in cursor.fetchall()]
        finally:
            store.close()
        per_update = dict(rows)
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

    def _schema(self) -> str:
        if self.postgres is None:
            return SQLITE_NOTES
        return (f"CREATE TABLE IF NOT EXISTS {self._notes}("
                "update_id bigint PRIMARY KEY, chat_id bigint NOT NULL, text text, claim_id text NOT NULL)")
