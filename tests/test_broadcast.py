"""Broadcast: journal rules, pure decisions, pacer, files, and every outcome against the fake Bot API."""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tls_helpers import TlsFront, make_ca

from telegram_fence import telegram
from telegram_fence.delivery import broadcast
from telegram_fence.delivery.broadcast import (
    JOURNAL_FILE,
    SPEC_FILE,
    Broadcast,
    Decision,
    decide,
    gone_reason,
)
from telegram_fence.delivery.broadcast_journal import IN_FLIGHT, BroadcastReport, JournalWriter, replay
from telegram_fence.delivery.broadcast_message import normalize_audience, normalize_send_options, validate_name
from telegram_fence.errors import (
    Ambiguous,
    BroadcastConflict,
    BroadcastError,
    BroadcastLocked,
    ConfigurationError,
    Conflict,
    Fatal,
    MessageRefused,
    RecipientGone,
    RetryAfter,
    TelegramError,
    Transient,
    Unauthorized,
)
from telegram_fence.testing import FakeBotAPI


def lines(*events: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


# ------------------------------------------------------------------------------------------- input


@pytest.mark.parametrize("name", ["a", "spring-sale", "news_2024.05", "A1" * 50])
def test_valid_names_are_accepted(name: str) -> None:
    """Names made of letters, digits, '_', '.', '-' are accepted as they are."""
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "../x", "a/b", "a\\b", ".hidden", "a..b", "x" * 101, "sp ace", 7, None])
def test_unsafe_names_are_refused(name: object) -> None:
    """A name that could leave the directory or is not a plain word is refused with ConfigurationError."""
    with pytest.raises(ConfigurationError, match="broadcast name"):
        validate_name(name)


def test_audience_is_deduplicated_in_order() -> None:
    """Chat ids keep their first-seen order, decimal strings become ints, usernames compare case-insensitively."""
    assert normalize_audience([3, 1, "3", -100123, "@News_Channel", 1, "@news_channel", " 42 "]) == [
        3,
        1,
        -100123,
        "@News_Channel",
        42,
    ]


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        ([1, "bob", 2], "#2 ('bob')"),
        ([1, 2.5], "#2 (2.5)"),
        ([True], "#1 (True)"),
        ([1, 0], "#2 (0)"),
        ([1, None], "#2 (None)"),
        ([1, "@ab"], "#2 ('@ab')"),
        ([2**60], "#1"),
    ],
)
def test_audience_entry_that_is_not_a_chat_id_is_named(entries: list[object], named: str) -> None:
    """The first entry that is not a chat id is named (position and value) in the error."""
    with pytest.raises(ConfigurationError) as info:
        normalize_audience(entries)
    assert named in str(info.value)


def test_empty_audience_is_refused() -> None:
    """An empty audience (or a bare string) is refused."""
    with pytest.raises(ConfigurationError, match="empty"):
        normalize_audience([])
    with pytest.raises(ConfigurationError, match="list"):
        normalize_audience("12345")


def test_send_options_are_checked() -> None:
    """Known options pass, markup objects become JSON, unknown or per-chat options and bad types are refused."""
    from telebot import types

    markup = types.InlineKeyboardMarkup()
    markup.add(types.InlineKeyboardButton("site", url="https://example.org"))
    options = normalize_send_options({"parse_mode": "HTML", "reply_markup": markup, "disable_notification": None})
    assert options == {
        "parse_mode": "HTML",
        "reply_markup": {"inline_keyboard": [[{"text": "site", "url": "https://example.org"}]]},
    }
    with pytest.raises(ConfigurationError, match="reply_to_message_id"):
        normalize_send_options({"reply_to_message_id": 5})
    with pytest.raises(ConfigurationError, match="protect_content"):
        normalize_send_options({"protect_content": "yes"})


# ------------------------------------------------------------------------------------------ replay

AUD: list[int | str] = [10, 20, 30, 40]


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([], dict(sent=0, failed={}, uncertain=0, pending=4, in_flight=0, halted=None)),
        (
            [{"ev": "run"}, {"ev": "intent", "i": 0, "chat": 10}, {"ev": "sent", "i": 0}],
            dict(sent=1, failed={}, uncertain=0, pending=3, in_flight=0, halted=None),
        ),
        (
            [{"ev": "intent", "i": 1}, {"ev": "failed", "i": 1, "reason": "blocked"}, {"ev": "intent", "i": 2}],
            dict(sent=0, failed={"blocked": 1}, uncertain=0, pending=2, in_flight=1, halted=None),
        ),
        (
            [{"ev": "intent", "i": 0}, {"ev": "not_sent", "i": 0}, {"ev": "intent", "i": 0}, {"ev": "sent", "i": 0}],
            dict(sent=1, failed={}, uncertain=0, pending=3, in_flight=0, halted=None),
        ),
        (
            [{"ev": "intent", "i": 3}, {"ev": "uncertain", "i": 3, "reason": "interrupted"}],
            dict(sent=0, failed={}, uncertain=1, pending=3, in_flight=0, halted=None),
        ),
        (
            [{"ev": "intent", "i": 0}, {"ev": "not_sent", "i": 0}, {"ev": "halt", "reason": "unauthorized"}],
            dict(sent=0, failed={}, uncertain=0, pending=4, in_flight=0, halted="unauthorized"),
        ),
        (
            [{"ev": "halt", "reason": "unauthorized"}, {"ev": "run"}],
            dict(sent=0, failed={}, uncertain=0, pending=4, in_flight=0, halted=None),
        ),
    ],
)
def test_replay_counts(events: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    """Replaying a journal yields the counts its events imply (a not_sent makes the recipient pending again)."""
    report = replay(lines(*events), AUD).report("x")
    assert {k: getattr(report, k) for k in expected} == expected
    assert report.total == 4


def test_final_halt_survives_later_lines_and_refuses_a_run() -> None:
    """A final halt is reported, and a run line after it is a damaged journal."""
    state = replay(lines({"ev": "halt", "reason": "message refused", "final": True}), AUD)
    assert state.halted is not None and state.halt_final
    with pytest.raises(BroadcastError, match="after a final halt"):
        replay(lines({"ev": "halt", "reason": "r", "final": True}, {"ev": "run"}), AUD)


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([{"ev": "sent", "i": 0}], "no open intent"),
        ([{"ev": "intent", "i": 0}, {"ev": "intent", "i": 0}], "not pending"),
        ([{"ev": "intent", "i": 0}, {"ev": "sent", "i": 0}, {"ev": "intent", "i": 0}], "not pending"),
        ([{"ev": "intent", "i": 9}], "names no recipient"),
        ([{"ev": "intent", "i": 0, "chat": 99}], "does not belong"),
        ([{"ev": "teleport", "i": 0}], "unknown journal event"),
    ],
)
def test_replay_refuses_impossible_journals(events: list[dict[str, Any]], message: str) -> None:
    """A journal that breaks the intent/outcome rules is refused, naming the line, instead of guessed at."""
    with pytest.raises(BroadcastError, match=message) as info:
        replay(lines(*events), AUD)
    assert "journal line" in str(info.value)


@pytest.mark.parametrize(
    ("middle", "message"),
    [
        (b"{oops", "line 2 is not JSON"),
        (b"", "line 2 is not JSON"),
        (b"1,2", "line 2 is not JSON"),
        (b"[]", "line 2 is not an event"),
    ],
)
def test_replay_refuses_garbage_in_a_complete_line(middle: bytes, message: str) -> None:
    """A complete line that is not one JSON event is damage, not a torn write, and is named."""
    with pytest.raises(BroadcastError, match=message):
        replay(lines({"ev": "run"}) + middle + b"\n" + lines({"ev": "run"}), AUD)


def test_torn_last_line_is_ignored() -> None:
    """A last line without its newline (a crash mid-write) is ignored and valid_length stops before it."""
    good = lines({"ev": "intent", "i": 0}, {"ev": "sent", "i": 0}, {"ev": "intent", "i": 1})
    state = replay(good + b'{"ev":"sent","i', AUD)
    assert state.valid_length == len(good)
    assert state.in_flight == 1 and state.states[1] == IN_FLIGHT


def test_writer_cuts_a_torn_tail_and_appends_whole_lines(tmp_path: Path) -> None:
    """The writer drops a torn tail so the next event never glues onto it, and each append is one line."""
    path = tmp_path / "j"
    good = lines({"ev": "intent", "i": 0})
    path.write_bytes(good + b'{"ev":"se')
    state = replay(path.read_bytes(), AUD)
    writer = JournalWriter(path, state.valid_length)
    writer.record(state, {"ev": "uncertain", "i": 0, "reason": "interrupted"})
    writer.close()
    writer.close()
    data = path.read_bytes()
    assert data.startswith(good) and data.endswith(b"\n") and data.count(b"\n") == 2
    assert replay(data, AUD).report("x").uncertain == 1


def test_writer_refuses_a_missing_or_shrunk_journal(tmp_path: Path) -> None:
    """A journal that vanished or shrank after it was read is an error, not a fresh start."""
    with pytest.raises(BroadcastError, match="missing"):
        JournalWriter(tmp_path / "nope", 0)
    (tmp_path / "j").write_bytes(b"")
    with pytest.raises(BroadcastError, match="shrank"):
        JournalWriter(tmp_path / "j", 10)


# ----------------------------------------------------------------------------------------- decisions

@pytest.mark.parametrize(
    ("error", "counters", "expected"),
    [
        (RetryAfter(7), {}, Decision("not_sent", "retry_after", wait=7.0)),
        (RetryAfter(7), {"rate_limited": 19}, Decision("not_sent", "retry_after", halt="*")),
        (Transient("502"), {}, Decision("not_sent", "transient", wait=0.5)),
        (Transient("502"), {"transient_failures": 1}, Decision("not_sent", "transient", wait=1.0)),
        (Transient("502"), {"transient_failures": 4}, Decision("not_sent", "transient", halt="*")),
        (Ambiguous("reset"), {}, Decision("uncertain", "ambiguous")),
        (Ambiguous("reset"), {"ambiguous_in_a_row": 4}, Decision("uncertain", "ambiguous", halt="*")),
        (
            RecipientGone("Forbidden: bot was blocked by the user", error_code=403),
            {},
            Decision("failed", "blocked"),
        ),
        (RecipientGone("Bad Request: chat not found", error_code=400), {}, Decision("failed", "chat_not_found")),
        (
            MessageRefused("Bad Request: message is too long", error_code=400),
            {},
            Decision("not_sent", "message_refused", halt="*", final=True),
        ),
        (Unauthorized("Unauthorized", error_code=401), {}, Decision("not_sent", "unauthorized", halt="*")),
        (Conflict("Conflict", error_code=409), {}, Decision("not_sent", "conflict", halt="*")),
        (Fatal("I'm a teapot", error_code=418), {}, Decision("not_sent", "fatal", halt="*")),
        (Fatal("TypeError: boom"), {}, Decision("uncertain", "fatal", halt="*")),
    ],
)
def test_decide(error: TelegramError, counters: dict[str, int], expected: Decision) -> None:
    """Each classified error maps to the journal outcome, wait and halt the broadcast rules prescribe."""
    got = decide(error, **counters)
    assert (got.outcome, got.reason, got.wait, got.final) == (
        expected.outcome,
        expected.reason,
        expected.wait,
        expected.final,
    )
    assert (got.halt is not None) == (expected.halt is not None)


@pytest.mark.parametrize(
    ("description", "code", "reason"),
    [
        ("Forbidden: bot was blocked by the user", 403, "blocked"),
        ("Forbidden: user is deactivated", 403, "deactivated"),
        ("Forbidden: bot was kicked from the group chat", 403, "kicked"),
        ("Bad Request: chat not found", 400, "chat_not_found"),
        ("Bad Request: group chat was upgraded to a supergroup chat", 400, "migrated"),
        ("Forbidden: something new", 403, "forbidden"),
        ("Bad Request: need administrator rights in the channel chat", 400, "gone"),
    ],
)
def test_gone_reason(description: str, code: int, reason: str) -> None:
    """A recipient-gone error is charged under a short stable reason."""
    assert gone_reason(RecipientGone(description, error_code=code)) == reason


# -------------------------------------------------------------------------------------- files / create


def test_create_writes_once_and_is_idempotent(tmp_path: Path) -> None:
    """create writes audience and message once; the same call again is a no-op returning False."""
    b = Broadcast(None, tmp_path / "bc", "news")
    assert not b.exists()
    assert b.create([5, 6, 5], "hello", parse_mode="HTML") is True
    assert b.exists()
    spec = json.loads((tmp_path / "bc" / "news" / SPEC_FILE).read_text())
    assert spec["audience"] == [5, 6] and spec["text"] == "hello" and spec["options"] == {"parse_mode": "HTML"}
    before = sorted(p.name for p in (tmp_path / "bc" / "news").iterdir())
    assert b.create([5, 6], "hello", parse_mode="HTML") is False
    assert sorted(p.name for p in (tmp_path / "bc" / "news").iterdir()) == before
    assert (tmp_path / "bc" / "news" / JOURNAL_FILE).read_bytes() == b""
    assert b.status() == BroadcastReport("news", 2, 0, {}, 0, 2)


@pytest.mark.parametrize(
    ("audience", "text", "options", "what"),
    [([5, 7], "hello", {}, "audience"), ([5, 6], "hi", {}, "text"), ([5, 6], "hello", {"parse_mode": "HTML"}, "send")],
)
def test_create_with_other_content_conflicts(
    tmp_path: Path, audience: list[int], text: str, options: dict[str, Any], what: str
) -> None:
    """Another audience, text or options under an existing name raises BroadcastConflict naming the difference."""
    Broadcast(None, tmp_path, "news").create([5, 6], "hello")
    with pytest.raises(BroadcastConflict, match=what):
        Broadcast(None, tmp_path, "news").create(audience, text, **options)


@pytest.mark.parametrize(
    ("audience", "text", "match"),
    [([1, "bob"], "hi", "'bob'"), ([], "hi", "empty"), ([1], "", "text is empty"), ([1], "  \n", "text is empty")],
)
def test_create_refuses_bad_input_and_writes_nothing(
    tmp_path: Path, audience: list[object], text: str, match: str
) -> None:
    """A bad entry, an empty audience or an empty text is refused and leaves no file behind."""
    with pytest.raises(ConfigurationError, match=match):
        Broadcast(None, tmp_path / "bc", "news").create(audience, text)
    assert not (tmp_path / "bc").exists()


def test_concurrent_creates_agree(tmp_path: Path) -> None:
    """Threads creating the same broadcast at once: exactly one writes it, the others see a no-op."""
    barrier = threading.Barrier(8)
    results: list[bool] = []

    def create() -> None:
        barrier.wait()
        results.append(Broadcast(None, tmp_path, "same").create(range(1, 1000), "hello"))

    threads = [threading.Thread(target=create, name=f"create-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert not [p for p in (tmp_path / "same").iterdir() if p.name.endswith(".tmp")]


def test_status_and_run_of_unknown_broadcast(tmp_path: Path) -> None:
    """A broadcast that was never created cannot be read or run."""
    with pytest.raises(BroadcastError, match="create it first"):
        Broadcast(None, tmp_path, "ghost").status()


def test_missing_journal_is_refused_not_restarted(tmp_path: Path) -> None:
    """If the journal was deleted, the broadcast refuses to run instead of sending everyone again."""
    b = Broadcast(object(), tmp_path, "news")
    b.create([1, 2], "hello")
    os.unlink(tmp_path / "news" / JOURNAL_FILE)
    with pytest.raises(BroadcastError, match="no journal"):
        b.run(rate=math.inf)


def test_run_without_bot_is_refused(tmp_path: Path) -> None:
    """run needs a bot; create and status do not."""
    b = Broadcast(None, tmp_path, "news")
    b.create([1], "hello")
    with pytest.raises(ConfigurationError, match="needs a bot"):
        b.run()


@pytest.mark.parametrize("rate", [0, -1, float("nan"), "25", True])
def test_run_refuses_a_bad_rate(tmp_path: Path, rate: object) -> None:
    """A rate that is not a positive number is refused with ConfigurationError naming it."""
    b = Broadcast(object(), tmp_path, "news")
    b.create([1], "hello")
    with pytest.raises(ConfigurationError, match="rate"):
        b.run(rate=rate)  # type: ignore[arg-type]


def test_lock_refuses_a_second_runner_and_names_the_pid(tmp_path: Path) -> None:
    """While one run holds the lock, another run of the same broadcast raises BroadcastLocked with the pid."""
    b = Broadcast(object(), tmp_path, "news")
    b.create([1], "hello")
    with b._locked(), pytest.raises(BroadcastLocked, match=f"pid {os.getpid()}"):
        Broadcast(object(), tmp_path, "news").run()


# ------------------------------------------------------------------------------- against the fake API

@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's retry budget made small and quick."""
    for name, value in (("TRANSIENT_ATTEMPTS", 3), ("AMBIGUOUS_IN_A_ROW", 3), ("BACKOFF_BASE", 0.01),
                        ("BACKOFF_CAP", 0.05)):
        monkeypatch.setattr(broadcast, name, value)


def journal_events(directory: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / name / JOURNAL_FILE).read_bytes().splitlines()]


def calls_for(api: Any, chat: int) -> list[Any]:
    return [c for c in api.calls_to("sendMessage") if str(c.params.get("chat_id")) == str(chat)]


def test_run_sends_everyone_once_and_ends(tmp_path: Path, fake_bot_api: Any, fake_bot: Any) -> None:
    """A run sends the message to each recipient once, reports progress per recipient, and a rerun sends nothing."""
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create(range(1, 41), "hello *all*", parse_mode="Markdown")
    seen: list[BroadcastReport] = []
    report = b.run(rate=math.inf, progress=seen.append)
    assert (report.sent, report.pending, report.uncertain, report.failed, report.halted) == (40, 0, 0, {}, None)
    assert report.done and len(seen) == 40 and seen[-1] == report
    assert [s.chat_id for s in fake_bot_api.sent] == list(range(1, 41))
    assert {s.text for s in fake_bot_api.sent} == {"hello *all*"}
    assert {s.params.get("parse_mode") for s in fake_bot_api.sent} == {"Markdown"}
    assert b.run(rate=math.inf) == report
    assert len(fake_bot_api.calls_to("sendMessage")) == 40
    assert b.status() == report


def test_a_run_spaces_its_sends_at_the_rate(tmp_path: Path, fake_bot_api: Any, fake_bot: Any) -> None:
    """Each send starts at least 1/rate after the previous one, also after a slow answer (no catching up)."""
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create(range(1, 9), "hello")
    fake_bot_api.delay("sendMessage", 0.3, times=1)  # the first answer is late: the next sends must not burst
    start = time.monotonic()
    assert b.run(rate=20.0).sent == 8
    times = [c.time for c in fake_bot_api.calls_to("sendMessage")]
    assert min(later - earlier for earlier, later in itertools.pairwise(times)) >= 1 / 20 - 0.02
    assert time.monotonic() - start >= 0.3 + 6 / 20


def test_reply_markup_travels_with_every_message(tmp_path: Path, fake_bot_api: Any, fake_bot: Any) -> None:
    """Stored reply_markup and link_preview_options reach Telegram as the same JSON for every recipient."""
    markup = {"inline_keyboard": [[{"text": "open", "url": "https://example.org"}]]}
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([1, 2], "hi", reply_markup=markup, link_preview_options={"is_disabled": True})
    b.run(rate=math.inf)
    assert [json.loads(s.params["reply_markup"]) for s in fake_bot_api.sent] == [markup, markup]
    assert [json.loads(s.params["link_preview_options"]) for s in fake_bot_api.sent] == [{"is_disabled": True}] * 2


def test_gone_recipients_are_failed_by_reason(tmp_path: Path, fake_bot_api: Any, fake_bot: Any) -> None:
    """Blocked, deactivated and unknown chats are charged as failed (by reason), tried once, and the run goes on."""
    fake_bot_api.block(2)
    fake_bot_api.deactivate(3)
    fake_bot_api.forget_chat(4)
    fake_bot_api.block(-1005)
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([1, 2, 3, 4, -1005, 6], "hello")
    report = b.run(rate=math.inf)
    assert report.failed == {"blocked": 1, "deactivated": 1, "chat_not_found": 1, "kicked": 1}
    assert (report.sent, report.pending, report.failed_total) == (2, 0, 4)
    assert [s.chat_id for s in fake_bot_api.sent] == [1, 6]
    assert len(fake_bot_api.calls_to("sendMessage")) == 6
    b.run(rate=math.inf)
    assert len(fake_bot_api.calls_to("sendMessage")) == 6


def test_retry_after_is_honoured_then_the_same_recipient_is_sent(
    tmp_path: Path, fake_bot_api: Any, fake_bot: Any
) -> None:
    """A 429 closes the intent not_sent, waits retry_after (>= 1 s measured) and sends the same recipient once."""
    fake_bot_api.fail("sendMessage", 429, retry_after=1, times=1)
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([7, 8], "hello")
    report = b.run(rate=math.inf)
    assert (report.sent, report.uncertain, report.pending) == (2, 0, 0)
    first, second = calls_for(fake_bot_api, 7)
    assert second.time - first.time >= 1.0
    assert [s.chat_id for s in fake_bot_api.sent] == [7, 8]
    kinds = [(e["ev"], e.get("reason")) for e in journal_events(tmp_path, "news") if e.get("i") == 0]
    assert kinds == [("intent", None), ("not_sent", "retry_after"), ("intent", None), ("sent", None)]


@pytest.mark.parametrize("retry_after", [10**9, math.inf])
def test_an_absurd_retry_after_is_waited_only_up_to_the_cap_and_so_journaled(
    tmp_path: Path, fake_bot_api: Any, fake_bot: Any, monkeypatch: pytest.MonkeyPatch, retry_after: float
) -> None:
    """A 429 asking for decades (or infinity) is waited at most the retry cap, and the journal keeps the capped wait."""
    from telegram_fence import retry

    monkeypatch.setattr(retry, "MAX_RETRY_AFTER_WAIT", 0.3)
    fake_bot_api.fail("sendMessage", 429, retry_after=retry_after, times=1)  # type: ignore[arg-type]
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([7, 8], "hello")
    done: list[BroadcastReport] = []
    runner = threading.Thread(target=lambda: done.append(b.run(rate=math.inf)), name="test-broadcast")
    runner.start()
    runner.join(15)
    if runner.is_alive():  # the pre-fix behaviour: parked in the wait; end it so the test fails cleanly
        b.stop()
        runner.join(10)
    assert done and (done[0].sent, done[0].pending) == (2, 0)
    [limited] = [e for e in journal_events(tmp_path, "news") if e["ev"] == "not_sent"]
    assert limited["wait"] == 0.3


def test_a_journaled_wait_beyond_the_cap_is_replayed_capped() -> None:
    """A journal holding a 429 wait of years (written before the cap, or edited) makes a later run wait at most
    the cap."""
    at = 1_700_000_000_000
    journal = lines({"ev": "intent", "i": 0, "t": at}, {"ev": "not_sent", "i": 0, "wait": 1e9, "t": at})
    state = replay(journal, AUD)
    assert state.not_before == at / 1000.0 + 600.0


def test_dropped_connection_is_uncertain_and_never_resent(tmp_path: Path, fake_bot_api: Any, fake_bot: Any) -> None:
    """A connection closed after the request was executed makes that recipient uncertain; it is never sent again."""
    fake_bot_api.drop("sendMessage", times=1, executed=True)
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([7, 8, 9], "hello")
    report = b.run(rate=math.inf)
    assert (report.sent, report.uncertain, report.pending, report.halted) == (2, 1, 0, None)
    b.run(rate=math.inf)
    assert len(calls_for(fake_bot_api, 7)) == 1
    assert len(fake_bot_api.sent_to(7)) == 1  # it did arrive: sending again would have doubled it


def test_many_uncertain_sends_in_a_row_halt_the_run(
    tmp_path: Path, fake_bot_api: Any, fake_bot: Any, fast: None
) -> None:
    """Uncertain outcomes in a row stop spending recipients: the run halts (not for good) after the policy's count."""
    fake_bot_api.drop("sendMessage", times=None)
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create(range(1, 11), "hello")
    report = b.run(rate=math.inf)
    assert (report.uncertain, report.pending, report.halt_final) == (3, 7, False)
    assert report.halted is not None and "uncertain" in report.halted
    fake_bot_api.clear_faults()
    assert b.run(rate=math.inf).sent == 7


@pytest.mark.parametrize(
    ("text", "options", "refusal", "why"),
    [("<b></b>", {"parse_mode": "HTML"}, None, "message text is empty"),
     ("*bold", {"parse_mode": "Markdown"}, "Bad Request: can't parse entities: no end", "can't parse entities")],
    ids=["empty-after-markup", "bad-markdown"],  # a text over the length limit is refused at create
)
def test_refused_message_halts_for_good_without_charging(
    tmp_path: Path, fake_bot_api: Any, fake_bot: Any, text: str, options: dict[str, Any], refusal: str | None,
    why: str,
) -> None:
    """A refused message halts the run for good; the recipient stays pending and later runs send nothing."""
    if refusal is not None:
        fake_bot_api.fail("sendMessage", 400, refusal)
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([1, 2, 3], text, **options)
    report = b.run(rate=math.inf)
    assert (report.sent, report.failed, report.uncertain, report.pending) == (0, {}, 0, 3)
    assert report.halt_final and report.halted is not None and why in report.halted
    assert b.status() == report
    assert b.run(rate=math.inf) == report
    assert len(fake_bot_api.calls_to("sendMessage")) == 1
    assert [e["ev"] for e in journal_events(tmp_path, "news")][-2:] == ["not_sent", "halt"]


def test_a_refused_connection_is_retried_with_backoff_and_the_budget_halts(
    tmp_path: Path, fake_bot_api: Any, fake_bot: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused connection proves nothing was sent: retried with backoff, then halts with everyone pending;
    the next run (server back) sends each recipient once."""
    closed = FakeBotAPI()
    with closed:
        pass  # started and stopped: its port now refuses connections
    monkeypatch.setattr(broadcast, "TRANSIENT_ATTEMPTS", 2)
    monkeypatch.setattr(broadcast, "BACKOFF_BASE", 0.01)
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([1, 2], "hello")
    with telegram.api_server(closed.api_url):
        report = b.run(rate=math.inf)
    assert (report.sent, report.pending, report.uncertain, report.halt_final) == (0, 2, 0, False)
    assert report.halted is not None and "transient" in report.halted
    assert [e["ev"] for e in journal_events(tmp_path, "news") if e["ev"] != "run"][:4] == [
        "intent", "not_sent", "intent", "not_sent"
    ]
    report = b.run(rate=math.inf)
    assert (report.sent, report.pending, report.halted) == (2, 0, None)
    assert len(fake_bot_api.sent_to(1)) == 1 and len(fake_bot_api.sent_to(2)) == 1


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_server_error_makes_the_recipient_uncertain_never_sent_twice(
    tmp_path: Path, fake_bot_api: Any, fake_bot: Any, status: int, fast: None
) -> None:
    """A 5xx (a gateway's 502/504 may come after Telegram acted) is uncertain: the recipient is not sent again."""
    fake_bot_api.fail("sendMessage", status, html=status in (502, 504), times=1)
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([1, 2], "hello")
    report = b.run(rate=math.inf)
    assert (report.sent, report.uncertain, report.pending, report.halted) == (1, 1, 0, None)
    assert len(calls_for(fake_bot_api, 1)) == 1 and len(calls_for(fake_bot_api, 2)) == 1


def test_a_tls_failure_after_telegram_acted_leaves_the_recipient_uncertain_and_sent_once(
    tmp_path: Path, fake_bot_api: Any, fake_bot: Any, monkeypatch: pytest.MonkeyPatch, fast: None
) -> None:
    """A TLS error while the answer is read (the message went out) records uncertain; nobody gets it twice.

    A TLS front with a private CA passes sendMessage to the fake and then breaks the stream.
    """
    authority = make_ca(tmp_path / "ca")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(authority.ca))
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([1, 2], "hello")
    with TlsFront(authority, fake_bot_api.port, break_after=("sendMessage",)) as front, telegram.api_server(
        front.api_url
    ):
        report = b.run(rate=math.inf)
    assert front.broken  # every send went through the broken front
    assert report.sent == 0 and report.uncertain == 2 and report.pending == 0
    assert len(fake_bot_api.sent_to(1)) == 1 and len(fake_bot_api.sent_to(2)) == 1  # delivered, once each
    assert b.run(rate=math.inf).uncertain == 2 and len(fake_bot_api.sent_to(1)) == 1  # a rerun sends nothing


def test_an_untrusted_certificate_halts_without_charging_anyone(
    tmp_path: Path, fake_bot_api: Any, fake_bot: Any, monkeypatch: pytest.MonkeyPatch, fast: None
) -> None:
    """A certificate that fails verification halts the run (not sent: the handshake failed) with the reason."""
    authority = make_ca(tmp_path / "ca")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([1, 2], "hello")
    with TlsFront(authority, fake_bot_api.port) as front, telegram.api_server(front.api_url):
        report = b.run(rate=math.inf)
    assert (report.sent, report.uncertain, report.pending, report.halt_final) == (0, 0, 2, False)
    assert report.halted is not None and "certificate verification failed" in report.halted
    assert not fake_bot_api.sent_to(1)


def test_revoked_token_halts_without_charging(tmp_path: Path, fake_bot_api: Any, fake_bot: Any) -> None:
    """401 Unauthorized halts the run (resumable) and charges nobody."""
    fake_bot_api.revoke_token()
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([1, 2], "hello")
    report = b.run(rate=math.inf)
    assert (report.sent, report.pending, report.failed_total, report.uncertain) == (0, 2, 0, 0)
    assert report.halted is not None and report.halted.startswith("unauthorized") and not report.halt_final


def test_interrupted_send_is_recorded_uncertain_and_skipped(tmp_path: Path, fake_bot_api: Any, fake_bot: Any) -> None:
    """An intent without an outcome (a crash mid-send, torn outcome line) becomes uncertain and is never sent."""
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([1, 2, 3], "hello")
    (tmp_path / "news" / JOURNAL_FILE).write_bytes(
        lines({"ev": "run"}, {"ev": "intent", "i": 0, "chat": 1}, {"ev": "sent", "i": 0}, {"ev": "intent", "i": 1})
        + b'{"ev":"sent","i":1,"m'
    )
    report = b.run(rate=math.inf)
    assert (report.sent, report.uncertain, report.pending) == (2, 1, 0)
    assert [c.params["chat_id"] for c in fake_bot_api.calls_to("sendMessage")] == ["3"]
    events = journal_events(tmp_path, "news")  # parses: the torn fragment is gone, nothing glued to it
    assert {"ev": "uncertain", "i": 1, "reason": "interrupted"}.items() <= events[4].items()


def test_second_runner_is_locked_out_and_stop_ends_a_run(tmp_path: Path, fake_bot_api: Any, fake_bot: Any) -> None:
    """While a run is going, another run of the same broadcast raises BroadcastLocked; stop() ends the run resumably."""
    fake_bot_api.set_latency("sendMessage", 0.02)
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create(range(1, 1001), "hello")
    started = threading.Event()
    result: list[BroadcastReport] = []

    def progress(report: BroadcastReport) -> None:
        started.set()

    thread = threading.Thread(target=lambda: result.append(b.run(rate=math.inf, progress=progress)), name="bc-run")
    thread.start()
    try:
        assert started.wait(10)
        with pytest.raises(BroadcastLocked, match=str(os.getpid())):
            Broadcast(fake_bot, tmp_path, "news").run(rate=math.inf)
    finally:
        b.stop()
        thread.join(10)
    assert not thread.is_alive()
    stopped = result[0]
    assert 0 < stopped.sent < 1000 and stopped.pending == 1000 - stopped.sent and stopped.halted is None
    fake_bot_api.set_latency("sendMessage", 0)
    assert Broadcast(fake_bot, tmp_path, "news").run(rate=math.inf).sent == 1000
    assert len(fake_bot_api.sent) == 1000 == len({s.chat_id for s in fake_bot_api.sent})


# ------------------------------------------------------------------------------------------------ CLI


def cli(*argv: str) -> int:
    from telegram_fence.cli.main import main

    return main(["broadcast", *argv])


def test_cli_parser_registers_the_three_commands() -> None:
    """The parser puts create/run/status under 'broadcast', each with its handler."""
    from telegram_fence.cli import broadcast as cli_broadcast
    from telegram_fence.cli.main import build_parser

    parser = build_parser()
    args = parser.parse_args(["broadcast", "run", "news", "--rate", "5", "--dir", "d"])
    assert (args.func, args.name, args.rate, args.dir) == (cli_broadcast.cmd_run, "news", 5.0, "d")
    assert parser.parse_args(["broadcast", "status", "news"]).func is cli_broadcast.cmd_status
    with pytest.raises(SystemExit):
        parser.parse_args(["broadcast", "create", "news", "--audience", "f"])  # no text


def test_cli_create_and_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """create reads the audience file (comments, blanks ignored), is idempotent, refuses a changed message."""
    audience = tmp_path / "aud.txt"
    audience.write_text("# subscribers\n101\n\n102  # bob\n@news_channel\n101\n")
    text = tmp_path / "msg.txt"
    text.write_text("Hello <b>all</b>", encoding="utf-8")
    base = ("--dir", str(tmp_path / "bc"))
    assert (
        cli("create", "news", "--audience", str(audience), "--text-file", str(text), "--parse-mode", "HTML", *base) == 0
    )
    assert "created: 3 recipients" in capsys.readouterr().out
    assert (
        cli("create", "news", "--audience", str(audience), "--text-file", str(text), "--parse-mode", "HTML", *base) == 0
    )
    assert "already exists" in capsys.readouterr().out
    assert cli("create", "news", "--audience", str(audience), "--text", "other", *base) == 2
    assert "another text and send options" in capsys.readouterr().err
    assert cli("status", "news", "--json", *base) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["total"], status["pending"], status["halted"]) == (3, 3, None)


def test_cli_bad_audience_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An audience line that is not a chat id is refused with its file and line number; nothing is created."""
    audience = tmp_path / "aud.txt"
    audience.write_text("101\nbob\n")
    assert cli("create", "news", "--audience", str(audience), "--text", "hi", "--dir", str(tmp_path / "bc")) == 2
    assert f"{audience}:2: 'bob' is not a chat id" in capsys.readouterr().err
    assert not (tmp_path / "bc").exists()


def test_cli_run_needs_the_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """run refuses clearly when TELEGRAM_BOT_TOKEN is missing."""
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN", raising=False)
    Broadcast(None, tmp_path, "news").create([1], "hi")
    assert cli("run", "news", "--dir", str(tmp_path)) == 2
    assert "TELEGRAM_BOT_TOKEN is not set" in capsys.readouterr().err


def test_cli_run_sends_and_never_prints_the_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fake_bot_api: Any
) -> None:
    """run sends to everyone with plain progress lines off a terminal, exits 0, and the token appears nowhere."""
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", fake_bot_api.token)
    fake_bot_api.block(3)
    Broadcast(None, tmp_path, "news").create([1, 2, 3], "hi")
    assert cli("run", "news", "--dir", str(tmp_path), "--rate", "1000") == 0
    out, err = capsys.readouterr()
    assert "sent 2, failed 1 (blocked 1)" in out and "pending 0" in out
    assert "3/3 decided" in err  # the last progress line
    secret = fake_bot_api.token.split(":", 1)[1]
    assert secret not in out + err


def test_cli_run_exits_non_zero_when_halted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fake_bot_api: Any
) -> None:
    """A halted run (message refused) exits 1 and says the message must go out under a new name."""
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", fake_bot_api.token)
    fake_bot_api.fail("sendMessage", 400, "Bad Request: can't parse entities: Can't find end of the entity")
    Broadcast(None, tmp_path, "news").create([1, 2], "*bold", parse_mode="Markdown")
    assert cli("run", "news", "--dir", str(tmp_path)) == 1
    out, err = capsys.readouterr()
    assert "HALTED for good" in out and "can't parse entities" in out
    assert "create a new broadcast" in err
    assert fake_bot_api.token.split(":", 1)[1] not in out + err
    assert cli("status", "news", "--dir", str(tmp_path)) == 0
    assert "pending 2" in capsys.readouterr().out


def test_cli_locked_run_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of a broadcast another process holds exits 3 naming the holder's pid."""
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123456:" + "a" * 35)
    b = Broadcast(None, tmp_path, "news")
    b.create([1], "hi")
    with b._locked():
        assert cli("run", "news", "--dir", str(tmp_path)) == 3
    assert f"pid {os.getpid()}" in capsys.readouterr().err


def test_progress_prints_a_line_at_the_start_and_every_tenth() -> None:
    """Progress prints the summary line at the start and every 10 % of decided recipients."""
    import io

    from telegram_fence.cli.broadcast import ProgressPrinter

    plain = io.StringIO()
    printer = ProgressPrinter(plain)
    for sent in range(1, 101):
        printer(BroadcastReport("news", 100, sent, {}, 0, 100 - sent))
    assert len(plain.getvalue().splitlines()) == 11 and "100/100" in plain.getvalue()


def test_stop_before_run_returns_at_once_and_only_once(tmp_path: Path, fake_bot_api: Any, fake_bot: Any) -> None:
    """A stop() that comes before run() makes that run return without sending; the next run goes on."""
    b = Broadcast(fake_bot, tmp_path, "news")
    b.create([1, 2], "hello")
    b.stop()
    report = b.run(rate=math.inf)
    assert (report.pending, report.halted) == (2, None) and not fake_bot_api.calls_to("sendMessage")
    assert b.run(rate=math.inf).sent == 2
