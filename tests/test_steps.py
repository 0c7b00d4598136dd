"""Durable steps: a handler's call to another service runs once per update; a retry gets the recorded result.

Real HTTP against the fake Bot API, real worker threads, on both backends: SQLite files in tmp dirs and the
PostgreSQL server of TELEGRAM_FENCE_PG_DSN (skipped without it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import eventually, make_fence, stop
from pg_support import BACKENDS, DSN, no_wait, store_of
from webhook_support import SECRET, post, update

from telegram_fence import (
    ConfigurationError,
    Exhaustion,
    OwnershipLost,
    StepUncertain,
    step,
    step_key,
)
from telegram_fence.cli.main import main
from telegram_fence.errors import StepNotStorable
from telegram_fence.ingress.webhook import WsgiServer
from telegram_fence.runtime.attempt import AttemptContext, current_attempt
from telegram_fence.steps.core import list_steps
from telegram_fence.testing import FakeBotAPI


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh store of each backend (the PostgreSQL tables are dropped afterwards)."""
    with store_of(request.param, tmp_path, "tf_steps") as opened:
        yield opened


def _rows(store: Any) -> list[Any]:
    with store.read() as conn:
        return list(list_steps(conn))


def test_a_retry_returns_the_recorded_result_without_calling_the_function_again(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any
) -> None:
    """A plain handler's step runs once; the attempt fails after it, and the retry gets the same value back."""
    calls: list[str] = []
    seen: list[Any] = []

    def ask_model(prompt: str, *, temperature: float) -> dict[str, Any]:
        calls.append(prompt)
        return {"text": f"answer {len(calls)} to {prompt}", "temperature": temperature, "tokens": (3, 4)}

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        answer = step("llm", ask_model, message.text, temperature=0.5)
        seen.append(answer)
        if len(seen) == 1:
            raise RuntimeError("fails after the step")
        bot.reply_to(message, answer["text"])

    fence = make_fence(bot, store, retry=no_wait)
    fence.start()
    api.push_message(5, "hi")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
        counted = fence.stats()["steps"]
    finally:
        stop(fence)
    assert calls == ["hi"]
    assert seen[0] == seen[1] == {"text": "answer 1 to hi", "temperature": 0.5, "tokens": [3, 4]}
    assert [m.text for m in api.sent] == ["answer 1 to hi"]
    [row] = _rows(store)
    assert (row.name, row.state, row.attempt, row.runs) == ("llm", "done", 1, 1)
    assert counted["stored"] == {"done": 1} and counted["replayed"] >= 1


def _run(bot: telebot.TeleBot, api: FakeBotAPI, store: Any, messages: int = 1, **options: Any) -> list[Exhaustion]:
    """Run a fence until ``messages`` pushed updates are settled or exhausted; return the exhaustions."""
    exhausted: list[Exhaustion] = []
    options.setdefault("retry", no_wait)
    fence = make_fence(bot, store, on_exhausted=exhausted.append, **options)
    fence.start()
    for i in range(messages):
        api.push_message(5 + i, f"m{i}")
    try:
        assert eventually(lambda: fence.stats()["settled"] + len(exhausted) == messages)
    finally:
        stop(fence)
    return exhausted


def test_a_second_step_of_the_same_name_in_one_attempt_is_refused(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any
) -> None:
    """The same name twice in one attempt raises an error that says names are unique per update."""
    errors: list[str] = []

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        step("fetch", lambda: 1)
        try:
            step("fetch", lambda: 2)
        except ConfigurationError as exc:
            errors.append(str(exc))
        step("fetch-2", lambda: 3)

    assert _run(bot, api, store) == []
    assert len(errors) == 1 and "'fetch' already ran in this attempt" in errors[0]
    assert [(r.name, r.result) for r in _rows(store)] == [("fetch", "1"), ("fetch-2", "3")]


def test_a_result_that_is_not_json_is_refused_naming_its_type(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any
) -> None:
    """A step returning an object JSON cannot hold raises StepNotStorable naming the type; the update is exhausted."""
    raised: list[BaseException] = []

    class Reply:
        pass

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        try:
            step("object", Reply)
        except StepNotStorable as exc:
            raised.append(exc)
            raise

    [exhaustion] = _run(bot, api, store, retry=None)
    assert len(raised) == 1 and "Reply" in str(raised[0]) and isinstance(raised[0], TypeError)
    assert "StepNotStorable" in (exhaustion.error or "")


class Declined(Exception):
    """A payment provider's final answer."""

    def __init__(self, code: str, amount: int) -> None:
        super().__init__(code, amount)
        self.code = code


def test_an_exception_is_no_result_but_a_final_one_is_recorded_and_raised_again(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any
) -> None:
    """A raising step is called again on the retry; one that raises a final exception is not, which is re-raised."""
    flaky: list[int] = []
    charges: list[int] = []
    declined: list[tuple[str, int]] = []

    def fetch() -> str:
        flaky.append(1)
        if len(flaky) == 1:
            raise ConnectionError("the service is down")
        return "fetched"

    def charge(amount: int) -> str:
        charges.append(amount)
        raise Declined("card_declined", amount)

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        assert step("fetch", fetch) == "fetched"
        try:
            step("charge", charge, 500, final=(Declined,))
        except Declined as exc:
            declined.append((exc.code, exc.args[1]))
        if len(declined) < 2:
            raise RuntimeError("try the update again")

    assert _run(bot, api, store) == []
    assert len(flaky) == 2 and charges == [500]
    assert declined == [("card_declined", 500), ("card_declined", 500)]
    states = {r.name: r.state for r in _rows(store)}
    assert states == {"fetch": "done", "charge": "failed"}


def test_a_stale_attempt_cannot_record_and_the_retry_finds_the_step_uncertain(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any
) -> None:
    """An attempt whose update was taken away while its step ran gets OwnershipLost when it returns; the next
    attempt raises StepUncertain, and the update is exhausted at once."""
    release = threading.Event()
    outcomes: list[str] = []
    calls: list[int] = []

    def slow_service() -> str:
        calls.append(1)
        release.wait(20)
        return "done late"

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        try:
            step("slow", slow_service)
            outcomes.append("recorded")
        except OwnershipLost:
            outcomes.append("refused")
            raise
        except StepUncertain:
            outcomes.append("uncertain")
            release.set()
            raise

    exhausted = _run(bot, api, store, retry=None, handler_timeout=0.5, lease=1.0, workers=2, max_attempts=5)
    assert eventually(lambda: len(outcomes) == 2)
    assert outcomes == ["uncertain", "refused"] and calls == [1]
    assert len(exhausted) == 1 and exhausted[0].identity.attempt == 2
    assert "StepUncertain" in (exhausted[0].error or "")
    [row] = _rows(store)
    assert (row.state, row.result, row.attempt) == ("uncertain", None, 1)


def test_a_step_declared_safe_to_repeat_runs_again_after_an_uncertain_end(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any
) -> None:
    """With retry_uncertain=True the attempt after a lost one calls the function again, with the same key."""
    release = threading.Event()
    keys: list[str] = []
    results: list[str] = []

    def service(key: str) -> str:
        keys.append(key)
        if len(keys) == 1:
            release.wait(20)
        return f"charged {key}"

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        try:
            results.append(step("pay", service, step_key("pay"), retry_uncertain=True))
        finally:
            if len(keys) == 2:
                release.set()

    assert _run(bot, api, store, handler_timeout=0.5, lease=1.0, workers=2) == []
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0].startswith("tf-")
    assert results[0] == f"charged {keys[0]}"
    [row] = _rows(store)
    assert (row.state, row.runs, row.attempt) == ("done", 2, 2)


def test_step_key_is_stable_per_update_and_name_and_differs_otherwise(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any
) -> None:
    """step_key gives the same key on every attempt of an update, and another for another update or name."""
    keys: dict[tuple[str | None, int], list[str]] = {}

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        keys.setdefault((message.text, 0), []).append(step_key("a"))
        keys.setdefault((message.text, 1), []).append(step_key("b"))
        if len(keys[(message.text, 0)]) == 1:
            raise RuntimeError("again")

    assert _run(bot, api, store, messages=2) == []
    assert all(len(found) == 2 and found[0] == found[1] for found in keys.values())
    assert len({found[0] for found in keys.values()}) == 4


def test_an_attempt_handler_gets_the_same_key_and_result_through_its_context(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any
) -> None:
    """ctx.step and ctx.step_key are the module functions for the context's attempt: the same key, the same
    recorded result on the retry."""
    seen: list[tuple[str, str, Any]] = []

    def handler(update: Any, ctx: AttemptContext) -> None:
        seen.append((ctx.step_key("a"), step_key("a"), ctx.step("a", lambda: f"attempt {ctx.attempt}")))
        if len(seen) == 1:
            raise RuntimeError("again")

    fence = make_fence(bot, store, retry=no_wait)
    fence.attempt_handler(handler)
    fence.start()
    api.push_message(5, "hi")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert len(seen) == 2 and seen[0] == seen[1] and seen[0][0] == seen[0][1] and seen[0][2] == "attempt 1"


def test_steps_inside_a_completing_transaction_commit_with_it(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any
) -> None:
    """A step inside ctx.transaction(complete=True) is recorded with the block: a block that raises leaves no
    record (the retry calls it again), one that commits settles the update and records the step together."""
    calls: list[int] = []

    def book() -> int:
        calls.append(1)
        return 42

    bookings = f"{store.table}_domain" if hasattr(store, "table") else "bookings"

    def handler(update: Any, ctx: AttemptContext) -> None:
        with ctx.transaction(complete=True) as conn:
            booking = ctx.step("book", book)
            conn.execute(f"CREATE TABLE IF NOT EXISTS {bookings}(id INTEGER)")
            conn.execute(f"INSERT INTO {bookings} VALUES ({int(booking)})")
            if len(calls) == 1:
                raise RuntimeError("the block fails after the step")

    exhausted: list[Exhaustion] = []
    fence = make_fence(bot, store, retry=no_wait, on_exhausted=exhausted.append)
    fence.attempt_handler(handler)
    fence.start()
    api.push_message(5, "book")
    try:
        assert eventually(lambda: fence.stats()["settled"] == 1)
    finally:
        stop(fence)
    assert calls == [1, 1] and exhausted == []
    [row] = _rows(store)
    assert (row.state, row.attempt, row.result) == ("done", 2, "42")
    with store.read() as conn:
        assert [tuple(r) for r in conn.execute(f"SELECT id FROM {bookings}")] == [(42,)]


def test_a_step_outside_a_handler_is_refused() -> None:
    """step() and step_key() outside a handler a fence runs raise an error saying where they work."""
    with pytest.raises(ConfigurationError, match="inside a handler"):
        step("x", lambda: 1)
    with pytest.raises(ConfigurationError, match="inside a handler"):
        step_key("x")


def test_a_step_is_pruned_with_its_update(api: FakeBotAPI, bot: telebot.TeleBot, store: Any) -> None:
    """Pruning a settled update deletes its steps too."""

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        step("one", lambda: "x")

    assert _run(bot, api, store) == []
    assert len(_rows(store)) == 1
    assert store.prune(10.0**10) == 1
    assert _rows(store) == []


def test_the_steps_command_lists_them_and_their_uncertain_ones(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``telegram-fence steps`` lists every recorded step; ``--uncertain`` only the uncertain ones, ``--update`` one
    update's, ``--json`` as objects."""
    release = threading.Event()

    def slow() -> str:
        release.wait(20)
        return "late"

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        step("quick", lambda: {"ok": message.text})
        if message.text == "m1":
            try:
                step("slow", slow)
            except StepUncertain:
                release.set()
                raise

    exhausted = _run(bot, api, store, messages=2, retry=None, handler_timeout=0.5, lease=1.0, workers=2)
    assert len(exhausted) == 1
    uncertain_update = exhausted[0].identity.update_id
    where = [str(DSN), "--table", store.table] if hasattr(store, "table") else [store.path]
    assert main(["steps", *where, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted((r["name"], r["state"]) for r in listed) == [("quick", "done"), ("quick", "done"),
                                                               ("slow", "uncertain")]
    assert main(["steps", *where, "--uncertain", "--json"]) == 0
    [only] = json.loads(capsys.readouterr().out)
    assert (only["update_id"], only["name"], only["result"]) == (uncertain_update, "slow", None)
    assert main(["steps", *where, "--update", str(uncertain_update)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "slow" in lines[1] and "uncertain" in lines[1] and '{"ok":"m1"}' in lines[0]
    assert lines[-1] == "1 done, 1 uncertain"


@pytest.mark.skipif(DSN is None, reason="no PostgreSQL")
def test_a_postgres_store_from_before_durable_steps_gains_their_table(tmp_path: Path) -> None:
    """Opening a PostgreSQL store whose steps table is missing (made by an older telegram_fence) creates it."""
    import psycopg

    with store_of("postgres", tmp_path, "tf_steps_old") as store:
        table = store.table
        with psycopg.connect(str(DSN), autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}_step_results")
        from telegram_fence.store.postgres import PostgresUpdateStore

        with PostgresUpdateStore(str(DSN), table=table) as reopened, reopened.read() as conn:
            assert list(list_steps(conn)) == []


def test_a_step_that_raises_after_its_attempt_lost_the_update_stays_uncertain(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any
) -> None:
    """A step whose function raises once its attempt has lost the update keeps its intent: the attempt that took
    the update over gets StepUncertain instead of calling the function a second time."""
    taken_over = threading.Event()
    failed = threading.Event()
    calls: list[int] = []
    outcomes: list[str] = []

    def service() -> str:
        calls.append(1)
        if len(calls) == 1:
            taken_over.wait(20)  # until the next attempt has begun: this one lost its update
            raise ConnectionError("the service failed after doing who knows what")
        return "called again"

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        ctx = current_attempt()
        assert ctx is not None
        if ctx.attempt > 1:
            taken_over.set()
            failed.wait(20)
        try:
            step("svc", service)
            outcomes.append("done")
        except ConnectionError:
            outcomes.append("raised")
            failed.set()
            raise
        except StepUncertain:
            outcomes.append("uncertain")
            raise

    exhausted = _run(bot, api, store, retry=None, handler_timeout=0.5, lease=1.0, workers=2)
    assert calls == [1] and outcomes == ["raised", "uncertain"]
    assert len(exhausted) == 1 and "StepUncertain" in (exhausted[0].error or "")


def test_behind_the_webhook_a_retry_returns_the_recorded_result(
    api: FakeBotAPI, bot: telebot.TeleBot, store: Any
) -> None:
    """Webhook door: a step's function runs once per update, the retry after a failure gets its recorded result."""
    calls: list[str] = []
    failed: set[str] = set()

    def service(text: str) -> str:
        calls.append(text)
        return f"answer to {text}"

    @bot.message_handler(func=lambda m: True)
    def handler(message: telebot.types.Message) -> None:
        answer = step("svc", service, str(message.text))
        if message.text not in failed:
            failed.add(str(message.text))
            raise RuntimeError("fails after the step once")
        bot.reply_to(message, answer)

    fence = make_fence(bot, store, retry=no_wait)
    server = WsgiServer(fence.webhook_app(SECRET), "127.0.0.1", 0)
    server.start()
    fence.start()
    try:
        for i in range(3):
            status, _, _ = post(server.port, json.dumps(update(700 + i, chat=20 + i, text=f"w{i}")))
            assert status == 200
        assert eventually(lambda: fence.stats()["settled"] == 3)
    finally:
        server.stop()
        assert server.join(10)
        stop(fence)
    assert sorted(calls) == ["w0", "w1", "w2"]
    assert sorted(m.text or "" for m in api.sent) == [f"answer to w{i}" for i in range(3)]
    assert sorted(r.state for r in _rows(store)) == ["done"] * 3
