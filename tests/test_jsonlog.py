"""Tests for telegram_fence.jsonlog: pino-shaped lines, exceptions under any key, masking, caps, threads."""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import requests
import telebot

from telegram_fence import jsonlog
from telegram_fence.errors import ConfigurationError, Transient
from telegram_fence.jsonlog import JsonFormatter, JsonLineHandler, configure_logging, pino_level
from telegram_fence.telegram import api_server, call
from telegram_fence.testing import FakeBotAPI

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawq"
SECRET_PART = TOKEN.split(":", 1)[1]


class Capture:
    """A logger wired to a JsonFormatter writing into a StringIO; ``lines()`` parses what was written."""

    def __init__(self, logger: logging.Logger, stream: io.StringIO, handler: JsonLineHandler) -> None:
        self.logger = logger
        self.stream = stream
        self.handler = handler

    def raw(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.raw()]

    def one(self) -> dict[str, Any]:
        lines = self.lines()
        assert len(lines) == 1, lines
        return lines[0]


def make_capture(test_name: str, **formatter_kw: Any) -> Capture:
    stream = io.StringIO()
    handler = JsonLineHandler(stream, JsonFormatter(**formatter_kw))
    logger = logging.getLogger(f"test_jsonlog.{test_name}")
    logger.handlers[:] = [handler]
    logger.setLevel(1)
    logger.propagate = False
    return Capture(logger, stream, handler)


@pytest.fixture
def cap(request: pytest.FixtureRequest) -> Iterator[Capture]:
    capture = make_capture(request.node.name, secrets=["hunter2-secret"])
    yield capture
    capture.logger.handlers.clear()


def quiet_pytest_log_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let pytest's own log capture handler (which newer pytest attaches even to non-propagating loggers)
    ignore the deliberately broken records these tests log; our handler is what the tests check."""
    monkeypatch.setattr(logging, "raiseExceptions", False)


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- levels and shape ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stdlib", "pino"),
    [
        (1, 10),
        (5, 10),
        (9, 10),
        (10, 20),
        (15, 20),
        (20, 30),
        (25, 30),
        (30, 40),
        (40, 50),
        (45, 50),
        (50, 60),
        (99, 60),
    ],
)
def test_pino_level_mapping(stdlib: int, pino: int) -> None:
    """Stdlib level numbers map onto pino's 10/20/30/40/50/60 buckets as the module documents."""
    assert pino_level(stdlib) == pino


def test_error_contract_levels(cap: Capture) -> None:
    """logger.error and logger.exception are level 50, critical 60, warning 40: errors are level >= 50."""
    cap.logger.debug("d")
    cap.logger.info("i")
    cap.logger.warning("w")
    cap.logger.error("e")
    try:
        raise ValueError("x")
    except ValueError:
        cap.logger.exception("x")
    cap.logger.critical("c")
    assert [line["level"] for line in cap.lines()] == [20, 30, 40, 50, 50, 60]


def test_line_has_pino_core_fields_and_extras(cap: Capture) -> None:
    """A line carries level, epoch-ms time, msg, pid, hostname, name and the record's extra fields."""
    before = int(time.time() * 1000)
    cap.logger.info("claimed %s", "it", extra={"update_id": 7, "attempt": 2, "claim_id": "c-1", "chat_id": -5})
    after = int(time.time() * 1000)
    line = cap.one()
    assert line["level"] == 30
    assert before - 1 <= line["time"] <= after + 1 and isinstance(line["time"], int)
    assert line["msg"] == "claimed it"
    assert line["pid"] == os.getpid()
    assert line["hostname"] == socket.gethostname()
    assert line["name"] == cap.logger.name
    assert (line["update_id"], line["attempt"], line["claim_id"], line["chat_id"]) == (7, 2, "c-1", -5)
    assert "logger" not in line


def test_app_name_and_logger_name(request: pytest.FixtureRequest) -> None:
    """With name= configured, ``name`` is the application and ``logger`` the logger that wrote the record."""
    capture = make_capture(request.node.name, name="mybot")
    capture.logger.info("hi")
    line = capture.one()
    assert line["name"] == "mybot"
    assert line["logger"] == capture.logger.name


def test_extra_colliding_with_core_key_is_renamed(cap: Capture) -> None:
    """An extra named like a core field is kept under a trailing-underscore key, not over the core field."""
    cap.logger.info("m", extra={"time": "noon", "level": "high", "pid": 1, "hostname": "x"})
    line = cap.one()
    assert line["level"] == 30 and isinstance(line["time"], int) and line["pid"] == os.getpid()
    assert (line["time_"], line["level_"], line["pid_"], line["hostname_"]) == ("noon", "high", 1, "x")


# -- exceptions ----------------------------------------------------------------------------------------


def _chain() -> KeyError:
    """Raise LookupError -> (context) ValueError -> (cause) KeyError for real and return the last one."""
    try:
        try:
            try:
                raise LookupError("root problem")
            except LookupError:
                raise ValueError("while handling")  # noqa: B904 - the implicit __context__ is the point
        except ValueError as middle:
            raise KeyError("top") from middle
    except KeyError as top:
        return top
    raise AssertionError("unreachable")


def test_exc_info_is_serialised_with_cause_and_context(cap: Capture) -> None:
    """exc_info goes under "err" with type, message, stack and a cause chain following __cause__ then __context__."""
    top = _chain()
    cap.logger.error("failed", exc_info=top)
    err = cap.one()["err"]
    assert err["type"] == "KeyError" and err["message"] == "'top'"
    assert "Traceback (most recent call last)" in err["stack"] and "KeyError: 'top'" in err["stack"]
    assert err["cause"]["type"] == "ValueError"  # __cause__
    assert err["cause"]["message"] == "while handling"
    assert err["cause"]["cause"]["type"] == "LookupError"  # __context__
    assert err["cause"]["cause"]["message"] == "root problem"
    assert "root problem" in err["cause"]["cause"]["stack"]
    assert err["cause"]["cause"]["cause"] is None


def test_exception_in_any_field_nested(cap: Capture) -> None:
    """An exception passed as an extra, or nested in dicts and lists, is serialised, never written as {}."""
    top = _chain()
    cap.logger.warning("m", extra={"error": top, "ctx": {"failures": [top, {"deep": ValueError("v")}]}})
    line = cap.one()
    for err in (line["error"], line["ctx"]["failures"][0], line["ctx"]["failures"][1]["deep"]):
        assert set(err) >= {"type", "message", "stack", "cause"}
        assert err["type"] in ("KeyError", "ValueError")
    assert line["ctx"]["failures"][0]["cause"]["cause"]["message"] == "root problem"
    assert line["ctx"]["failures"][1]["deep"]["message"] == "v"


def test_pino_err_extra_keeps_its_key_without_exc_info(cap: Capture) -> None:
    """extra={"err": exc} (pino's convention) is written under "err"; with exc_info too it moves to "err_"."""
    cap.logger.error("a", extra={"err": ValueError("given")})
    try:
        raise RuntimeError("raised")
    except RuntimeError:
        cap.logger.exception("b", extra={"err": ValueError("given")})
    first, second = cap.lines()
    assert first["err"]["message"] == "given"
    assert second["err"]["message"] == "raised" and second["err_"]["message"] == "given"


def test_cause_cycle_is_safe(cap: Capture) -> None:
    """A cycle in the cause chain ends in an entry marked cycle instead of looping."""
    try:
        try:
            raise ValueError("a")
        except ValueError as a_exc:
            first = a_exc
            raise KeyError("b") from a_exc
    except KeyError as b_exc:
        second = b_exc
    first.__cause__ = second  # a -> b -> a
    cap.logger.error("cycle", exc_info=second)
    err = cap.one()["err"]
    assert err["type"] == "KeyError"
    assert err["cause"]["type"] == "ValueError"
    assert err["cause"]["cause"]["type"] == "KeyError" and err["cause"]["cause"]["cycle"] is True
    assert err["cause"]["cause"]["cause"] is None


def test_cause_chain_depth_is_bounded(request: pytest.FixtureRequest) -> None:
    """A chain longer than max_cause_depth is cut with an entry marked truncated."""
    capture = make_capture(request.node.name, max_cause_depth=3)
    exc: BaseException = ValueError("0")
    for i in range(1, 20):
        nxt = ValueError(str(i))
        nxt.__cause__ = exc
        exc = nxt
    capture.logger.error("deep", extra={"e": exc})
    entry = capture.one()["e"]
    messages = []
    while entry is not None:
        messages.append(entry["message"])
        last = entry
        entry = entry["cause"]
    assert messages == ["19", "18", "17", "16", "15"]
    assert last["truncated"] is True


def test_raise_from_none_hides_context(cap: Capture) -> None:
    """``raise X from None`` writes no cause, as Python's own traceback does."""
    try:
        try:
            raise ValueError("hidden")
        except ValueError:
            raise KeyError("shown") from None
    except KeyError as exc:
        cap.logger.error("m", exc_info=exc)
    assert cap.one()["err"]["cause"] is None


def test_exception_attributes_kept(cap: Capture) -> None:
    """A TelegramError keeps its scalar attributes (error_code, method) next to type/message/stack."""
    err = Transient("gateway down", error_code=502, method="sendMessage")
    cap.logger.error("m", extra={"e": err})
    entry = cap.one()["e"]
    assert entry["type"] == "telegram_fence.errors.Transient"
    assert entry["error_code"] == 502 and entry["method"] == "sendMessage"
    assert entry["stack"].endswith("Transient: sendMessage: [502] gateway down")


def test_exception_whose_str_raises(cap: Capture) -> None:
    """An exception whose __str__ raises is still serialised with its type."""

    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    cap.logger.error("m", extra={"e": Nasty()})
    entry = cap.one()["e"]
    assert entry["type"].endswith("Nasty")
    assert "str() failed" in entry["message"]


# -- masking -------------------------------------------------------------------------------------------


def test_token_masked_everywhere(cap: Capture) -> None:
    """A bot token in the message, args, keys, nested extras and exception text never reaches the line."""
    try:
        raise RuntimeError(f"request to https://api.telegram.org/bot{TOKEN}/getUpdates failed")
    except RuntimeError as exc:
        cap.logger.error(
            "token %s leaked in %s",
            TOKEN,
            f"/bot{TOKEN}/getMe",
            exc_info=exc,
            extra={
                "url": f"https://x/bot{TOKEN}/sendMessage",
                "nested": {"list": [TOKEN, {"deeper": (TOKEN,)}], TOKEN: "as key"},
                "secret_field": "the password is hunter2-secret!",
                "pin": 99_999,
            },
        )
    raw = cap.raw()[0]
    assert SECRET_PART not in raw
    assert "hunter2-secret" not in raw
    line = json.loads(raw)
    assert "123456789:***" in line["msg"]
    assert line["nested"]["list"][0] == "123456789:***"
    assert "123456789:***" in line["nested"]
    assert line["secret_field"] == "the password is ***!"
    assert "bot123456789:***/getUpdates" in line["err"]["stack"]


def test_secret_number_masked(request: pytest.FixtureRequest) -> None:
    """A number whose digits contain a configured secret is written as "***"."""
    capture = make_capture(request.node.name, secrets=["424242"])
    capture.logger.info("m", extra={"pin": 424242, "other": 7, "f": 1424242.5})
    line = capture.one()
    assert (line["pin"], line["other"], line["f"]) == ("***", 7, "***")


def test_token_in_stack_source_line_masked(cap: Capture, tmp_path: Path) -> None:
    """A token that appears only in a traceback's source line (not the message) is masked in "stack"."""
    module_file = tmp_path / "leaky_module.py"
    module_file.write_text(f'def boom():\n    raise RuntimeError("plain")  # uses {TOKEN}\n')
    spec = importlib.util.spec_from_file_location("leaky_module", module_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.boom()
    except RuntimeError as exc:
        cap.logger.exception("boom", exc_info=exc)
    raw = cap.raw()[0]
    assert SECRET_PART not in raw
    assert "# uses 123456789:***" in json.loads(raw)["err"]["stack"]


def test_requests_error_from_unreachable_server_masked(cap: Capture) -> None:
    """telebot's real ConnectionError against a closed port (URL with the token inside) is logged masked."""
    port = closed_port()
    bot = telebot.TeleBot(TOKEN, threaded=False)
    with api_server(f"http://127.0.0.1:{port}/bot{{0}}/{{1}}"), pytest.raises(Transient) as info:
        call("getMe", bot.get_me)
    original = info.value.__cause__
    assert isinstance(original, requests.exceptions.ConnectionError)
    assert TOKEN in "".join(str(a) for a in original.args)  # the raw exception does carry the token
    cap.logger.error("getMe failed", exc_info=info.value, extra={"raw": original, "url": original.request.url})
    raw = cap.raw()[0]
    assert SECRET_PART not in raw
    line = json.loads(raw)
    assert line["err"]["type"] == "telegram_fence.errors.Transient"
    assert line["err"]["cause"]["type"] == "requests.exceptions.ConnectionError"
    assert "/bot123456789:***/getMe" in line["err"]["cause"]["message"]
    assert line["raw"]["type"] == "requests.exceptions.ConnectionError"
    assert line["url"].endswith("/bot123456789:***/getMe")


def test_requests_error_from_fake_server_masked(request: pytest.FixtureRequest) -> None:
    """A read timeout and an HTTP error from the fake Bot API server, with their URLs, are logged masked."""
    with FakeBotAPI() as api:
        token = api.token
        capture = make_capture(request.node.name)
        bot = telebot.TeleBot(token, threaded=False)
        api.delay("sendMessage", 3)
        with pytest.raises(requests.exceptions.ReadTimeout) as timeout_info:
            bot.send_message(1, "hi", timeout=1)
        api.fail("getMe", 502, html=True)
        with pytest.raises(telebot.apihelper.ApiHTTPException) as http_info:
            bot.get_me()
        timeout_exc, http_exc = timeout_info.value, http_info.value
        capture.logger.error(
            "send failed",
            exc_info=timeout_exc,
            extra={"url": timeout_exc.request.url, "http": http_exc, "http_url": http_exc.result.url},
        )
        api.stop(timeout=0.1)
    raw = capture.raw()[0]
    secret = token.split(":", 1)[1]
    assert token in timeout_exc.request.url and token in http_exc.result.url  # the inputs held it
    assert secret not in raw
    line = json.loads(raw)
    assert line["err"]["type"] == "requests.exceptions.ReadTimeout"
    assert f"/bot{api.bot_id}:***/sendMessage" in line["url"]
    assert line["http"]["type"] == "telebot.apihelper.ApiHTTPException"
    assert "502" in line["http"]["message"]


# -- values, caps and failures -------------------------------------------------------------------------


class BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr exploded")

    def __str__(self) -> str:
        raise RuntimeError("str exploded")


def test_unencodable_values_become_repr(cap: Capture) -> None:
    """Bytes, sets, objects, NaN, huge ints and non-string keys are written as JSON-safe text."""
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    cap.logger.info(
        "m",
        extra={
            "b": b"\x00bytes",
            "s": {3},
            "o": Path("/tmp/x"),
            "nan": float("nan"),
            "inf": float("-inf"),
            "big": 1 << 20000,
            "keys": {(1, 2): "tuple key", 5: "int key"},
            "cyclic": cyclic,
        },
    )
    line = cap.one()
    assert line["b"] == repr(b"\x00bytes")
    assert line["s"] == [3]
    assert line["o"] == repr(Path("/tmp/x"))
    assert (line["nan"], line["inf"]) == ("nan", "-inf")
    assert line["big"] == "<int of 20001 bits>"
    assert line["keys"] == {"(1, 2)": "tuple key", "5": "int key"}
    assert line["cyclic"][0] == 1 and line["cyclic"][1].startswith("<cycle")


def test_broken_repr_still_emits_a_line(cap: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    """An object whose __repr__ and __str__ raise, as a field and as the message, still yields a line."""
    quiet_pytest_log_capture(monkeypatch)
    cap.logger.info("m %s", "x", extra={"thing": BrokenRepr(), "nested": [BrokenRepr()]})
    cap.logger.warning(BrokenRepr())  # type: ignore[arg-type]
    first, second = cap.lines()
    assert first["thing"].startswith("<unrepresentable") and "BrokenRepr" in first["thing"]
    assert first["nested"][0].startswith("<unrepresentable")
    assert second["level"] == 40 and "unrepresentable" in second["msg"]


def test_bad_format_args_keep_the_message(cap: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A message whose %-args do not match is written with its raw text and args instead of failing."""
    quiet_pytest_log_capture(monkeypatch)
    cap.logger.info("needs two %s %s", "only-one")
    line = cap.one()
    assert "needs two %s %s" in line["msg"] and "only-one" in line["msg"]


class ExplodingMapping(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("no")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError(f"iteration exploded {TOKEN}")

    def __len__(self) -> int:
        return 1

    def items(self) -> Any:
        raise RuntimeError(f"items exploded {TOKEN}")


def test_formatter_failure_emits_fallback_line(cap: Capture) -> None:
    """When building the line fails unexpectedly, format() returns a masked fallback line instead of raising."""
    cap.logger.error("the message %s", TOKEN, extra={"weird": ExplodingMapping()})

    def add_bad_key(record: logging.LogRecord) -> bool:
        record.__dict__[5] = "non-string attribute key"  # type: ignore[index]
        return True

    cap.logger.addFilter(add_bad_key)
    try:
        cap.logger.warning("second")
    finally:
        cap.logger.removeFilter(add_bad_key)
    raw = cap.raw()
    assert len(raw) == 2 and all(SECRET_PART not in r for r in raw)
    first, second = (json.loads(r) for r in raw)
    assert first["level"] == 50 and first["msg"] == "the message %s" and "format_error" in first
    assert "items exploded 123456789:***" in first["format_error"]
    assert second["level"] == 40 and second["msg"] == "second" and "format_error" in second


def test_line_cap_keeps_valid_json(request: pytest.FixtureRequest) -> None:
    """Lines over max_line_bytes are shortened to fit, marked truncated, and stay valid JSON."""
    capture = make_capture(request.node.name, max_line_bytes=4096)
    capture.logger.info("big string", extra={"blob": "x" * 100_000, "small": 1})
    capture.logger.info("many fields", extra={f"f{i}": "y" * 50 for i in range(2000)})
    capture.logger.info("multibyte", extra={"blob": "щ" * 10_000})
    capture.logger.info("huge message " + "z" * 50_000)
    try:
        raise ValueError("e" * 30_000)
    except ValueError:
        capture.logger.exception("huge exception")
    capture.logger.info("fits", extra={"small": 1})
    raw = capture.raw()
    assert len(raw) == 6
    for text in raw:
        assert len(text.encode("utf-8")) <= 4096
        json.loads(text)
    lines = capture.lines()
    assert all(line.get("truncated") is True for line in lines[:5])
    assert "truncated" not in lines[5]
    assert lines[0]["small"] == 1 and lines[0]["msg"] == "big string"
    assert lines[0]["blob"].startswith("xxx") and "chars cut" in lines[0]["blob"]
    assert lines[4]["err"]["type"] == "ValueError" and lines[4]["level"] == 50


def test_cut_never_reveals_part_of_a_token(request: pytest.FixtureRequest) -> None:
    """Shortening a long string that contains tokens happens after masking, so no token fragment remains."""
    capture = make_capture(request.node.name, max_line_bytes=2048)
    capture.logger.info("m", extra={"blob": ("a" * 997 + f"/bot{TOKEN}/x ") * 50})
    raw = capture.raw()[0]
    assert SECRET_PART[:10] not in raw


def test_lone_surrogate_gives_valid_utf8_line(cap: Capture) -> None:
    """A string with a lone surrogate (undecodable file name) still gives a line any UTF-8 stream can write."""
    cap.logger.info("file \udcff name", extra={"emoji": "ok ✓"})
    raw = cap.raw()[0]
    raw.encode("utf-8")
    line = json.loads(raw)
    assert line["msg"] == "file \udcff name" and line["emoji"] == "ok ✓"


def test_bad_settings_refused() -> None:
    """Bad formatter settings raise ConfigurationError naming the setting."""
    with pytest.raises(ConfigurationError, match="max_line_bytes"):
        JsonFormatter(max_line_bytes=100)
    with pytest.raises(ConfigurationError, match="secrets"):
        JsonFormatter(secrets="one-string")
    with pytest.raises(ConfigurationError, match="max_cause_depth"):
        JsonFormatter(max_cause_depth=0)
    with pytest.raises(ConfigurationError, match="level"):
        configure_logging(io.StringIO(), level="loud", logger="test_jsonlog.bad")


# -- handler and setup ---------------------------------------------------------------------------------


class ChoppyStream(io.TextIOBase):
    """A stream that stores each write in small pieces and lets other threads run in between."""

    def __init__(self) -> None:
        self.pieces: list[str] = []

    def write(self, text: str) -> int:
        for start in range(0, len(text), 7):
            self.pieces.append(text[start : start + 7])
            time.sleep(0)  # yield the GIL mid-write, as a slow pipe would
        return len(text)

    def text(self) -> str:
        return "".join(self.pieces)


def test_concurrent_threads_write_whole_lines(request: pytest.FixtureRequest) -> None:
    """Eight threads logging (and calling handle directly) through one handler produce only whole JSON lines."""
    stream = ChoppyStream()
    handler = JsonLineHandler(stream, JsonFormatter())  # type: ignore[arg-type]
    logger = logging.getLogger(f"test_jsonlog.{request.node.name}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    start = threading.Barrier(8)

    def work(n: int) -> None:
        start.wait()
        for i in range(60):
            if i % 2:
                logger.info("line", extra={"writer": n, "i": i, "pad": "p" * (i * 13)})
            else:
                handler.handle(
                    logger.makeRecord(logger.name, logging.INFO, "f", 1, "direct", (), None, extra={"writer": n})
                )

    threads = [threading.Thread(target=work, args=(n,), name=f"log-writer-{n}") for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = stream.text().splitlines()
    assert len(lines) == 8 * 60
    parsed = [json.loads(line) for line in lines]
    assert sorted({p["writer"] for p in parsed}) == list(range(8))


def test_concurrent_threads_to_a_file(tmp_path: Path) -> None:
    """Threads writing to a real file through configure_logging leave one JSON object per line."""
    path = tmp_path / "log.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        handler = configure_logging(fh, "info", logger="test_jsonlog.file")
        logger = logging.getLogger("test_jsonlog.file")
        logger.propagate = False

        def work(n: int) -> None:
            for i in range(200):
                logger.info("x", extra={"n": n, "i": i, "pad": "q" * (i * 37)})

        threads = [threading.Thread(target=work, args=(n,), name=f"file-writer-{n}") for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        logger.removeHandler(handler)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1200
    assert all(json.loads(line)["msg"] == "x" for line in lines)


def test_configure_logging_replaces_its_own_handler() -> None:
    """Calling configure_logging twice leaves one JSON handler, with the new level, secrets and stream."""
    name = "test_jsonlog.configure"
    other = logging.NullHandler()
    logging.getLogger(name).addHandler(other)
    first, second = io.StringIO(), io.StringIO()
    configure_logging(first, "debug", logger=name)
    handler = configure_logging(second, "WARN", secrets=["s3cr3t"], name="app", logger=name)
    logger = logging.getLogger(name)
    logger.propagate = False
    try:
        assert [h for h in logger.handlers if isinstance(h, JsonLineHandler)] == [handler]
        assert other in logger.handlers  # not ours: left alone without force
        logger.info("dropped by level")
        logger.warning("kept s3cr3t")
        assert first.getvalue() == ""
        line = json.loads(second.getvalue())
        assert line["msg"] == "kept ***" and line["name"] == "app" and line["level"] == 40
        configure_logging(io.StringIO(), "trace", logger=name, force=True)
        assert len(logger.handlers) == 1 and logger.level == 5
    finally:
        logger.handlers.clear()


def test_configure_logging_defaults_to_root_and_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a logger or stream, configure_logging installs on the root logger and writes to sys.stderr."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        handler = configure_logging(secrets=["abc-secret-1"])
        assert handler in root.handlers and handler.stream is sys.stderr
        logging.getLogger("telegram_fence.anything").info("hello abc-secret-1")
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert json.loads(err)["msg"] == "hello ***"
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_write_failure_is_counted_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    """A handler whose stream is closed counts the failure and prints a masked notice, never the record."""
    stream = io.StringIO()
    handler = JsonLineHandler(stream)
    logger = logging.getLogger("test_jsonlog.closed")
    logger.handlers[:] = [handler]
    logger.propagate = False
    stream.close()
    try:
        logger.error("secret %s", TOKEN)
        logger.error("again")
    finally:
        logger.handlers.clear()
    assert handler.write_errors == 2
    err = capsys.readouterr().err
    assert "could not be written" in err and SECRET_PART not in err and "again" not in err


def test_public_names() -> None:
    """The module exports exactly its documented public names."""
    assert sorted(jsonlog.__all__) == ["JsonFormatter", "JsonLineHandler", "configure_logging", "pino_level"]
