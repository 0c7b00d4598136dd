"""The command line, run as a real subprocess (``python -m telegram_fence``) on real database files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from store_helpers import claim_one

from telegram_fence import SqliteUpdateStore, __version__
from telegram_fence.store.schema import LATEST


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "telegram_fence", *args], capture_output=True, text=True,
                          timeout=120)


def message(update_id: int, chat_id: int) -> dict[str, object]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "text": "hi",
                                                "chat": {"id": chat_id, "type": "private"}}}


def test_version() -> None:
    """--version prints the package version."""
    result = cli("--version")
    assert result.returncode == 0 and __version__ in result.stdout


def test_status_reports_counts_and_health(tmp_path: Path) -> None:
    """status prints counts and the cursor; --max-progress-age fails when no poller generation made progress."""
    db = tmp_path / "bot.db"
    with SqliteUpdateStore(db) as store:
        store.record([message(1, 5), message(2, 5)], 3)
    result = cli("status", str(db), "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["pending"] == 2 and stats["cursor"] == 3
    unhealthy = cli("status", str(db), "--max-progress-age", "60")
    assert unhealthy.returncode == 1 and "no poller or webhook has ever run" in unhealthy.stdout
    with SqliteUpdateStore(db) as store:
        generation = store.begin_generation()
        store.mark_progress(generation)
    healthy = cli("status", str(db), "--max-progress-age", "60")
    assert healthy.returncode == 0, healthy.stdout
    with SqliteUpdateStore(db) as store:
        store.begin_generation()  # a new poller that has not made progress yet: old progress proves nothing
    assert cli("status", str(db), "--max-progress-age", "60").returncode == 1


def test_exhaustions_list_and_acknowledge(tmp_path: Path) -> None:
    """exhaustions lists unacknowledged terminal failures; --ack takes only the full identity and says what it
    acknowledged."""
    db = tmp_path / "bot.db"
    with SqliteUpdateStore(db) as store:
        store.record([message(10, 1)], 11)
        claim = claim_one(store, 30)
        assert claim is not None
        store.exhaust(claim.identity, "RuntimeError: boom")
    listed = cli("exhaustions", str(db))
    assert listed.returncode == 0 and str(claim.identity) in listed.stdout and "boom" in listed.stdout
    wrong = f"{claim.identity.update_id}/{claim.identity.attempt}/not-the-claim"
    assert cli("exhaustions", str(db), "--ack", wrong).returncode == 1
    acked = cli("exhaustions", str(db), "--ack", str(claim.identity))
    assert acked.returncode == 0 and acked.stdout == f"acknowledged exhaustion {claim.identity} (prunable now)\n"
    assert "0 unacknowledged" in cli("exhaustions", str(db)).stdout


def test_bad_input_is_named(tmp_path: Path) -> None:
    """A missing database and a malformed identity give exit 2 and a message naming the problem."""
    missing = cli("status", str(tmp_path / "nope.db"))
    assert missing.returncode == 2 and "no database file there" in missing.stderr
    assert not (tmp_path / "nope.db").exists()
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    bad = cli("exhaustions", str(db), "--ack", "12")
    assert bad.returncode == 2 and "UPDATE_ID/ATTEMPT/CLAIM_ID" in bad.stderr


def test_schema_reports_version(tmp_path: Path) -> None:
    """schema prints the file's version without migrating it (exit 1 and a pointer to migrate when older)."""
    db = tmp_path / "old.db"
    SqliteUpdateStore(db, schema_version=1).close()
    result = cli("schema", str(db))
    assert result.returncode == 1 and f"schema version 1 (this telegram_fence writes version {LATEST})" in result.stdout
    assert f"telegram-fence migrate {db}" in result.stderr
    assert cli("migrate", str(db)).returncode == 0
    result = cli("schema", str(db))
    assert result.returncode == 0 and f"schema version {LATEST} (this telegram_fence" in result.stdout


def test_demo_runs_and_reports_ok() -> None:
    """The README's first command: the demo survives its SIGKILLs and exits 0 with an OK report."""
    result = cli("demo", "--updates", "120", "--kills", "2", "--seed", "7")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: nothing lost, nothing written twice" in result.stdout
    assert "kills survived          2" in result.stdout
