"""``telegram-fence broadcast run --db DB --telegram-rates`` end to end: the run spends the bot's ``Rates()`` token
buckets kept in its database, so its sends leave within Telegram's shape (30 at once, then 30 per second for the
whole bot) whatever ``--rate`` says, and the buckets it spent are in the file for the bot's other processes.

A real ``telegram-fence`` process against the fake Bot API over HTTP, on a real SQLite file; the times are the
fake's own timestamps of each ``sendMessage`` it received.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from telegram_fence import Broadcast, SqliteUpdateStore
from telegram_fence.calls.limits import Rates
from telegram_fence.testing import FakeBotAPI

#: Recipients: so many more than the bot bucket's burst that the rest must wait for its refill even where the run
#: itself sends slowly (a loaded two-core host sent 75 at 44 per second: the bucket, 30 at once and 30 per second
#: after, never held them back, and the control failed). 200 need at least 5.7 s under the bucket.
AUDIENCE = list(range(1001, 1201))


def _run(api: FakeBotAPI, tmp_path: Path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    Broadcast(None, tmp_path / "broadcasts", name).create(AUDIENCE, f"news {name}")
    env = {**os.environ, "TELEGRAM_BOT_TOKEN": api.token,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "telegram_fence", "broadcast", "run", name, "--dir",
                           str(tmp_path / "broadcasts"), "--rate", "1000", "--api-url", api.base_url, *extra],
                          capture_output=True, text=True, env=env, timeout=60)


def _send_times(api: FakeBotAPI, name: str) -> list[float]:
    return sorted(c.time for c in api.calls_to("sendMessage") if c.params.get("text") == f"news {name}")


def test_telegram_rates_holds_a_broadcast_run_to_the_bot_bucket_kept_in_the_database(tmp_path: Path) -> None:
    """At ``--rate 1000`` a run of 200 recipients with ``--telegram-rates`` sends the first 30 at once and the rest
    no faster than 30 per second (in any window of t seconds at most 30 + 30·t sends, measured from the fake's
    timestamps), and leaves the bot's bucket in ``fence_buckets``; the same run without the flag (its control) is
    held only by ``--rate``, and leaves no bucket."""
    rates = Rates()
    db = tmp_path / "bot.db"
    SqliteUpdateStore(db).close()
    with FakeBotAPI() as api:
        done = _run(api, tmp_path, "plain", "--db", str(db))
        assert done.returncode == 0, done.stderr
        plain = _send_times(api, "plain")
        conn = apsw.Connection(str(db))
        assert conn.execute("SELECT count(*) FROM fence_buckets").fetchone() == (0,)  # no Rates: no bucket spent
        conn.close()
        done = _run(api, tmp_path, "shaped", "--db", str(db), "--telegram-rates")
        assert done.returncode == 0, done.stderr
        shaped = _send_times(api, "shaped")
    assert len(plain) == len(shaped) == len(AUDIENCE)
    burst, rate = rates.bot_burst, rates.per_bot
    if plain[-1] - plain[0] >= (len(AUDIENCE) - burst) / rate:
        pytest.skip("this host sent the unshaped control no faster than the bucket allows: nothing to tell apart")
    slack = 0.05  # the fake stamps a call when it reads it, a little after it left
    for i, at in enumerate(shaped):
        assert at - shaped[0] >= (i + 1 - burst) / rate - slack, (i, round(at - shaped[0], 3))
    assert shaped[-1] - shaped[0] >= (len(AUDIENCE) - burst) / rate - slack
    # The control: --rate 1000 alone sent them faster than the bucket lets them leave.
    assert plain[-1] - plain[0] < shaped[-1] - shaped[0], (round(plain[-1] - plain[0], 3),
                                                            round(shaped[-1] - shaped[0], 3))
    conn = apsw.Connection(str(db))
    try:
        scopes = {row[0] for row in conn.execute("SELECT scope FROM fence_buckets")}
    finally:
        conn.close()
    assert "bot" in scopes, scopes


def test_telegram_rates_without_db_is_one_line(tmp_path: Path) -> None:
    """``--telegram-rates`` without ``--db`` is refused in one line naming what it needs, exit 2, nothing sent."""
    with FakeBotAPI() as api:
        done = _run(api, tmp_path, "alone", "--telegram-rates")
        assert done.returncode == 2 and "--telegram-rates needs --db" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert api.calls_to("sendMessage") == []


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child talks to the fake on 127.0.0.1: no proxy from the environment may stand between."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
