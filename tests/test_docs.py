"""Docs that run: every ```python block of README.md and docs/*.md, and every example, runs against FakeBotAPI.

A block runs as a program of its own (in a child process, in a fresh directory) with
``TELEGRAM_BOT_TOKEN``, ``TELEGRAM_BOT_DIR`` (a local Bot API server's directory for the bot),
``COLLECTOR_URL``, ``OPERATOR_CHAT_ID``, and for webhooks ``WEBHOOK_URL`` (a free loopback port the fake
delivers to), ``WEBHOOK_SECRET`` and ``PORT`` set, and telebot pointed at the fake server. The fake holds
three messages for chat 42: ``/start``, ``hello`` and a document. A block that serves (it calls
``.run()`` of a fence) is stopped with SIGTERM once its replies stopped coming; every block must exit
0 and log nothing at WARNING or above. A block that is a fragment by design is preceded in the
markdown by ``<!-- not-run: reason -->`` and listed in :data:`NOT_RUN`.
"""

from __future__ import annotations

import argparse
import ast
import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import serve_files

import telegram_fence
from telegram_fence.store import schema
from telegram_fence.testing import FakeBotAPI, ReadinessSocket

ROOT = Path(__file__).resolve().parent.parent
RUNNER = str(Path(__file__).with_name("docs_runner.py"))
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

#: Blocks that are fragments by design: (file, index of the python block in it) -> why.
NOT_RUN = {
    ("docs/testing.md", 2): "uses the pytest fixtures",
    ("docs/testing.md", 3): "needs your own store class",
    ("docs/webhook.md", 1): "a module gunicorn imports (tests/test_docs_servers.py runs it under gunicorn)",
    ("docs/webhook.md", 2): "a gunicorn configuration file (tests/test_docs_servers.py runs it)",
    ("docs/webhook.md", 3): "serves with waitress until stopped (tests/test_docs_servers.py runs it)",
}

#: A text some blocks must have sent (proof that they did their job, not only that they exited cleanly).
EXPECT_SENT = {
    "README.md#1": "hello",
    "README.md#2": "noted",
    "docs/calls.md#1": "saved",
    "docs/broadcast.md#0": "Version 1.2 is out: /changes tells what is new.",
    "docs/operator.md#0": "deploy 1.2 started",
    "docs/files.md#0": "report.txt: 12 bytes",
    "docs/outbox.md#0": "received",
    "docs/webhook.md#0": "hello",
    "docs/states.md#0": "Nice to meet you, hello",
    "docs/operations.md#1": "hello from any host",
    "docs/operations.md#2": "noted on PostgreSQL",
    "docs/steps.md#0": "you said 'hello'",
    "docs/steps.md#1": "paid 500 cents",
    "docs/steps.md#2": "You asked about hello. Here is a long answer, word by word.",
}

_BLOCK = re.compile(r"(?:<!--\s*not-run:\s*(?P<reason>.*?)\s*-->\s*\n)?```python\n(?P<code>.*?)```", re.S)
# A call that blocks until a signal: fence.run(), Fence(...).run(), sys.exit(fence.run())
_SERVES = re.compile(r"\.run\(\)\)?\s*(#.*)?$|\.run_webhook\(", re.M)
_BAD_LEVELS = ("WARNING", "ERROR", "CRITICAL", "Traceback", '"level":40', '"level":50', '"level":60')


@dataclass(frozen=True)
class Snippet:
    where: str
    index: int
    code: str
    not_run: str | None

    @property
    def id(self) -> str:
        return f"{self.where}#{self.index}"


def snippets() -> list[Snippet]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for index, match in enumerate(_BLOCK.finditer(text)):
            found.append(Snippet(str(path.relative_to(ROOT)), index, match["code"], match["reason"]))
    return found


class _Collector(http.server.BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self) -> None:
        self.received.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, name="test-collector", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/captures"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def _postgres_schema(program: Path) -> Iterator[dict[str, str]]:
    """For a program that reads ``DATABASE_URL``: a fresh PostgreSQL schema it works in, dropped afterwards.

    Skips the test (with the reason) when ``TELEGRAM_FENCE_PG_DSN`` names no server.
    """
    if "DATABASE_URL" not in program.read_text(encoding="utf-8"):
        yield {}
        return
    dsn = os.environ.get("TELEGRAM_FENCE_PG_DSN")
    if not dsn:
        pytest.skip("TELEGRAM_FENCE_PG_DSN is not set: no PostgreSQL server for this snippet")
    import psycopg
    from psycopg.conninfo import make_conninfo

    schema_name = f"docs_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema_name}")
    try:
        yield {"DATABASE_URL": make_conninfo(dsn, options=f"-c search_path={schema_name}")}
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema_name} CASCADE")


def _run(program: Path, tmp_path: Path, collector: str, expect: str | None = None) -> tuple[int, str, FakeBotAPI]:
    """Run ``program`` against a fresh fake with the three messages queued; return (exit code, stderr, fake).

    A program that serves is stopped once its replies stopped coming: with ``expect`` (a text it must send), once
    that text was sent and the fake then saw no call for half a second; without, after a second of no call."""
    with _postgres_schema(program) as extra:
        return _run_with(program, tmp_path, collector, extra, expect)


def _run_with(program: Path, tmp_path: Path, collector: str, extra: dict[str, str],
              expect: str | None) -> tuple[int, str, FakeBotAPI]:
    bot_dir = tmp_path / "bot-api"
    workdir = tmp_path / "work"
    workdir.mkdir()
    with FakeBotAPI() as api, ReadinessSocket() as ready:
        file_id = "FAKE-FILE-1"
        (bot_dir / "documents").mkdir(parents=True)
        (bot_dir / "documents" / "file_0.txt").write_bytes(b"twelve bytes")
        serve_files(api, {file_id: bot_dir / "documents" / "file_0.txt"})
        api.push_message(42, "/start")
        api.push_message(42, "hello")
        api.push_message(42, "report.txt", document={"file_id": file_id, "file_unique_id": "U1",
                                                     "file_name": "report.txt", "file_size": 12})
        port = _free_port()
        env = ready.env(WEBHOOK_URL=f"http://127.0.0.1:{port}/telegram/hook", WEBHOOK_SECRET="docs-secret",
                        PORT=str(port), TELEGRAM_BOT_TOKEN=api.token, TELEGRAM_API_URL=api.api_url,
                        TELEGRAM_FILE_URL=api.file_url, TELEGRAM_BOT_DIR=str(bot_dir), COLLECTOR_URL=collector,
                        OPERATOR_CHAT_ID="99", **extra,
                        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        child = subprocess.Popen([sys.executable, RUNNER, str(program)], cwd=workdir, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            if _SERVES.search(program.read_text(encoding="utf-8")):
                if expect is None:
                    api.wait_for(lambda: bool(api.sent) or child.poll() is not None, timeout=30)
                else:
                    api.wait_for(lambda: expect in [m.text for m in api.sent] or child.poll() is not None, timeout=30)
                if child.poll() is None:
                    _quiet(api, 1.0 if expect is None else 0.5)
                    # a SIGTERM before the fence's handlers are in place would kill it (exit -15)
                    ready.wait_ready(child, timeout=30)
                    child.send_signal(signal.SIGTERM)
            _, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        return child.returncode, err, api


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _quiet(api: FakeBotAPI, for_seconds: float = 1.0) -> None:
    """Wait until the fake saw no new call for ``for_seconds`` (the bot answered what it was going to)."""
    pause = threading.Event()
    seen = -1
    for _ in range(60):
        count = len(api.calls)
        if count == seen:
            return
        seen = count
        pause.wait(for_seconds)


def _check(code: int, err: str) -> None:
    assert code == 0, f"exit code {code}; stderr:\n{err}"
    bad = [line for line in err.splitlines() if any(level in line for level in _BAD_LEVELS)]
    assert not bad, "logged at WARNING or above:\n" + "\n".join(bad[:20])


@pytest.mark.parametrize("snippet", [s for s in snippets() if s.not_run is None], ids=lambda s: s.id)
def test_snippet_runs(snippet: Snippet, tmp_path: Path, collector: str) -> None:
    """A python block of the docs runs as written against the fake server: exit 0, no warning."""
    program = tmp_path / "snippet.py"
    program.write_text(snippet.code, encoding="utf-8")
    received = len(_Collector.received)
    code, err, api = _run(program, tmp_path, collector, EXPECT_SENT.get(snippet.id))
    _check(code, err)
    if snippet.id in EXPECT_SENT:
        assert EXPECT_SENT[snippet.id] in [m.text for m in api.sent], [m.text for m in api.sent]
    if "Outbox(" in snippet.code:
        assert len(_Collector.received) > received, "no capture reached the collector"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(example: Path, tmp_path: Path, collector: str) -> None:
    """An example program answers the fake's messages and stops cleanly on SIGTERM."""
    code, err, api = _run(example, tmp_path, collector)
    _check(code, err)
    assert api.sent_to(42), "the example sent nothing to the chat"


def test_not_run_blocks_are_the_listed_ones() -> None:
    """Every block marked not-run is listed in NOT_RUN (and nothing else is), so the list stays short and true."""
    marked = {(s.where, s.index): s.not_run for s in snippets() if s.not_run is not None}
    assert set(marked) == set(NOT_RUN)
    assert set(EXPECT_SENT) <= {s.id for s in snippets()}
    assert len(snippets()) >= 10


def test_api_page_names_every_public_name() -> None:
    """docs/api.md has a section for every name of telegram_fence.__all__."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    missing = [name for name in telegram_fence.__all__ if f"### `{name}" not in text]
    assert not missing, f"docs/api.md lacks {missing}"


def test_stated_schema_version_is_the_code_s() -> None:
    """Every 'schema version N' the docs state is the schema version the code writes."""
    for path in DOCS:
        # "schema version N is newer/older than …" quotes the refusal of another version: not a statement
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"schema version\D{0,20}(\d+)(?! is (?:newer|older))", text):
            assert int(match[1]) == schema.LATEST, f"{path.name} states schema version {match[1]}"
    architecture = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = architecture[architecture.index("## Schema"):]
    versions = [int(v) for v in re.findall(r"^\| (\d+) \|", table, re.M)]
    assert versions == list(range(1, schema.LATEST + 1)), "docs/architecture.md's schema table is not the code's"


def test_stated_conformance_rule_count_is_the_suite_s() -> None:
    """docs/testing.md states the number of conformance rules the suite has."""
    from telegram_fence.testing import conformance

    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    stated = re.search(r"\((\d+) of them", text)
    assert stated is not None and int(stated[1]) == len(conformance.RULES)


def test_no_snippet_or_example_builds_its_bot_with_threaded_false() -> None:
    """The docs and examples build bots as telebot does by default (``TeleBot(token)``): the fence takes a threaded
    bot, so a ``threaded=False`` in them would read as a step of the move that is not needed."""
    found = [s.id for s in snippets() if "threaded=False" in s.code]
    found += [p.name for p in EXAMPLES if "threaded=False" in p.read_text(encoding="utf-8")]
    assert found == [], f"threaded=False in {found}"


def _command_lines() -> list[tuple[str, str]]:
    """Every ``telegram-fence …`` the docs show: the lines of code blocks (with their indented continuation lines)
    and inline code, each as (file, the line without its ``# comment``)."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for block in re.finditer(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M):
            for match in re.finditer(r"^telegram-fence .*(?:\n[ \t]+\S.*)*", block[1], re.M):
                found.append((path.name, match[0]))
        found += [(path.name, m[1]) for m in re.finditer(r"`(telegram-fence [^`\n]*)`", text)]
    return [(where, re.sub(r"(?m)\s+#.*$", "", line)) for where, line in found]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def _resolve(line: str) -> list[tuple[list[str], argparse.ArgumentParser, str]]:
    """The (sub)command(s) a documented line names, each with its parser and the rest of the line; a word where a
    subcommand must be that names none raises AssertionError. ``create|run|status`` stands for each of them."""
    from telegram_fence.cli.main import build_parser

    todo: list[tuple[list[str], argparse.ArgumentParser, list[str]]] = [([], build_parser(), line.split()[1:])]
    done = []
    while todo:
        chain, parser, words = todo.pop()
        choices = _subparsers(parser)
        if not choices or not words or words[0].startswith("-"):
            done.append((chain, parser, " ".join(words)))
            continue
        for word in words[0].replace("\\|", "|").split("|"):
            assert word in choices, f"no subcommand {' '.join(['telegram-fence', *chain, word])!r}"
            todo.append(([*chain, word], choices[word], words[1:]))
    return done


def test_every_documented_command_line_names_real_subcommands_and_options() -> None:
    """Each ``telegram-fence …`` of the docs (code blocks and inline code) names subcommands the parser has, and only
    options that subcommand takes: a renamed or removed option cannot stay in the docs."""
    lines = _command_lines()
    assert len(lines) > 30
    wrong = []
    for where, line in lines:
        try:
            resolved = _resolve(line)
        except AssertionError as exc:
            wrong.append(f"{where}: {line}: {exc}")
            continue
        for chain, parser, rest in resolved:
            unknown = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest)) - _options(parser)
            if unknown:
                wrong.append(f"{where}: {line}: telegram-fence {' '.join(chain)} has no {sorted(unknown)}")
    assert not wrong, "\n".join(wrong)


def test_the_command_line_synopsis_lists_every_subcommand_and_option() -> None:
    """docs/operations.md's synopsis of the command line has a line for every subcommand, and every option of it."""
    from telegram_fence.cli.main import build_parser

    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text[text.index("## Command line"):]
    synopsis = section[section.index("```\n") + 4:section.index("\n```", section.index("```\n") + 4)]
    documented: dict[tuple[str, ...], set[str]] = {}
    for match in re.finditer(r"^telegram-fence .*(?:\n[ \t]+\S.*)*", synopsis, re.M):
        line = re.sub(r"(?m)\s+#.*$", "", match[0])
        for chain, _, rest in _resolve(line):
            documented.setdefault(tuple(chain), set()).update(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest))
    missing = []
    todo: list[tuple[tuple[str, ...], argparse.ArgumentParser]] = [((), build_parser())]
    while todo:
        chain, parser = todo.pop()
        choices = _subparsers(parser)
        if choices:
            todo += [((*chain, name), sub) for name, sub in choices.items()]
        elif chain not in documented:
            missing.append(f"no line for telegram-fence {' '.join(chain)}")
        elif _options(parser) - documented[chain]:
            missing.append(f"telegram-fence {' '.join(chain)}: {sorted(_options(parser) - documented[chain])}")
    assert not missing, "\n".join(missing)


def _mypy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """mypy (of the test extras) in a child process that imports this checkout's telegram_fence."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull,
                           "--no-error-summary", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_snippets_and_examples_type_check(tmp_path: Path) -> None:
    """Every block that runs, and every example, passes mypy (``--check-untyped-defs``) against the package's own
    annotations (py.typed): a name the docs use that the types do not have (``fence.store.write()`` once was:
    ``Fence.store`` was typed as the protocol) is a failure here, not in a user's editor."""
    for snippet in snippets():
        if snippet.not_run is None:
            (tmp_path / f"{Path(snippet.where).stem}_{snippet.index}.py").write_text(snippet.code, encoding="utf-8")
    for example in EXAMPLES:
        (tmp_path / f"example_{example.name}").write_text(example.read_text(encoding="utf-8"), encoding="utf-8")
    result = _mypy("--check-untyped-defs", "--ignore-missing-imports", ".", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


_TYPED_USER = """
import os
import sys

import telebot
from telebot.types import Update

from telegram_fence import AttemptContext, Fence, SqliteUpdateStore, configure_logging, queue_calls, uncertain_calls
from telegram_fence.testing import FakeBotAPI

configure_logging(level="INFO")
bot = telebot.TeleBot(os.environ.get("TELEGRAM_BOT_TOKEN", "1:x"))
fence = Fence(bot, "bot.db", workers=2)
with fence.store.write() as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS notes(update_id INTEGER PRIMARY KEY, text TEXT)")
mine: Fence[SqliteUpdateStore] = Fence(bot, SqliteUpdateStore("other.db"))


@fence.attempt_handler
def take_note(update: Update, ctx: AttemptContext) -> None:
    if update.message is None:
        return
    with ctx.transaction(complete=True) as conn:
        conn.execute("INSERT INTO notes VALUES (?, ?)", (update.update_id, update.message.text))
        with queue_calls():
            bot.send_message(update.message.chat.id, "noted")
    for call in uncertain_calls():
        print(call.method, call.chat_id)


def check(api: FakeBotAPI) -> bool:
    api.push_message(42, "hello")
    return api.wait_sent(1) and api.sent_to(42)[0].text == "hello"


def stop_on(other: Fence) -> int:
    other.stop()
    return 0 if other.join(5) else 1


sys.exit(fence.run() or stop_on(mine))
"""


def test_a_typed_user_script_passes_mypy_strict(tmp_path: Path) -> None:
    """A small script using the public API as the README does, annotated, passes ``mypy --strict``: the package's
    names are all typed (no ``Any`` leaks into a strict user's code, no missing attribute)."""
    (tmp_path / "bot.py").write_text(_TYPED_USER, encoding="utf-8")
    result = _mypy("--strict", "bot.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_mistyped_or_misused_name_of_the_package_is_a_type_error(tmp_path: Path) -> None:
    """The lazily imported names (``telegram_fence``'s, ``telegram_fence.store``'s, ``store.postgres``') are seen by
    a type checker as their classes, and a name the package does not have is an error, not ``Any`` (a module
    ``__getattr__`` visible to mypy made every name ``Any``: a typo in an import passed)."""
    (tmp_path / "typos.py").write_text(
        "import telegram_fence\n"
        "from telegram_fence import Fense\n"
        "from telegram_fence.store import SqliteUpdateStore\n"
        "from telegram_fence.store.postgres import PostgresUpdateStore\n"
        "telegram_fence.Outbx\n"
        "a: int = SqliteUpdateStore('x.db')\n"
        "b: int = PostgresUpdateStore('dbname=x')\n"
        "c: int = telegram_fence.Fence\n", encoding="utf-8")
    result = _mypy("--strict", "typos.py", cwd=tmp_path)
    lines = sorted(line.split(": error: ")[0] for line in result.stdout.splitlines() if ": error: " in line)
    assert lines == [f"typos.py:{n}" for n in (2, 5, 6, 7, 8)], result.stdout + result.stderr


def _api_objects() -> dict[str, Any]:
    """Every name docs/api.md documents: those of ``telegram_fence.__all__`` and those it imports from a module of
    their own (a ```from MODULE import NAME``` line under the name's heading)."""
    import importlib

    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    found: dict[str, Any] = {name: getattr(telegram_fence, name) for name in telegram_fence.__all__}
    for module, name in re.findall(r"^`from ([\w.]+) import (\w+)`$", text, re.M):
        found[name] = getattr(importlib.import_module(module), name)
    return found


def _documented_signatures() -> list[tuple[str, ast.arguments]]:
    """docs/api.md's signatures: each ```text block whose first statement is ``Name(...)`` for a documented name,
    parsed as the parameters of a ``def``."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    documented = _api_objects()
    found = []
    for block in re.findall(r"```text\n(.*?)```", text, re.S):
        match = re.match(r"(\w+)(\(.*?\))(?:\s*->[^\n]*)?(?:[ \t]*#[^\n]*)?(?:\n(?!\s)|$)", block, re.S)
        if match is None or match[1] not in documented:
            continue
        tree = ast.parse(f"def f{' '.join(match[2].split())}: pass")
        function = tree.body[0]
        assert isinstance(function, ast.FunctionDef)
        found.append((match[1], function.args))
    return found


def test_api_page_signatures_are_the_code_s() -> None:
    """Every signature docs/api.md shows has the code's parameters, in order, positional or keyword-only as in the
    code, with the code's defaults where the page gives a literal one (a parameter added or renamed in the code
    and not on the page, or a default changed, fails here)."""
    import inspect

    signatures = _documented_signatures()
    objects = _api_objects()
    assert len(signatures) >= 15
    wrong = []
    for name, args in signatures:
        real = [p for p in inspect.signature(objects[name]).parameters.values()
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        shown = [(a.arg, "positional") for a in args.posonlyargs + args.args] + \
            [(a.arg, "keyword") for a in args.kwonlyargs]
        code = [(p.name, "keyword" if p.kind is p.KEYWORD_ONLY else "positional") for p in real]
        if shown != code:
            wrong.append(f"{name}: the page shows {shown}, the code has {code}")
            continue
        defaults = dict(zip([a.arg for a in args.args][len(args.args) - len(args.defaults):], args.defaults,
                            strict=True))
        defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
        for parameter in real:
            if parameter.name in defaults:
                try:
                    value = ast.literal_eval(defaults[parameter.name])
                except ValueError:
                    continue  # a name such as time.time: not compared
                if value != parameter.default:
                    wrong.append(f"{name}({parameter.name}=...): the page says {value!r}, the code "
                                 f"{parameter.default!r}")
    assert not wrong, "\n".join(wrong)
