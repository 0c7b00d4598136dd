"""The call journal's crash drill: a plain telebot bot in a child process, SIGKILLed at random moments while
the fake Bot API answers sendMessage after a short delay (so kills land mid-request), restarted each time.

Nothing reaches the fake twice; every reply that never arrived is journaled uncertain; the uncertain calls are
at most kills x workers. The short form runs in CI; ``TF_SOAK=1`` runs the long form. The figures are printed.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SOAK
from helpers import eventually, signal_when_ready
from pg_support import DSN, drop_tables, new_table
from webhook_support import SECRET

from telegram_fence import SqliteUpdateStore
from telegram_fence.calls.journal import list_calls
from telegram_fence.testing import FakeBotAPI, ReadinessSocket

pytestmark = pytest.mark.drill

CHILD = str(Path(__file__).with_name("calls_child.py"))
WORKERS = 4


def _spawn(api: FakeBotAPI, db: str, port: int | None, ready: ReadinessSocket,
           queued: bool | str = False, log: Path | None = None) -> subprocess.Popen[bytes]:
    """The child bot; its log (stderr: WARNING and above) is appended to ``log`` when given."""
    mode = queued if isinstance(queued, str) else "1" if queued else "0"
    env = ready.env(PYTHONPATH=os.pathsep.join(sys.path), TF_TEST_SECRET=SECRET, TF_QUEUED_REPLY=mode)
    door = [] if port is None else [str(port)]
    with open(log, "ab") if log is not None else open(os.devnull, "wb") as err:
        return subprocess.Popen([sys.executable, CHILD, db, api.api_url, api.token, str(WORKERS), *door], env=env,
                                stdout=subprocess.DEVNULL, stderr=err)


def _named_in(log: Path, update_id: int, seq: int) -> bool:
    """Whether the bot's log names call ``seq`` of ``update_id`` (a WARNING of the journal)."""
    pattern = rf"update {update_id}: (queued )?sendMessage \(call {seq}\b"
    return re.search(pattern, log.read_text(errors="replace")) is not None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _open(db: str) -> Any:
    if not db.startswith("postgres:"):
        return SqliteUpdateStore(db)
    from telegram_fence.store.postgres import PostgresUpdateStore

    dsn, _, table = db[len("postgres:"):].rpartition("|")
    return PostgresUpdateStore(dsn, table=table, create_table=False, pool_size=1)


def _settled(db: str) -> int:
    with _open(db) as store:
        return int(store.stats()["settled"])


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(DSN is None,
                                                                                    reason="no PostgreSQL"))])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The drill's database: a SQLite file, or a fresh PostgreSQL table (dropped afterwards)."""
    if request.param == "sqlite":
        yield str(tmp_path / "bot.db")
        return
    from telegram_fence.store.postgres import PostgresUpdateStore

    table = new_table("tf_calls_drill")
    PostgresUpdateStore(str(DSN), table=table).close()
    try:
        yield f"postgres:{DSN}|{table}"
    finally:
        drop_tables(table)


@pytest.mark.soak
@pytest.mark.parametrize("door", ["polling", "webhook"])
def test_sigkill_drill_sends_no_reply_twice_and_lists_every_missing_one_uncertain(db: str, door: str,
                                                                                   tmp_path: Path) -> None:
    """Repeated SIGKILLs mid-request, behind either door: no reply reaches the fake twice, every missing reply
    is journaled uncertain and named in the bot's log, uncertain calls <= kills x workers, and every update ends
    settled."""
    log = tmp_path / "bot.log"
    updates, kills = (2000, 30) if SOAK else (400, 8)
    if db.startswith("postgres:") and not SOAK:
        updates, kills = 200, 5
    port = _free_port() if door == "webhook" else None
    rng = random.Random()
    with FakeBotAPI(max_long_poll=0.5, latency={"sendMessage": 0.02}, webhook_retry_delay=0.05,
                    webhook_max_retry_delay=0.25) as api, ReadinessSocket() as ready:
        ids = api.push_messages(updates, chats=list(range(1, 41)))
        child = _spawn(api, db, port, ready, log=log)
        done_kills = 0
        try:
            while done_kills < kills:
                # a random moment while replies flow: a few to a few dozen requests after this run's first one,
                # plus up to one request's delay, so handlers are mid-request when the kill lands
                sends = len(api.calls_to("sendMessage"))
                target = min(sends + rng.randint(3, 40), updates - 20)  # never past the last updates' replies
                assert api.wait_for(lambda t=target: len(api.calls_to("sendMessage")) >= t, timeout=60)
                time.sleep(rng.uniform(0.0, 0.02))
                child.send_signal(signal.SIGKILL)
                child.wait(10)
                done_kills += 1
                child = _spawn(api, db, port, ready, log=log)
            assert eventually(lambda: _settled(db) >= updates, timeout=120, interval=0.2)
        finally:
            # the last kill may come after the last settle: the SIGTERM waits until the restarted bot is ready
            signal_when_ready(child, ready)
            assert child.wait(20) == 0
        received = Counter(str(call.params.get("text")) for call in api.calls_to("sendMessage"))
    with _open(db) as store, store.write() as conn:
        stats = store.stats()
        rows = list(list_calls(conn, limit=10 * updates))
    expected = {f"{u}:{n}" for u in ids for n in (1, 2)}
    duplicates = {text: n for text, n in received.items() if n > 1}
    missing = expected - set(received)
    journal = {(r.update_id, r.seq): r for r in rows}
    uncertain = [r for r in rows if r.state == "uncertain"]
    listed_missing = {f"{r.update_id}:{r.seq + 1}" for r in uncertain}
    backend = "postgres" if db.startswith("postgres:") else "sqlite"
    print(f"\ncalls drill ({backend}, {door}): updates={updates} kills={done_kills} workers={WORKERS} "
          f"sends={sum(received.values())} "
          f"duplicates={len(duplicates)} missing={len(missing)} uncertain={len(uncertain)} "
          f"intent_left={sum(r.state == 'intent' for r in rows)}")
    assert done_kills == kills
    assert stats["settled"] == updates and stats["pending"] == 0 and stats["claimed"] == 0
    assert duplicates == {}, "a reply reached the fake twice"
    assert missing <= listed_missing, f"replies that never arrived and are not journaled uncertain: {missing}"
    assert len(uncertain) <= done_kills * WORKERS
    assert all(r.state in ("sent", "uncertain") for r in rows)
    assert len(journal) == 2 * updates, "every update journaled its two replies"
    unnamed = [(r.update_id, r.seq) for r in uncertain if not _named_in(log, r.update_id, r.seq)]
    assert unnamed == [], "uncertain calls the bot never logged"


def _queued_rows(db: str) -> int:
    with _open(db) as store, store.write() as conn:
        return sum(r.state == "queued" for r in list_calls(conn, limit=100_000))


def test_sigkill_drill_with_the_second_reply_queued_in_the_settle_sends_none_twice(db: str, tmp_path: Path) -> None:
    """The second reply is queued in the transaction that settles the update and sent after its commit; SIGKILLs
    land between commits and sends and mid-send. No reply reaches the fake twice; a reply the kill left queued is
    sent by the next start (none stays queued); every reply that never arrived is journaled with an unknown
    outcome (uncertain, or an intent of a settled update, which `calls --uncertain` lists) and named in the bot's
    log at a restart; those are at most kills x (workers + 1): the resend thread sends too."""
    updates, kills = (200, 5) if not db.startswith("postgres:") else (120, 3)
    rng = random.Random()
    log = tmp_path / "bot.log"
    with FakeBotAPI(max_long_poll=0.5, latency={"sendMessage": 0.02}) as api, ReadinessSocket() as ready:
        ids = api.push_messages(updates, chats=list(range(1, 41)))
        child = _spawn(api, db, None, ready, queued=True, log=log)
        done_kills = 0
        try:
            while done_kills < kills:
                target = min(len(api.calls_to("sendMessage")) + rng.randint(3, 40), updates - 20)
                assert api.wait_for(lambda t=target: len(api.calls_to("sendMessage")) >= t, timeout=60)
                time.sleep(rng.uniform(0.0, 0.02))
                child.send_signal(signal.SIGKILL)
                child.wait(10)
                done_kills += 1
                child = _spawn(api, db, None, ready, queued=True, log=log)
            assert eventually(lambda: _settled(db) >= updates, timeout=120, interval=0.2)
            assert eventually(lambda: _queued_rows(db) == 0, timeout=60, interval=0.2), "a queued reply never sent"
        finally:
            signal_when_ready(child, ready)
            assert child.wait(20) == 0
        received = Counter(str(call.params.get("text")) for call in api.calls_to("sendMessage"))
    with _open(db) as store, store.write() as conn:
        rows = list(list_calls(conn, limit=10 * updates))
    expected = {f"{u}:{n}" for u in ids for n in (1, 2)}
    duplicates = {text: n for text, n in received.items() if n > 1}
    missing = expected - set(received)
    unknown = [r for r in rows if r.state in ("uncertain", "intent")]
    print(f"\nqueued-reply drill: updates={updates} kills={done_kills} sends={sum(received.values())} "
          f"duplicates={len(duplicates)} missing={len(missing)} unknown={len(unknown)}")
    assert duplicates == {}, "a reply reached the fake twice"
    assert missing <= {f"{r.update_id}:{r.seq + 1}" for r in unknown}
    assert len(unknown) <= done_kills * (WORKERS + 1), "at most one call in flight per worker and the resend thread"
    unnamed = [(r.update_id, r.seq) for r in unknown if not _named_in(log, r.update_id, r.seq)]
    assert unnamed == [], "calls of unknown outcome the bot never logged"


def _state_of(db: str, update_id: int) -> str | None:
    with _open(db) as store, store.write() as conn:
        rows = list(list_calls(conn, update_id=update_id))
    return rows[0].state if rows else None


def test_a_queued_reply_killed_while_it_waits_out_a_429_is_sent_after_the_restart(db: str, tmp_path: Path) -> None:
    """A reply queued in the settle meets a 429 (retry_after 3 s) after its commit, and the bot is SIGKILLed while
    the reply waits out the pause: it had not started to leave, so it stays queued, and the restarted bot sends it
    once the pause is over, exactly once."""
    log = tmp_path / "bot.log"
    with FakeBotAPI(max_long_poll=0.5) as api, ReadinessSocket() as ready:
        api.fail("sendMessage", 429, retry_after=3)
        update_id = api.push_message(5, "hi")
        child = _spawn(api, db, None, ready, queued="only", log=log)
        try:
            assert api.wait_for(lambda: len(api.calls_to("sendMessage")) == 1, timeout=60), "the 429 came"
            eventually(lambda: _state_of(db, update_id) == "queued", timeout=2)  # waiting out the pause
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            assert api.sent == []
            child = _spawn(api, db, None, ready, queued="only", log=log)
            assert api.wait_sent(1, timeout=30), "the queued reply was never sent after the restart"
        finally:
            signal_when_ready(child, ready)
            assert child.wait(20) == 0
        assert [s.text for s in api.sent] == [f"{update_id}:2"]
        assert len(api.calls_to("sendMessage")) == 2
    assert _state_of(db, update_id) == "sent"
