"""Bad input to any command is one clear line on stderr and exit 2; a closed pipe ends a command quietly."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from telegram_fence.cli.main import main
from telegram_fence.store.sqlite import SqliteUpdateStore


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "telegram_fence", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "bot.db"
    SqliteUpdateStore(path).close()
    return str(path)


BAD_INPUT = [
    [],
    ["bogus"],
    ["status"],
    ["status", "{db}", "--max-progress-age", "-5"],
    ["updates", "{db}", "--limit", "0"],
    ["updates", "{db}", "--state", "weird"],
    ["updates", "{db}", "--chat", "x"],
    ["show", "{db}", "abc"],
    ["show", "{db}", "-1"],
    ["retry", "{db}"],
    ["retry", "{db}", "x"],
    ["prune", "{db}"],
    ["prune", "{db}", "--older-than", "-1d"],
    ["prune", "{db}", "--older-than", "soon"],
    ["exhaustions", "{db}", "--ack", "12"],
    ["outbox", "{db}", "--failed", "-1"],
    ["demo", "--updates", "0"],
    ["demo", "--kills", "-1"],
    ["broadcast", "run", "news", "--rate", "0", "--dir", "{dir}"],
    ["broadcast", "run", "news", "--api-url", "nonsense", "--dir", "{dir}"],
    ["broadcast", "status", "news", "--dir", "{db}"],
    ["broadcast", "run", "news", "--dir", "{db}"],
    ["broadcast", "create", "news", "--audience", "{db}", "--text", "hi", "--dir", "{db}"],
    ["broadcast", "create", "../up", "--audience", "{db}", "--text", "hi", "--dir", "{dir}"],
    ["broadcast", "status", "missing", "--dir", "{dir}"],
]


@pytest.mark.parametrize("argv", BAD_INPUT, ids=[" ".join(a) or "(nothing)" for a in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command refuses with exactly one line on stderr (no traceback, no usage dump) and status 2."""
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:not-a-real-token")  # broadcast run checks its input after the token
    args = [a.format(db=db, dir=tmp_path / "broadcasts") for a in argv]
    try:
        code = main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in out + err


@pytest.mark.parametrize(("argv", "line"), [
    (["--bogus"], "telegram-fence: unrecognized arguments: --bogus (see telegram-fence --help)"),
    (["--bogus", "status", "{db}"], "telegram-fence: unrecognized arguments: --bogus (see telegram-fence --help)"),
    (["status", "{db}", "--bogus"],
     "telegram-fence status: unrecognized arguments: --bogus (see telegram-fence status --help)"),
    (["status", "{db}", "extra"],
     "telegram-fence status: unrecognized arguments: extra (see telegram-fence status --help)"),
    (["broadcast", "run", "news", "--bogus"],
     "telegram-fence broadcast run: unrecognized arguments: --bogus (see telegram-fence broadcast run --help)"),
    (["webhook", "info", "extra"],
     "telegram-fence webhook info: unrecognized arguments: extra (see telegram-fence webhook info --help)"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_an_unknown_word_names_itself_and_the_help_of_the_command_it_was_given_to(
    db: str, argv: list[str], line: str
) -> None:
    """A word no parser takes is named, with the ``--help`` of the (sub)command it was given to (not "the
    following arguments are required: command" for an unknown option, not the top command's help for a
    subcommand's): a real process, exit 2, that one line."""
    result = cli(*[a.format(db=db) for a in argv])
    assert (result.returncode, result.stderr, result.stdout) == (2, line + "\n", "")


def test_an_abbreviated_option_still_works(db: str) -> None:
    """argparse's prefixes of long options (``--vers``, ``--js``) are still taken, before and after a subcommand."""
    assert cli("--vers").stdout.startswith("telegram_fence ")
    result = cli("status", db, "--js")
    assert result.returncode == 0 and result.stdout.lstrip().startswith("{"), result


def test_broadcast_status_with_a_file_as_dir_in_a_real_process(db: str) -> None:
    """`broadcast status NAME --dir FILE` names the problem instead of a NotADirectoryError traceback."""
    result = cli("broadcast", "status", "news", "--dir", db)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"telegram-fence: --dir {db!r} is not a directory; "
                                     "pass the directory that holds the broadcasts")


def test_demo_refuses_nonsense_counts_at_once_in_a_real_process() -> None:
    """`demo --kills -1` and `demo --updates 0` exit 2 with one line, without starting anything."""
    started = time.monotonic()
    for args, name in ((["--kills", "-1"], "--kills"), (["--updates", "0"], "--updates")):
        result = cli("demo", *args)
        assert result.returncode == 2 and name in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert time.monotonic() - started < 50  # refused, not run (the drill's own timeout is 120 s)


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`telegram-fence updates DB | head -1`: no BrokenPipeError traceback, status 141 like a SIGPIPE."""
    path = tmp_path / "big.db"
    with SqliteUpdateStore(path) as store:
        store.record([{"update_id": i, "message": {"message_id": i, "date": 0, "text": "x" * 50,
                                                   "chat": {"id": i % 7, "type": "private"}}} for i in range(3000)],
                     3000)
    result = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m telegram_fence updates "{path}" --limit 3000 | head -1; '
                       'echo "status ${PIPESTATUS[0]}" >&2'],
        capture_output=True, text=True, timeout=60,
    )
    assert len(result.stdout.splitlines()) == 1
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
    assert result.stderr.strip().endswith("status 141"), result.stderr


def test_the_help_of_a_sqlite_only_command_does_not_speak_of_postgresql() -> None:
    """``outbox`` takes a SQLite file only: its ``--help`` names no PostgreSQL server in its ``--timeout``; a
    command that takes a connection string (``status``, ``updates``, ``show``) does."""
    from telegram_fence.cli.main import build_parser

    parser = build_parser()
    choices = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    timeout = next(a for a in choices["outbox"]._actions if "--timeout" in a.option_strings)
    assert "PostgreSQL" not in (timeout.help or "")
    for name in ("status", "updates", "show"):
        timeout = next(a for a in choices[name]._actions if "--timeout" in a.option_strings)
        assert "PostgreSQL" in (timeout.help or ""), name


def test_every_argument_of_every_command_has_a_help_text() -> None:
    """``telegram-fence CMD --help`` explains each of its arguments (an option or positional shown bare, such as
    ``schema``'s lowercase ``db`` once, tells a newcomer nothing)."""
    from telegram_fence.cli.main import build_parser

    bare = []
    todo: list[tuple[str, argparse.ArgumentParser]] = [("telegram-fence", build_parser())]
    while todo:
        name, parser = todo.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
            elif not (action.help or "").strip() and action.dest != "help":
                bare.append(f"{name} {action.option_strings or action.metavar or action.dest}")
    assert bare == [], bare
