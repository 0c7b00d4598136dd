"""`updates`, `show`, `retry` and `prune` on real fence databases (SQLite files and PostgreSQL tables alike), with
and without a running fence."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually
from pg_support import DSN, requires_pg, store_of
from store_helpers import claim_one, settle_one

from telegram_fence import Exhaustion, Fence
from telegram_fence.cli.main import main
from telegram_fence.store.sqlite import SqliteUpdateStore
from telegram_fence.testing import FakeBotAPI

DAY = 86400.0


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def message(update_id: int, chat_id: int, text: str = "hi") -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 0, "text": text,
                                                "chat": {"id": chat_id, "type": "private"}}}


def show(capsys: pytest.CaptureFixture[str], db: Path | list[str], update_id: int) -> dict[str, Any]:
    where = [str(db)] if isinstance(db, Path) else db
    code, out, err = run(capsys, "show", where[0], str(update_id), *where[1:], "--json")
    assert code == 0, err
    return dict(json.loads(out))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=requires_pg)])
def mixed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """The command-line words naming a store of each backend (a SQLite file; a connection string and ``--table``)
    holding updates in every state, all last changed eight days ago: 1-2 settled, 3 skipped, 4 exhausted (unacked),
    5 exhausted (acknowledged), 6 claimed, 7 pending; captures of update 1 delivered, of update 2 pending."""
    with store_of(request.param, tmp_path, "tf_cli_admin", clock=lambda: time.time() - 8 * DAY) as store:
        store.record([message(i, 10 + i % 2) for i in range(1, 8)], 8, skip={3})
        for expected in (1, 2):
            claim = claim_one(store, 60)
            assert claim is not None and claim.update_id == expected
            settle_one(store, claim.identity)
        for expected, acknowledge in ((4, False), (5, True)):
            claim = claim_one(store, 60)
            assert claim is not None and claim.update_id == expected
            store.exhaust(claim.identity, f"ValueError: broke on {expected}")
            if acknowledge:
                assert store.acknowledge_exhaustion(claim.identity)
        assert claim_one(store, 9 * DAY) is not None  # update 6, leased a day past the wall clock's now
        postgres = request.param == "postgres"
        outbox, mark = (f"{store.table}_outbox", "%s") if postgres else ("fence_outbox", "?")
        with store.write() as conn:
            for key, update_id, state in (("k1", 1, "delivered"), ("k2", 2, "pending")):
                conn.execute(
                    f"INSERT INTO {outbox}(key, update_id, chat_id, payload, state, created_at, changed_at) "
                    f"VALUES ({mark}, {mark}, 11, '{{}}', {mark}, {mark}, {mark})",
                    (key, update_id, state, time.time() - 8 * DAY, time.time() - 8 * DAY))
        if postgres:
            assert DSN is not None
            yield [DSN, "--table", store.table]
        else:
            yield [str(tmp_path / "bot.db")]


def _outbox_keys(where: list[str]) -> list[str]:
    """The keys of the captures the store of ``where`` holds, read with the backend's own driver."""
    if len(where) == 1:
        import apsw

        conn = apsw.Connection(where[0], flags=apsw.SQLITE_OPEN_READONLY)
        try:
            return [row[0] for row in conn.execute("SELECT key FROM fence_outbox ORDER BY key")]
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(where[0]) as conn:
        return [row[0] for row in conn.execute(f"SELECT key FROM {where[2]}_outbox ORDER BY key").fetchall()]


def test_updates_lists_newest_first_with_filters(mixed: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`updates` lists rows newest first; --state, --chat and --limit narrow it; --json is machine-readable."""
    code, out, _ = run(capsys, "updates", *mixed, "--json")
    rows = json.loads(out)
    assert code == 0
    assert [r["update_id"] for r in rows] == [7, 6, 5, 4, 3, 2, 1]
    assert [r["state"] for r in rows] == ["pending", "claimed", "exhausted", "exhausted", "skipped", "settled",
                                          "settled"]
    assert rows[2]["acknowledged"] is True and rows[3]["acknowledged"] is False
    assert rows[3]["error"] == "ValueError: broke on 4"
    code, out, _ = run(capsys, "updates", *mixed, "--state", "exhausted", "--json")
    assert [r["update_id"] for r in json.loads(out)] == [5, 4]
    code, out, _ = run(capsys, "updates", *mixed, "--state", "open", "--json")
    assert [r["update_id"] for r in json.loads(out)] == [7, 6]
    code, out, _ = run(capsys, "updates", *mixed, "--chat", "11", "--limit", "2", "--json")
    assert [r["update_id"] for r in json.loads(out)] == [7, 5]
    code, out, _ = run(capsys, "updates", *mixed, "--state", "exhausted")
    assert code == 0 and "exhausted (acked)" in out and "broke on 4" in out and "2 update(s) shown" in out


def test_show_prints_the_raw_update_attempts_error_and_captures(
    mixed: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`show` gives the raw update, attempts, last error, state and times; a missing id exits 1."""
    item = show(capsys, mixed, 4)
    assert item["update"] == message(4, 10)
    assert (item["state"], item["attempts"], item["acknowledged"]) == ("exhausted", 1, False)
    assert item["error"] == "ValueError: broke on 4" and item["recorded_at"] <= item["changed_at"]
    assert [c["key"] for c in show(capsys, mixed, 1)["captures"]] == ["k1"]
    code, out, _ = run(capsys, "show", *mixed, "4")
    assert code == 0 and "ValueError: broke on 4" in out and '"text": "hi"' in out and "not acknowledged" in out
    code, _, err = run(capsys, "show", *mixed, "99")
    assert code == 1 and "update 99 is not stored" in err


def test_prune_deletes_only_old_settled_rows_and_delivered_captures(
    mixed: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`prune --older-than 7d` deletes settled/skipped updates and delivered captures, never open or exhausted rows."""
    code, out, _ = run(capsys, "prune", *mixed, "--older-than", "9d", "--json")
    assert code == 0 and json.loads(out) == {"updates": 0, "captures": 0}
    code, out, _ = run(capsys, "prune", *mixed, "--older-than", "7d", "--json")
    assert code == 0 and json.loads(out) == {"updates": 3, "captures": 1}
    code, out, _ = run(capsys, "updates", *mixed, "--json")
    assert [r["update_id"] for r in json.loads(out)] == [7, 6, 5, 4]
    assert [c["key"] for c in show(capsys, mixed, 4)["captures"]] == []
    assert _outbox_keys(mixed) == ["k2"]  # the pending capture stays, though its update was pruned


def test_retry_refuses_what_is_not_exhausted(mixed: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`retry` changes only exhausted rows; a settled, pending or unknown id is named and exits 1."""
    code, out, err = run(capsys, "retry", *mixed, "1", "7", "99", "5")
    assert code == 1
    assert "update 5: back to pending" in out
    assert "update 1: not retried: it is settled" in err and "update 7: not retried: it is pending" in err
    assert "update 99: not retried: it is not stored" in err
    retried = show(capsys, mixed, 5)
    assert (retried["state"], retried["attempts"], retried["claim_id"]) == ("pending", 0, None)
    assert show(capsys, mixed, 1)["state"] == "settled"


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=requires_pg)])
def test_a_retried_update_is_handled_by_the_running_fence_and_not_reported_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """An exhausted update put back with `retry` runs again in the live fence (SQLite file or PostgreSQL table);
    on_exhausted sees each failure once."""
    failing = threading.Event()
    failing.set()
    handled: list[int] = []
    told: list[Exhaustion] = []
    with FakeBotAPI(max_long_poll=0.2) as api, store_of(kind, tmp_path, "tf_cli_retry") as store:
        where = [str(tmp_path / "bot.db")] if kind == "sqlite" else [str(DSN), "--table", store.table]
        fence = Fence(telebot.TeleBot(api.token, threaded=False), store, long_poll_timeout=0.2, max_attempts=1,
                      lease=2.0, shutdown_timeout=2, on_exhausted=told.append)

        @fence.handler
        def handle(update: telebot.types.Update) -> None:
            if failing.is_set():
                raise ValueError(f"cannot handle {update.update_id}")
            handled.append(update.update_id)

        fence.start()
        try:
            update_id = api.push_message(3, "please")
            assert eventually(lambda: len(told) == 1, timeout=15)
            assert eventually(lambda: fence.stats()["acknowledged"] == 1, timeout=10)

            code, _, err = run(capsys, "retry", where[0], str(update_id), *where[1:])  # fails again: a new exhaustion
            assert code == 0, err
            assert eventually(lambda: len(told) == 2, timeout=15)
            assert told[0].identity != told[1].identity and told[1].identity.attempt == 1

            failing.clear()
            assert eventually(lambda: fence.stats()["acknowledged"] == 1, timeout=10)
            code, _out, err = run(capsys, "retry", where[0], str(update_id), *where[1:])
            assert code == 0, err
            assert eventually(lambda: handled == [update_id], timeout=15)
            assert eventually(lambda: show(capsys, where, update_id)["state"] == "settled", timeout=10)
        finally:
            fence.stop()
            assert fence.join(15)
    assert len(told) == 2


def test_retry_acknowledges_an_exhaustion_nobody_was_told_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without on_exhausted, a retried exhaustion leaves the unacknowledged list: the operator decided."""
    db = tmp_path / "bot.db"
    with SqliteUpdateStore(db) as store:
        store.record([message(1, 5)], 2)
        claim = claim_one(store, 30)
        assert claim is not None
        store.exhaust(claim.identity, "RuntimeError: boom")
    out = run(capsys, "exhaustions", str(db))[1]
    assert "1 unacknowledged" in out
    assert run(capsys, "retry", str(db), "1")[0] == 0
    _code, out, _ = run(capsys, "exhaustions", str(db))
    assert "0 unacknowledged" in out
    with SqliteUpdateStore(db) as store:
        again = claim_one(store, 30, max_attempts=1)
        assert again is not None and again.attempt == 1 and again.identity != claim.identity
        assert not store.owns(claim.identity)
