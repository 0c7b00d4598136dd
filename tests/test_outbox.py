"""The capture outbox: keys, the record hook's atomicity, delivery to a real loopback collector, the CLI."""

from __future__ import annotations

import contextlib
import email.utils
import io
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from helpers import eventually, needs_recursion_bound_json
from outbox_child import Collector, Reply, update

from telegram_fence.cli.main import main as cli_main
from telegram_fence.delivery.outbox import (
    THREAD_NAME,
    CaptureRule,
    Outbox,
    build_capture,
    capture_key,
    check_collector_url,
    classify_status,
    parse_retry_after,
    retry_delay,
)
from telegram_fence.errors import CaptureConflict, ConfigurationError, InvalidUpdate, StoreError
from telegram_fence.store.sqlite import SqliteUpdateStore

SECRET = "my secret diary entry"


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[SqliteUpdateStore]:
    with SqliteUpdateStore(tmp_path / "bot.db", clock=clock) as opened:
        yield opened


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    yield server
    server.close()


@pytest.fixture
def make_outbox(store: SqliteUpdateStore, collector: Collector) -> Iterator[Callable[..., Outbox]]:
    made: list[Outbox] = []

    def make(**kwargs: Any) -> Outbox:
        kwargs.setdefault("rule", CaptureRule(chats={1}))
        outbox = Outbox(store, kwargs.pop("url", collector.url), **kwargs)
        made.append(outbox)
        return outbox

    yield make
    for outbox in made:
        outbox.stop()
    for outbox in made:
        assert outbox.join(10)


def row(store: SqliteUpdateStore, key: str) -> dict[str, Any]:
    with store.write() as conn:
        cursor = conn.execute("SELECT * FROM fence_outbox WHERE key = ?", (key,))
        names = [d[0] for d in cursor.getdescription()]
        rows = cursor.fetchall()  # exhausted inside the block: an open statement would keep a stale snapshot
        assert rows, f"no capture {key}"
        values = rows[0]
    return dict(zip(names, values, strict=True))


def keys(store: SqliteUpdateStore) -> list[str]:
    with store.write() as conn:
        return [r[0] for r in conn.execute("SELECT key FROM fence_outbox ORDER BY update_id")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- key and payload -------------------------------------------------------------------------------


def test_capture_key_and_payload_carry_the_original_text_and_raw_update() -> None:
    """The key is telegram:{update_id}:{chat_id}:{message_id} and the payload keeps text and raw update."""
    raw = update(7, -100123, "Grüße ✓ <b>", message_id=55)
    capture = build_capture(raw)
    assert capture.key == capture_key(raw) == "telegram:7:-100123:55"
    payload = json.loads(capture.payload)
    assert payload["text"] == "Grüße ✓ <b>"
    assert payload["update"] == raw
    assert (payload["update_id"], payload["chat_id"], payload["message_id"]) == (7, -100123, 55)
    assert build_capture(json.loads(json.dumps(raw))).payload == capture.payload


def test_caption_is_the_text_of_a_media_message() -> None:
    """A photo's caption travels as the capture's text."""
    raw = {"update_id": 3, "message": {"message_id": 1, "chat": {"id": 1}, "photo": [], "caption": "look"}}
    assert json.loads(build_capture(raw).payload)["text"] == "look"


@pytest.mark.parametrize(
    "raw",
    [
        {"update_id": 1, "callback_query": {"id": "x", "data": "y"}},
        {"update_id": 1, "message": {"message_id": 1, "text": "no chat"}},
        {"update_id": 1, "message": {"chat": {"id": 1}, "text": "no message id"}},
        {"message": {"message_id": 1, "chat": {"id": 1}, "text": "no update id"}},
    ],
)
def test_an_update_without_a_message_cannot_be_captured(raw: dict) -> None:
    """An update lacking a message, chat id, message id or update id is refused with InvalidUpdate."""
    with pytest.raises(InvalidUpdate, match="nothing can be captured"):
        capture_key(raw)


# --- idempotency -----------------------------------------------------------------------------------


def test_enqueueing_the_same_update_twice_is_a_no_op(store: SqliteUpdateStore, make_outbox: Callable) -> None:
    """The same key with the same payload leaves one capture, untouched."""
    outbox = make_outbox()
    raw = update(1, 1)
    key = outbox.enqueue(raw)
    first = row(store, key)
    assert outbox.enqueue(json.loads(json.dumps(raw))) == key
    assert keys(store) == [key]
    assert row(store, key) == first


def test_the_same_key_with_another_payload_raises_and_keeps_the_first(
    store: SqliteUpdateStore, make_outbox: Callable
) -> None:
    """Enqueueing a key again with a different payload raises CaptureConflict and keeps the first evidence."""
    outbox = make_outbox()
    key = outbox.enqueue(update(1, 1, "original"))
    with pytest.raises(CaptureConflict, match=key):
        outbox.enqueue(update(1, 1, "tampered"))
    assert json.loads(row(store, key)["payload"])["text"] == "original"


def test_replaying_recorded_updates_after_reopening_keeps_one_capture_each(tmp_path: Path, clock: FakeClock) -> None:
    """Recording the same batch again on a reopened file creates no second capture."""
    batch = [update(1, 1, "a"), update(2, 1, "b")]
    for expected_new in (2, 0, 0):
        with SqliteUpdateStore(tmp_path / "bot.db", clock=clock) as store:
            outbox = Outbox(store, "http://127.0.0.1:9/c", rule=CaptureRule(chats={1}))
            assert outbox.store.record(batch, 3, on_record=outbox.record_hook) == expected_new
            assert keys(store) == [capture_key(u) for u in batch]


# --- the rule --------------------------------------------------------------------------------------


def test_unauthorised_and_uncapturable_updates_advance_the_cursor_without_a_capture(
    store: SqliteUpdateStore, make_outbox: Callable
) -> None:
    """Only text messages of allowed chats are captured, while every update is recorded and the cursor moves."""
    outbox = make_outbox(rule=CaptureRule(chats={1}))
    sticker = {"update_id": 4, "message": {"message_id": 4, "chat": {"id": 1}, "sticker": {"file_id": "s"}}}
    edited = {"update_id": 5, "edited_message": {"message_id": 1, "chat": {"id": 1}, "text": "fixed"}}
    callback = {"update_id": 6, "callback_query": {"id": "q", "message": update(0, 1)["message"]}}
    batch = [update(1, 1, "yes"), update(2, 2, "other chat"), update(3, 1, "yes too"), sticker, edited, callback]
    assert outbox.store.record(batch, 7, on_record=outbox.record_hook) == 6
    assert store.next_offset() == 7
    assert store.stats()["pending"] == 6
    assert keys(store) == ["telegram:1:1:10", "telegram:3:1:30"]


def test_an_authorize_function_decides_which_updates_are_captured(
    store: SqliteUpdateStore, make_outbox: Callable
) -> None:
    """With authorize=fn, an update is captured exactly when fn(update) is true."""
    outbox = make_outbox(rule=CaptureRule(authorize=lambda u: u["message"]["text"].startswith("#note")))
    outbox.store.record([update(1, 5, "#note buy milk"), update(2, 6, "chatter")], 3, on_record=outbox.record_hook)
    assert keys(store) == ["telegram:1:5:10"]


def test_other_kinds_and_textless_messages_are_captured_when_asked(
    store: SqliteUpdateStore, make_outbox: Callable
) -> None:
    """kinds= adds edited messages and require_text=False captures messages without text."""
    rule = CaptureRule(chats={1}, kinds={"message", "edited_message"}, require_text=False)
    outbox = make_outbox(rule=rule)
    sticker = {"update_id": 4, "message": {"message_id": 4, "chat": {"id": 1}, "sticker": {}}}
    edited = {"update_id": 5, "edited_message": {"message_id": 1, "chat": {"id": 1}, "text": "fixed"}}
    outbox.store.record([sticker, edited], 6, on_record=outbox.record_hook)
    assert keys(store) == ["telegram:4:1:4", "telegram:5:1:1"]
    assert json.loads(row(store, "telegram:4:1:4")["payload"])["text"] is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "chats=.*or authorize="),
        ({"chats": "123"}, "collection of chat ids"),
        ({"chats": {1, "2"}}, "integer chat ids"),
        ({"authorize": 3}, "callable"),
        ({"chats": {1}, "kinds": "message"}, "not one string"),
        ({"chats": {1}, "kinds": {"callback_query"}}, "capturable kinds"),
        ({"chats": {1}, "kinds": set()}, "capturable kinds"),
    ],
)
def test_a_capture_rule_refuses_settings_that_cannot_work(kwargs: dict, match: str) -> None:
    """A rule without chats or authorize, or with bad chats or kinds, raises ConfigurationError."""
    with pytest.raises(ConfigurationError, match=match):
        CaptureRule(**kwargs)


def test_an_outbox_without_a_rule_refuses_to_be_a_record_hook(store: SqliteUpdateStore, collector: Collector) -> None:
    """on_record of a rule-less outbox raises and the batch is not recorded."""
    outbox = Outbox(store, collector.url)
    with pytest.raises(ConfigurationError, match="no rule"):
        outbox.store.record([update(1, 1)], 2, on_record=outbox.record_hook)
    assert store.next_offset() == 0


def test_a_bare_rule_hook_writes_captures_in_the_record(store: SqliteUpdateStore) -> None:
    """rule.record_hook captures inside store.record."""
    store.record([update(1, 1), update(2, 2)], 3, on_record=CaptureRule(chats={1}).record_hook)
    assert keys(store) == ["telegram:1:1:10"]


@needs_recursion_bound_json
def test_an_update_too_deep_to_capture_is_recorded_without_its_capture(
    store: SqliteUpdateStore, caplog: pytest.LogCaptureFixture
) -> None:
    """An update the store keeps (from the answer's bytes) but whose capture nests too deep to encode is recorded
    without a capture, logged; the batch, the cursor and the other captures are written.
    """
    import sys

    deep: Any = []
    for _ in range(900):
        deep = [deep]
    poison = update(2, 1, "deep")
    poison["message"]["entities"] = deep
    batch = [update(1, 1, "a"), poison, update(3, 1, "b")]
    body = json.dumps({"ok": True, "result": batch}).encode()
    hook = CaptureRule(chats={1}).record_hook
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(400)  # the capture is encoded deep inside the poller's stack: fewer levels are left
    try:
        assert store.record(batch, 4, body=body, on_record=hook) == 3
    finally:
        sys.setrecursionlimit(limit)
    assert store.next_offset() == 4 and store.stats()["pending"] == 3
    assert keys(store) == ["telegram:1:1:10", "telegram:3:1:30"]
    [line] = [r for r in caplog.records if r.getMessage().startswith("capture cannot be built (")]
    assert line.update_id == 2 and "nests too deep" in line.err  # type: ignore[attr-defined]
    assert line.getMessage().endswith("; the update is recorded without it") and "nests too deep" in line.getMessage()


def test_build_capture_refuses_an_update_too_deep_to_encode_with_invalid_update() -> None:
    """build_capture raises InvalidUpdate (not a raw RecursionError) for an update nesting deeper than the encoder
    goes."""
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    poison = update(2, 1, "deep")
    poison["message"]["entities"] = deep
    with pytest.raises(InvalidUpdate, match="nests too deep"):
        build_capture(poison)


# --- atomicity of the record transaction -----------------------------------------------------------


def test_a_raising_hook_leaves_updates_and_cursor_unchanged(store: SqliteUpdateStore, make_outbox: Callable) -> None:
    """When authorize raises inside the record transaction, no update, capture or cursor move is stored."""
    store.record([update(1, 1)], 2, on_record=make_outbox().record_hook)

    def authorize(u: dict) -> bool:
        if u["update_id"] == 4:
            raise RuntimeError("authorisation backend down")
        return True

    outbox = make_outbox(rule=CaptureRule(authorize=authorize))
    with pytest.raises(RuntimeError, match="backend down"):
        outbox.store.record([update(3, 1), update(4, 1)], 5, on_record=outbox.record_hook)
    assert store.next_offset() == 2
    assert store.stats()["pending"] == 1
    assert keys(store) == ["telegram:1:1:10"]


def test_a_constraint_violation_by_a_capture_rolls_back_the_whole_record(
    store: SqliteUpdateStore, make_outbox: Callable
) -> None:
    """A capture insert that SQLite refuses rolls back the batch's updates, earlier captures and the cursor; the
    refusal leaves the store as a StoreError whose cause is SQLite's error (no raw APSW error leaves a store method)."""
    with store.write() as conn:
        conn.execute(
            "CREATE TRIGGER refuse_666 BEFORE INSERT ON fence_outbox WHEN NEW.chat_id = 666 "
            "BEGIN SELECT RAISE(ABORT, 'chat 666 refused'); END"
        )
    outbox = make_outbox(rule=CaptureRule(chats={1, 666}))
    with pytest.raises(StoreError, match="chat 666 refused") as caught:
        outbox.store.record([update(1, 1), update(2, 666)], 3, on_record=outbox.record_hook)
    assert isinstance(caught.value.__cause__, apsw.ConstraintError)
    assert store.next_offset() == 0
    assert store.stats()["pending"] == 0
    assert keys(store) == []


def test_a_capture_conflict_while_recording_aborts_the_batch_and_keeps_the_first(
    store: SqliteUpdateStore, make_outbox: Callable
) -> None:
    """A key already captured with another payload makes record raise CaptureConflict and store nothing."""
    outbox = make_outbox()
    key = outbox.enqueue(update(2, 1, "captured first"))
    with pytest.raises(CaptureConflict):
        outbox.store.record([update(1, 1), update(2, 1, "different now")], 3, on_record=outbox.record_hook)
    assert store.next_offset() == 0
    assert store.stats()["pending"] == 0
    assert keys(store) == [key]
    assert json.loads(row(store, key)["payload"])["text"] == "captured first"


# --- delivery --------------------------------------------------------------------------------------


def test_an_accepted_answer_marks_the_capture_delivered(
    store: SqliteUpdateStore, collector: Collector, make_outbox: Callable
) -> None:
    """A 2xx answer marks the capture delivered; the POST carries the JSON payload and the Idempotency-Key."""
    outbox = make_outbox()
    key = outbox.enqueue(update(1, 1, "note"))
    collector.answer(Reply(201, body='{"id":"c-1"}'))
    assert outbox.deliver_once() is True
    assert len(collector.received) == 1
    got = collector.received[0]
    assert got.path == "/capture"
    assert got.headers["Idempotency-Key"] == key
    assert got.headers["Content-Type"].startswith("application/json")
    assert got.json() == json.loads(row(store, key)["payload"])
    stored = row(store, key)
    assert (stored["state"], stored["attempts"], stored["last_status"]) == ("delivered", 1, 201)
    assert stored["answer"] == '{"id":"c-1"}'
    assert outbox.deliver_once() is False


def test_a_collector_that_is_down_gets_the_capture_later_with_backoff(
    store: SqliteUpdateStore, clock: FakeClock, make_outbox: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    """Connection refused returns the capture to pending, due after 1 s then 2 s, and a later collector gets it;
    the warning of each failed delivery names its cause."""
    caplog.set_level(logging.WARNING, logger="telegram_fence.outbox")
    port = free_port()
    outbox = make_outbox(url=f"http://127.0.0.1:{port}/capture", backoff=(1.0, 60.0))
    key = outbox.enqueue(update(1, 1))
    start = clock.now
    assert outbox.deliver_once() is True
    stored = row(store, key)
    assert (stored["state"], stored["attempts"], stored["due_at"]) == ("pending", 1, start + 1.0)
    assert "refused" in stored["last_error"].lower()
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("capture not delivered")]
    assert len(warned) == 1 and stored["last_error"] in warned[0] and "will retry in 1 s" in warned[0], warned
    assert outbox.deliver_once() is False  # not due yet
    clock.advance(1.0)
    assert outbox.deliver_once() is True
    assert (row(store, key)["attempts"], row(store, key)["due_at"]) == (2, start + 1.0 + 2.0)
    clock.advance(2.0)
    late = Collector(port=port)
    try:
        assert outbox.deliver_once() is True
        assert row(store, key)["state"] == "delivered"
        assert late.received[0].headers["Idempotency-Key"] == key
    finally:
        late.close()


def test_a_slow_collector_times_out_and_the_capture_is_retried(
    store: SqliteUpdateStore, collector: Collector, make_outbox: Callable
) -> None:
    """A collector slower than timeout counts as a failed attempt: pending again, error kept."""
    outbox = make_outbox(timeout=0.3, lease=5.0)
    key = outbox.enqueue(update(1, 1))
    collector.answer(Reply(hold=10.0))
    assert outbox.deliver_once() is True
    stored = row(store, key)
    assert (stored["state"], stored["attempts"], stored["last_status"]) == ("pending", 1, None)
    assert "timed out" in stored["last_error"]


def test_server_errors_back_off_exponentially_up_to_the_cap(
    store: SqliteUpdateStore, clock: FakeClock, collector: Collector, make_outbox: Callable
) -> None:
    """Each 500 puts the capture back with a doubled delay capped by backoff; a 200 then delivers it."""
    outbox = make_outbox(backoff=(1.0, 3.0))
    key = outbox.enqueue(update(1, 1))
    collector.answer(Reply(500, body="boom"), Reply(500), Reply(500), Reply(200))
    delays = []
    for _ in range(3):
        assert outbox.deliver_once() is True
        stored = row(store, key)
        assert stored["state"] == "pending"
        assert stored["last_status"] == 500
        delays.append(stored["due_at"] - clock.now)
        clock.advance(delays[-1])
    assert delays == [1.0, 2.0, 3.0]
    assert outbox.deliver_once() is True
    assert row(store, key)["state"] == "delivered"
    assert [r.headers["X-Capture-Attempt"] for r in collector.received] == ["1", "2", "3", "4"]


def test_a_429_waits_as_long_as_retry_after_says(
    store: SqliteUpdateStore, clock: FakeClock, collector: Collector, make_outbox: Callable
) -> None:
    """429 with Retry-After: 120 makes the capture due 120 s later, not after the 1 s backoff."""
    outbox = make_outbox(backoff=(1.0, 60.0))
    key = outbox.enqueue(update(1, 1))
    collector.answer(Reply(429, headers={"Retry-After": "120"}))
    assert outbox.deliver_once() is True
    assert row(store, key)["due_at"] == clock.now + 120
    clock.advance(119)
    assert outbox.deliver_once() is False
    clock.advance(1)
    assert outbox.deliver_once() is True
    assert row(store, key)["state"] == "delivered"


def test_a_client_error_marks_the_capture_failed_with_the_answer_kept(
    store: SqliteUpdateStore, collector: Collector, make_outbox: Callable
) -> None:
    """A 400 fails the capture at once, keeps the answer, and requeue_failed gives it another chance."""
    outbox = make_outbox()
    key = outbox.enqueue(update(1, 1))
    collector.answer(Reply(400, body='{"error":"schema mismatch"}'))
    assert outbox.deliver_once() is True
    stored = row(store, key)
    assert (stored["state"], stored["last_status"]) == ("failed", 400)
    assert "schema mismatch" in stored["answer"]
    assert outbox.deliver_once() is False
    assert outbox.requeue_failed() == 1
    assert outbox.requeue_failed() == 0
    assert outbox.deliver_once() is True
    assert row(store, key)["state"] == "delivered"
    assert len(collector.received) == 2


def test_a_redirect_is_not_followed_and_fails_the_capture(
    store: SqliteUpdateStore, collector: Collector, make_outbox: Callable
) -> None:
    """A 3xx answer is not followed anywhere: one request, capture failed."""
    outbox = make_outbox()
    key = outbox.enqueue(update(1, 1))
    collector.answer(Reply(302, headers={"Location": "http://example.com/steal"}))
    assert outbox.deliver_once() is True
    assert row(store, key)["state"] == "failed"
    assert len(collector.received) == 1


def test_a_capture_fails_after_max_attempts_and_requeue_by_key_restores_a_full_budget(
    store: SqliteUpdateStore, clock: FakeClock, collector: Collector, make_outbox: Callable
) -> None:
    """After max_attempts retryable failures the capture is failed; requeue_failed([key]) resets its attempts."""
    outbox = make_outbox(max_attempts=2, backoff=(1.0, 1.0))
    key = outbox.enqueue(update(1, 1))
    other = outbox.enqueue(update(2, 1))
    collector.default = Reply(503)
    for _ in range(4):
        assert outbox.deliver_once() is True
        clock.advance(1.0)
    assert outbox.deliver_once() is False
    assert (row(store, key)["state"], row(store, key)["attempts"]) == ("failed", 2)
    assert "attempts spent" in row(store, key)["last_error"]
    assert outbox.requeue_failed([key, "telegram:no:such:key"]) == 1
    assert (row(store, key)["state"], row(store, key)["attempts"]) == ("pending", 0)
    assert row(store, other)["state"] == "failed"


def test_a_lapsed_delivering_capture_is_taken_again_and_a_stale_failure_is_ignored(
    store: SqliteUpdateStore, clock: FakeClock, collector: Collector, make_outbox: Callable
) -> None:
    """A capture left delivering past its lease is delivered again; the old claim's late failure changes nothing."""
    outbox = make_outbox(lease=30.0, timeout=1.0)
    key = outbox.enqueue(update(1, 1))
    abandoned = outbox._claim()  # a delivery whose process died before it could record an outcome
    assert row(store, key)["state"] == "delivering"
    clock.advance(29.0)
    assert outbox.deliver_once() is False
    clock.advance(1.0)
    assert outbox.deliver_once() is True
    assert (row(store, key)["state"], row(store, key)["attempts"]) == ("delivered", 2)
    assert outbox._settle(abandoned, None, "ConnectionResetError") == "stale"
    assert row(store, key)["state"] == "delivered"


def test_a_late_success_from_a_lapsed_claim_still_counts(
    store: SqliteUpdateStore, clock: FakeClock, make_outbox: Callable
) -> None:
    """An accepted answer to an expired claim marks the capture delivered; the newer claim's failure is then stale."""
    from telegram_fence.delivery.outbox.collector import Answer as _Answer

    outbox = make_outbox(lease=30.0, timeout=1.0)
    key = outbox.enqueue(update(1, 1))
    old = outbox._claim()
    clock.advance(31.0)
    new = outbox._claim()
    assert outbox._settle(old, _Answer(200, "OK", None, "ok"), None) == "delivered"
    assert outbox._settle(new, _Answer(500, "Internal", None, ""), None) == "stale"
    assert row(store, key)["state"] == "delivered"


def test_a_lapsed_capture_with_no_attempts_left_is_failed(
    store: SqliteUpdateStore, clock: FakeClock, collector: Collector, make_outbox: Callable
) -> None:
    """A capture whose last allowed attempt lost its lease becomes failed instead of being sent again."""
    outbox = make_outbox(max_attempts=1, lease=30.0, timeout=1.0)
    key = outbox.enqueue(update(1, 1))
    outbox._claim()
    clock.advance(31.0)
    assert outbox.deliver_once() is False
    stored = row(store, key)
    assert stored["state"] == "failed"
    assert "lease lapsed" in stored["last_error"]
    assert collector.received == []


# --- decisions, table-driven ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (200, "delivered"),
        (201, "delivered"),
        (204, "delivered"),
        (408, "retry"),
        (429, "retry"),
        (500, "retry"),
        (503, "retry"),
        (599, "retry"),
        (301, "failed"),
        (400, "failed"),
        (401, "failed"),
        (404, "failed"),
        (409, "failed"),
        (422, "failed"),
        (100, "failed"),
    ],
)
def test_classify_status(status: int, verdict: str) -> None:
    """2xx delivers, 408/429/5xx retry, anything else fails."""
    assert classify_status(status) == verdict


@pytest.mark.parametrize(
    ("attempt", "retry_after", "expected"),
    [(1, None, 1.0), (2, None, 2.0), (3, None, 4.0), (9, None, 256.0), (10, None, 300.0), (10_000, None, 300.0),
     (1, 120.0, 120.0), (5, 0.0, 1.0), (1, 10_000_000.0, 86400.0)],
)  # fmt: skip
def test_retry_delay(attempt: int, retry_after: float | None, expected: float) -> None:
    """Backoff doubles from the initial delay to the cap; Retry-After overrides it within [initial, 1 day]."""
    assert retry_delay(attempt, initial=1.0, maximum=300.0, retry_after=retry_after) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("30", 30.0),
        (" 7 ", 7.0),
        ("-5", None),
        ("soon", None),
        (email.utils.formatdate(1_000_060, usegmt=True), None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    """Retry-After is read as delta seconds; anything else is ignored."""
    assert parse_retry_after(value) == expected


# --- collector URL validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "allow_remote"),
    [
        ("http://127.0.0.1:8080/capture", False),
        ("http://127.5.6.7/capture", False),
        ("http://[::1]:8080/capture", False),
        ("http://localhost:8080/capture", False),
        ("http://LocalHost/capture", False),
        ("https://127.0.0.1/capture", False),
        ("http://127.0.0.1/capture", True),
        ("https://example.com/capture", True),
        ("https://10.0.0.1:8443/capture", True),
    ],
)
def test_collector_urls_accepted(url: str, allow_remote: bool, store: SqliteUpdateStore) -> None:
    """Loopback collectors are accepted; remote ones only over https with allow_remote=True (never connected)."""
    check_collector_url(url, allow_remote=allow_remote)
    Outbox(store, url, allow_remote=allow_remote)


@pytest.mark.parametrize(
    ("url", "allow_remote", "match"),
    [
        ("http://10.0.0.1/capture", False, "not loopback"),
        ("http://example.com/capture", False, "not loopback"),
        ("https://example.com/capture", False, "not loopback"),
        ("http://example.com/capture", True, "must use https"),
        ("http://0.0.0.0/capture", False, "not loopback"),
        ("http://[::ffff:10.0.0.1]/capture", False, "not loopback"),
        ("http://localhost.example.com/capture", False, "not loopback"),
        ("http://127.0.0.1.nip.io/capture", False, "not loopback"),
        ("ftp://127.0.0.1/capture", False, "scheme"),
        ("127.0.0.1:8080/capture", False, "scheme"),
        ("http://user:pw@127.0.0.1/capture", False, "credentials"),
        ("http://127.0.0.1:99999/capture", False, "port"),
        ("http:///capture", False, "no host"),
        ("", False, "http"),
    ],
)
def test_collector_urls_refused(url: str, allow_remote: bool, match: str, store: SqliteUpdateStore) -> None:
    """Non-loopback hosts, http to a remote host, other schemes, credentials and bad ports are refused."""
    with pytest.raises(ConfigurationError, match=match):
        Outbox(store, url, allow_remote=allow_remote)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"lease": 5.0, "timeout": 5.0}, "longer than timeout"),
        ({"timeout": -1}, "timeout"),
        ({"backoff": (2.0, 1.0)}, "maximum"),
        ({"backoff": 3}, "backoff"),
        ({"recheck": float("nan")}, "recheck"),
        ({"headers": {"X-A": "b\r\nInjected: 1"}}, "line breaks"),
        ({"allow_remote": "yes"}, "allow_remote"),
        ({"rule": {1, 2}}, "CaptureRule"),
    ],
)
def test_outbox_settings_that_cannot_work_are_refused(kwargs: dict, match: str, store: SqliteUpdateStore) -> None:
    """Bad attempts, lease, timeout, backoff, headers or rule raise ConfigurationError naming the setting."""
    with pytest.raises(ConfigurationError, match=match):
        Outbox(store, "http://127.0.0.1:1/c", **kwargs)


def test_an_outbox_refuses_something_that_is_not_a_store() -> None:
    """Passing a path instead of a store raises ConfigurationError."""
    with pytest.raises(ConfigurationError, match="SqliteUpdateStore"):
        Outbox("bot.db", "http://127.0.0.1:1/c")


# --- the delivery thread --------------------------------------------------------------------------


def test_the_thread_is_woken_by_a_new_capture_and_stops_promptly(
    store: SqliteUpdateStore, collector: Collector, make_outbox: Callable
) -> None:
    """With an hour-long recheck, only the wake-up from record() and enqueue() explains a prompt delivery."""
    outbox = make_outbox(recheck=3600.0, headers={"Authorization": "Bearer t0ken"})
    outbox.start()
    assert THREAD_NAME in [t.name for t in threading.enumerate()]
    with pytest.raises(RuntimeError, match="already running"):
        outbox.start()
    outbox.store.record([update(1, 1)], 2, on_record=outbox.record_hook)
    assert collector.wait_for(1, timeout=10)
    outbox.enqueue(update(2, 1))
    assert collector.wait_for(2, timeout=10)
    assert eventually(lambda: outbox.stats()["delivered"] == 2)
    assert collector.received[0].headers["Authorization"] == "Bearer t0ken"
    outbox.stop()
    assert outbox.join(5)
    assert not outbox.running


def test_new_captures_wake_the_delivery_thread_and_replays_do_not(
    store: SqliteUpdateStore, make_outbox: Callable
) -> None:
    """record() and enqueue() set the thread's wake-up event when they write a capture, and only then."""
    outbox = make_outbox()
    wake = outbox._wake
    wake.clear()
    outbox.store.record([update(1, 2)], 2, on_record=outbox.record_hook)  # chat 2 is not captured
    assert not wake.is_set()
    outbox.store.record([update(2, 1)], 3, on_record=outbox.record_hook)
    assert wake.is_set()
    wake.clear()
    outbox.store.record([update(2, 1)], 3, on_record=outbox.record_hook)  # a replay: nothing new
    assert not wake.is_set()
    outbox.enqueue(update(3, 1))
    assert wake.is_set()
    wake.clear()
    outbox.enqueue(update(3, 1))
    assert not wake.is_set()


def test_the_thread_retries_after_the_backoff_by_itself(tmp_path: Path, collector: Collector) -> None:
    """On the real clock, the thread waits out the backoff of a 500 and then delivers, with no busy loop."""
    with SqliteUpdateStore(tmp_path / "real.db") as store:
        outbox = Outbox(store, collector.url, rule=CaptureRule(chats={1}), backoff=(0.05, 0.05), recheck=3600.0)
        collector.answer(Reply(500))
        key = outbox.enqueue(update(1, 1))
        outbox.start()
        assert eventually(lambda: row(store, key)["state"] == "delivered")
        outbox.stop()
        assert outbox.join(5) and not outbox.running
        assert len(collector.received) == 2


def test_the_thread_resumes_captures_left_by_an_earlier_run(
    store: SqliteUpdateStore, collector: Collector, make_outbox: Callable
) -> None:
    """Captures written before start() are delivered when the thread starts."""
    first = make_outbox()
    first.enqueue(update(1, 1))
    second = make_outbox(recheck=3600.0)
    second.start()
    assert collector.wait_for(1, timeout=10)
    second.stop()
    assert second.join(5)


def test_a_fence_records_captures_with_its_updates_and_the_outbox_delivers_them(
    tmp_path: Path, collector: Collector
) -> None:
    """Fence(capture=outbox) writes captures of authorised chats only, and starts and stops the delivery thread."""
    import telebot

    from telegram_fence.runtime.fence import Fence
    from telegram_fence.testing import FakeBotAPI

    with FakeBotAPI(max_long_poll=0.3) as api, SqliteUpdateStore(tmp_path / "fenced.db") as store:
        bot = telebot.TeleBot(api.token, threaded=False)
        bot.message_handler(func=lambda m: True)(lambda m: None)
        outbox = Outbox(store, collector.url, rule=CaptureRule(chats={1}), recheck=3600.0)
        fence = Fence(bot, store, capture=outbox, long_poll_timeout=0.3, lease=2.0, shutdown_timeout=3.0)
        fence.start()
        assert outbox.running
        try:
            ids = [api.push_message(1, "keep me"), api.push_message(2, "not me"), api.push_message(1, "me too")]
            assert api.wait_confirmed(ids[-1] + 1, timeout=10)
            assert collector.wait_for(2, timeout=10)
            assert eventually(lambda: outbox.stats()["delivered"] == 2)
        finally:
            fence.stop()
            assert fence.join(10)
        assert not outbox.running
        assert sorted(r.json()["text"] for r in collector.received) == ["keep me", "me too"]
        assert keys(store) == [r.headers["Idempotency-Key"] for r in collector.received]


def test_a_fence_refuses_an_outbox_without_a_rule(tmp_path: Path, collector: Collector) -> None:
    """Fence(capture=Outbox(...)) without rule= is refused: it would capture nothing."""
    import telebot

    from telegram_fence.errors import ConfigurationError
    from telegram_fence.runtime.fence import Fence

    with SqliteUpdateStore(tmp_path / "fenced.db") as store:
        bot = telebot.TeleBot("123456:" + "a" * 35, threaded=False)
        with pytest.raises(ConfigurationError, match="rule"):
            Fence(bot, store, capture=Outbox(store, collector.url))


# --- logging --------------------------------------------------------------------------------------


def test_logs_carry_the_fields_and_never_the_captured_text(
    store: SqliteUpdateStore,
    clock: FakeClock,
    collector: Collector,
    make_outbox: Callable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every outbox log line has stable fields and none holds the captured text or the answer, at any level."""
    caplog.set_level(logging.DEBUG, logger="telegram_fence.outbox")
    outbox = make_outbox()
    key = outbox.enqueue(update(9, 1, SECRET))
    collector.answer(Reply(500, body=SECRET), Reply(200, body=SECRET))
    assert outbox.deliver_once()
    clock.advance(10)
    assert outbox.deliver_once()
    with pytest.raises(CaptureConflict):
        outbox.enqueue(update(9, 1, "other"))
    records = [r for r in caplog.records if r.name.startswith("telegram_fence.outbox")]
    by_msg = {r.msg: r for r in records}
    delivered = by_msg["capture delivered"]
    assert (delivered.key, delivered.update_id, delivered.chat_id, delivered.attempt) == (key, 9, 1, 2)  # type: ignore[attr-defined]
    assert delivered.levelno == logging.INFO
    retried = by_msg["capture not delivered (%s); will retry in %.3g s"]
    assert (retried.attempt, retried.status) == (1, 500)  # type: ignore[attr-defined]
    assert by_msg["capture key reused with a different payload; the first is kept"].levelno == logging.ERROR
    for record in records:
        assert SECRET not in record.getMessage()
        assert all(SECRET not in repr(value) for value in vars(record).values())


# --- stats, prune, CLI ----------------------------------------------------------------------------


def test_stats_count_states_and_age_the_oldest_pending_capture(
    store: SqliteUpdateStore, clock: FakeClock, collector: Collector, make_outbox: Callable
) -> None:
    """stats() counts captures by state and reports how long the oldest undelivered one has waited."""
    outbox = make_outbox()
    assert outbox.stats()["oldest_pending_age"] is None
    outbox.enqueue(update(1, 1))
    clock.advance(5)
    outbox.enqueue(update(2, 1))
    outbox.enqueue(update(3, 1))
    collector.answer(Reply(200), Reply(400))
    outbox.deliver_once()
    outbox.deliver_once()
    clock.advance(2)
    stats = outbox.stats()
    assert {s: stats[s] for s in ("pending", "delivering", "delivered", "failed")} == {
        "pending": 1,
        "delivering": 0,
        "delivered": 1,
        "failed": 1,
    }
    assert stats["oldest_pending_age"] == 2.0
    assert stats["running"] is False


def test_prune_deletes_only_old_delivered_captures(
    store: SqliteUpdateStore, clock: FakeClock, collector: Collector, make_outbox: Callable
) -> None:
    """prune() removes delivered captures older than the limit and nothing pending or failed."""
    outbox = make_outbox()
    outbox.enqueue(update(1, 1))
    outbox.enqueue(update(2, 1))
    outbox.enqueue(update(3, 1))
    collector.answer(Reply(200), Reply(400))
    outbox.deliver_once()
    outbox.deliver_once()
    clock.advance(100)
    assert outbox.prune(clock.now - 50) == 1
    assert keys(store) == ["telegram:2:1:20", "telegram:3:1:30"]


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli_main(list(argv))
    return status, out.getvalue(), err.getvalue()


def test_the_cli_lists_counts_and_requeues_failed_captures(
    tmp_path: Path, store: SqliteUpdateStore, clock: FakeClock, collector: Collector, make_outbox: Callable
) -> None:
    """`telegram-fence outbox DB` shows counts by state and `--requeue-failed` makes failed captures pending."""
    outbox = make_outbox()
    failed = outbox.enqueue(update(1, 1))
    outbox.enqueue(update(2, 1))
    collector.answer(Reply(400))
    outbox.deliver_once()
    db = str(tmp_path / "bot.db")

    status, out, _ = _cli("outbox", db)
    assert status == 0
    assert "pending" in out and "failed" in out and failed in out and "HTTP 400" in out
    status, out, _ = _cli("outbox", db, "--json")
    shown = json.loads(out)
    assert (shown["pending"], shown["failed"], shown["requeued"]) == (1, 1, None)
    assert shown["oldest_pending_age"] is not None

    status, out, err = _cli("outbox", db, "--requeue-failed", failed, "telegram:9:9:9")
    assert status == 1
    assert "re-queued 1 of 2 named" in out
    # the key that was not re-queued is named on stderr, one line, as every command's partial failure is
    assert err == "telegram-fence: capture telegram:9:9:9: not re-queued: it is not a failed capture\n", err
    status, out, _ = _cli("outbox", db, "--requeue-failed", "--json")
    assert status == 0
    assert json.loads(out)["requeued"] == 0
    assert row(store, failed)["state"] == "pending"


def test_the_cli_refuses_a_missing_database(tmp_path: Path) -> None:
    """`telegram-fence outbox` on a path with no file exits 2 and creates nothing."""
    missing = tmp_path / "nope.db"
    status, _, err = _cli("outbox", str(missing))
    assert status == 2
    assert "no database" in err
    assert not missing.exists()


# --- hostile input and retention ----------------------------------------


def test_a_lone_surrogate_in_the_text_is_captured_and_delivered_as_sent(
    store: SqliteUpdateStore, collector: Collector, make_outbox: Callable
) -> None:
    """A lone surrogate ("\\ud800", valid in a JSON answer) is captured and delivered; the row write never fails
    (SQLite cannot store a raw surrogate as UTF-8: the payload keeps it escaped)."""
    poison = update(1, 1, "bad \ud800 text")
    outbox = make_outbox()
    key = outbox.enqueue(poison)
    assert outbox.enqueue(poison) == key  # the same payload again: no conflict, still one capture
    assert json.loads(row(store, key)["payload"])["text"] == "bad \ud800 text"
    assert keys(store) == [key]
    assert outbox.deliver_once()
    assert collector.received[0].json()["text"] == "bad \ud800 text"
    assert collector.received[0].json()["update"] == poison


def test_a_fence_prunes_delivered_captures_with_its_retention_and_keeps_failed_ones(
    tmp_path: Path, collector: Collector, clock: FakeClock
) -> None:
    """The fence deletes delivered captures older than `retention` (each a full raw update: the file does not
    grow without bound); a failed capture stays for re-queueing."""
    import telebot

    from telegram_fence.runtime.fence import Fence
    from telegram_fence.testing import FakeBotAPI

    with FakeBotAPI(max_long_poll=0.3) as api, SqliteUpdateStore(tmp_path / "fenced.db", clock=clock) as store:
        bot = telebot.TeleBot(api.token, threaded=False)
        bot.message_handler(func=lambda m: True)(lambda m: None)
        outbox = Outbox(store, collector.url, rule=CaptureRule(chats={1}), recheck=0.2)
        collector.answer(Reply(200), Reply(400))
        fence = Fence(bot, store, capture=outbox, retention=5.0, long_poll_timeout=0.3, lease=0.6,
                      shutdown_timeout=3.0)
        ids = [api.push_message(1, "delivered"), api.push_message(1, "refused")]
        fence.start()
        try:
            assert eventually(lambda: outbox.stats()["delivered"] == 1 and outbox.stats()["failed"] == 1)
            assert eventually(lambda: store.stats()["settled"] == 2)
            assert len(keys(store)) == 2  # nothing is older than the retention yet
            clock.advance(100)
            assert eventually(lambda: len(keys(store)) == 1)
        finally:
            fence.stop()
            assert fence.join(10)
        (left,) = keys(store)
        assert row(store, left)["state"] == "failed" and row(store, left)["update_id"] == ids[1]


def test_no_outbox_statement_uses_a_sqlite_only_function() -> None:
    """Each outbox statement is SQLite's text that rows() adapts for PostgreSQL: no SQLite-only function."""
    from telegram_fence.delivery.outbox import capture, queries, sender

    statements = [v for m in (capture, queries, sender) for v in vars(m).values()
                  if isinstance(v, str) and "fence_outbox" in v]
    assert len(statements) >= 14
    assert not any(f in sql for sql in statements for f in ("randomblob", "json_each", "hex(", "%s"))
