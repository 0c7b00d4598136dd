"""Tests for telegram_fence.files.LocalFiles with real files, directories and symlinks in tmp_path."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import telebot
from helpers import serve_files

from telegram_fence import files as files_module
from telegram_fence.errors import ConfigurationError, FileAccessRefused, MessageRefused
from telegram_fence.files import DirectoryCheck, LocalFiles
from telegram_fence.testing import FakeBotAPI

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawq"


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """A server directory with a bot directory (named after the token), a file in it, and a file outside."""
    server = tmp_path / "server"
    bot_dir = server / TOKEN
    (bot_dir / "documents").mkdir(parents=True)
    inside = bot_dir / "documents" / "file_1.pdf"
    inside.write_bytes(b"inside")
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"outside")
    other_bot = server / "987654321:ZZHdqTcvCH1vGWJxfSeofSAs0K5PALDsawq"
    other_bot.mkdir()
    (other_bot / "theirs.txt").write_bytes(b"other bot")
    return {"server": server, "bot": bot_dir, "inside": inside, "outside": outside, "other": other_bot}


# -- resolve -------------------------------------------------------------------------------------------


def test_absolute_path_inside_is_accepted(layout: dict[str, Path]) -> None:
    """An absolute file_path inside the bot directory resolves to that file's real path."""
    files = LocalFiles(layout["bot"])
    assert files.resolve(str(layout["inside"])) == layout["inside"].resolve()


def test_relative_path_is_resolved_against_the_bot_directory(layout: dict[str, Path]) -> None:
    """A relative file_path is taken relative to the bot directory."""
    files = LocalFiles(str(layout["bot"]))
    assert files.resolve("documents/file_1.pdf") == layout["inside"].resolve()


@pytest.mark.parametrize(
    ("file_path", "reason"),
    [
        ("../secret.txt", "'..'"),
        ("documents/../../secret.txt", "'..'"),
        ("documents/../file_1.pdf", "'..'"),  # refused even though it would land inside
        ("", "empty"),
        ("documents/file\x00.pdf", "NUL"),
        ("documents/missing.pdf", "does not exist"),
        ("documents", "not a regular file"),
    ],
)
def test_bad_relative_paths_refused(layout: dict[str, Path], file_path: str, reason: str) -> None:
    """``..`` components, empty paths, NUL bytes, missing files and directories raise FileAccessRefused."""
    with pytest.raises(FileAccessRefused, match=reason):
        LocalFiles(layout["bot"]).resolve(file_path)


@pytest.mark.parametrize("value", [None, 5, b"documents/file_1.pdf", Path("documents/file_1.pdf")])
def test_non_strings_refused(layout: dict[str, Path], value: Any) -> None:
    """A file_path that is not a str (bytes, Path, None, int) raises FileAccessRefused naming its type."""
    with pytest.raises(FileAccessRefused, match="must be a string"):
        LocalFiles(layout["bot"]).resolve(value)


def test_absolute_path_elsewhere_refused(layout: dict[str, Path]) -> None:
    """An absolute path outside the bot directory, also another bot's directory, is refused."""
    files = LocalFiles(layout["bot"])
    with pytest.raises(FileAccessRefused, match="outside the bot directory"):
        files.resolve(str(layout["outside"]))
    with pytest.raises(FileAccessRefused, match="outside the bot directory"):
        files.resolve(str(layout["other"] / "theirs.txt"))
    with pytest.raises(FileAccessRefused, match="outside the bot directory"):
        files.resolve(str(layout["bot"]))  # the directory itself is not a file inside it


def test_sibling_with_common_prefix_refused(layout: dict[str, Path], tmp_path: Path) -> None:
    """A sibling directory whose name merely starts with the bot directory's name is outside."""
    sibling = Path(str(layout["bot"]) + "-evil")
    sibling.mkdir()
    (sibling / "x").write_bytes(b"x")
    with pytest.raises(FileAccessRefused, match="outside"):
        LocalFiles(layout["bot"]).resolve(str(sibling / "x"))


def test_symlink_leaving_the_directory_refused(layout: dict[str, Path]) -> None:
    """A symlink inside the bot directory that points outside it is judged by its target and refused."""
    link = layout["bot"] / "documents" / "innocent.pdf"
    link.symlink_to(layout["outside"])
    dir_link = layout["bot"] / "escape"
    dir_link.symlink_to(layout["outside"].parent, target_is_directory=True)
    files = LocalFiles(layout["bot"])
    with pytest.raises(FileAccessRefused, match="outside"):
        files.resolve(str(link))
    with pytest.raises(FileAccessRefused, match="outside"):
        files.resolve("escape/secret.txt")


def test_dangling_symlink_to_outside_refused(layout: dict[str, Path], tmp_path: Path) -> None:
    """A symlink pointing at a not-yet-existing file outside is refused as outside, not as missing."""
    link = layout["bot"] / "later.pdf"
    link.symlink_to(tmp_path / "does-not-exist-yet")
    with pytest.raises(FileAccessRefused, match="outside"):
        LocalFiles(layout["bot"]).resolve("later.pdf")


def test_symlink_staying_inside_accepted(layout: dict[str, Path]) -> None:
    """A symlink whose target lies inside the bot directory resolves to the target."""
    link = layout["bot"] / "alias.pdf"
    link.symlink_to(layout["inside"])
    assert LocalFiles(layout["bot"]).resolve(str(link)) == layout["inside"].resolve()


def test_bot_directory_given_through_a_symlink(layout: dict[str, Path], tmp_path: Path) -> None:
    """A bot directory configured through a symlink accepts paths under either spelling, judged on real paths."""
    alias = tmp_path / "bot-alias"
    alias.symlink_to(layout["bot"], target_is_directory=True)
    files = LocalFiles(alias)
    assert files.resolve(str(alias / "documents" / "file_1.pdf")) == layout["inside"].resolve()
    assert files.resolve(str(layout["inside"])) == layout["inside"].resolve()
    with pytest.raises(FileAccessRefused, match="outside"):
        files.resolve(str(layout["outside"]))


def test_refusal_messages_mask_the_token(layout: dict[str, Path]) -> None:
    """Refusals name the path but mask the bot token it contains."""
    with pytest.raises(FileAccessRefused) as info:
        LocalFiles(layout["bot"]).resolve(str(layout["bot"] / "documents" / "missing.pdf"))
    assert TOKEN.split(":")[1] not in str(info.value)
    assert "123456789:***" in str(info.value)


# -- open ----------------------------------------------------------------------------------------------


def test_open_path_reads_the_file(layout: dict[str, Path]) -> None:
    """open_path returns a binary file object with the file's content."""
    with LocalFiles(layout["bot"]).open_path("documents/file_1.pdf") as fh:
        assert fh.read() == b"inside"
        assert "b" in fh.mode


class SwapBeforeOpen(LocalFiles):
    """A LocalFiles that runs ``swap`` after the check and before the open: the race, made deterministic."""

    def __init__(self, directory: Path, swap: Any) -> None:
        super().__init__(directory)
        self.swap = swap

    def _open_fd(self, real: str, base: str) -> int:  # type: ignore[override]
        self.swap()
        return LocalFiles._open_fd(real, base)


def test_symlink_swapped_in_for_the_file_is_caught(layout: dict[str, Path]) -> None:
    """Replacing the checked file by a symlink to an outside file before the open is refused."""
    inside = layout["inside"]

    def swap() -> None:
        inside.unlink()
        inside.symlink_to(layout["outside"])

    with pytest.raises(FileAccessRefused, match="between the check and the open"):
        SwapBeforeOpen(layout["bot"], swap).open_path(str(inside))


def test_symlink_swapped_in_for_a_directory_is_caught(layout: dict[str, Path], tmp_path: Path) -> None:
    """Replacing a directory on the path by a symlink to an outside directory before the open is refused."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "file_1.pdf").write_bytes(b"decoy")
    documents = layout["bot"] / "documents"

    def swap() -> None:
        shutil.rmtree(documents)
        documents.symlink_to(decoy, target_is_directory=True)

    with pytest.raises(FileAccessRefused, match="between the check and the open"):
        SwapBeforeOpen(layout["bot"], swap).open_path("documents/file_1.pdf")


def test_file_replaced_between_check_and_open_is_caught(layout: dict[str, Path]) -> None:
    """A different file renamed over the checked one before the open is refused (os.fstat comparison)."""
    inside = layout["inside"]
    replacement = layout["bot"] / "replacement"
    replacement.write_bytes(b"replacement")

    def swap() -> None:
        os.replace(replacement, inside)

    with pytest.raises(FileAccessRefused, match="changed between the check and the open"):
        SwapBeforeOpen(layout["bot"], swap).open_path(str(inside))


def test_fifo_is_refused_without_blocking(layout: dict[str, Path]) -> None:
    """A FIFO inside the bot directory is refused as not a regular file (opening it would block)."""
    fifo = layout["bot"] / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(FileAccessRefused, match="not a regular file"):
        LocalFiles(layout["bot"]).open_path(str(fifo))


def test_open_by_file_id_through_local_server(layout: dict[str, Path]) -> None:
    """open(file_id) asks the (fake, local-mode) server's getFile for the absolute path and reads that file."""
    report = layout["bot"] / "documents" / "report.pdf"
    report.write_bytes(b"%PDF report")
    with FakeBotAPI() as api:
        bot = telebot.TeleBot(api.token, threaded=False)
        file_id = "doc-1"
        serve_files(api, {file_id: report})
        files = LocalFiles(layout["bot"], bot=bot)
        with files.open(file_id) as fh:
            assert fh.read() == b"%PDF report"
        with LocalFiles(layout["bot"]).open(file_id, bot) as fh:
            assert fh.read() == b"%PDF report"
        assert [c.params.get("file_id") for c in api.calls_to("getFile")] == ["doc-1", "doc-1"]


def test_open_refuses_what_the_server_points_outside(layout: dict[str, Path]) -> None:
    """A getFile answer pointing outside the bot directory, directly or via a symlink, is refused."""
    with FakeBotAPI() as api:
        bot = telebot.TeleBot(api.token, threaded=False)
        files = LocalFiles(layout["bot"], bot=bot)
        outside_id, link_id = "out", "link"
        (layout["bot"] / "link.pdf").symlink_to(layout["outside"])
        serve_files(api, {outside_id: layout["outside"], link_id: layout["bot"] / "link.pdf"})
        with pytest.raises(FileAccessRefused, match="outside"):
            files.open(outside_id)
        with pytest.raises(FileAccessRefused, match="outside"):
            files.open(link_id)


def test_open_unknown_file_id_raises_classified_error(layout: dict[str, Path]) -> None:
    """A getFile refusal surfaces as the classified TelegramError, chained to telebot's exception."""
    with FakeBotAPI() as api:
        serve_files(api, {})
        files = LocalFiles(layout["bot"], bot=telebot.TeleBot(api.token, threaded=False))
        with pytest.raises(MessageRefused, match="invalid file_id") as info:
            files.open("nope")
        assert isinstance(info.value.__cause__, telebot.apihelper.ApiTelegramException)


def test_open_needs_a_bot_and_a_file_id(layout: dict[str, Path]) -> None:
    """open() without any bot, or with an empty file_id, raises ConfigurationError."""
    with pytest.raises(ConfigurationError, match="needs a bot"):
        LocalFiles(layout["bot"]).open("x")
    with pytest.raises(ConfigurationError, match="file_id"):
        LocalFiles(layout["bot"], bot=object()).open("")


# -- check and construction ----------------------------------------------------------------------------


def test_check_ok(layout: dict[str, Path]) -> None:
    """check() on an existing readable directory is ok (and truthy)."""
    result = LocalFiles(layout["bot"]).check()
    assert result == DirectoryCheck(True, "ok", str(layout["bot"]))
    assert result


@pytest.mark.parametrize(
    ("make_path", "reason"),
    [
        (lambda tmp: tmp / "missing", "does not exist"),
        (lambda tmp: tmp / "secret.txt", "is not a directory"),
    ],
)
def test_check_reports_the_problem(layout: dict[str, Path], tmp_path: Path, make_path: Any, reason: str) -> None:
    """check() says why a missing path or a plain file is not a usable bot directory."""
    result = LocalFiles(make_path(tmp_path)).check()
    assert not result.ok and not result
    assert reason in result.reason


def test_check_dangling_symlink(tmp_path: Path) -> None:
    """check() on a symlink to nowhere says so."""
    link = tmp_path / "dir-link"
    link.symlink_to(tmp_path / "gone", target_is_directory=True)
    result = LocalFiles(link).check()
    assert not result.ok and "symlink" in result.reason


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can read any directory")
def test_check_unreadable(tmp_path: Path) -> None:
    """check() on a directory without read permission reports permission denied."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        result = LocalFiles(locked).check()
        assert not result.ok and "permission" in result.reason
    finally:
        locked.chmod(0o700)


def test_check_masks_the_token(tmp_path: Path) -> None:
    """check()'s reason masks the bot token that names the directory."""
    result = LocalFiles(tmp_path / TOKEN).check()
    assert not result.ok and "123456789:***" in result.reason and TOKEN not in result.reason


@pytest.mark.parametrize("value", ["", None, b"/tmp", "a\x00b", 5])
def test_bad_bot_directory_refused(value: Any) -> None:
    """A bot directory that is not a non-empty path raises ConfigurationError."""
    with pytest.raises(ConfigurationError, match="bot_directory"):
        LocalFiles(value)


def test_public_names() -> None:
    """The module exports exactly its documented public names."""
    assert sorted(files_module.__all__) == ["DirectoryCheck", "LocalFiles"]


@pytest.mark.skipif(
    sys.version_info >= (3, 13),
    reason="Python 3.13's os.path.realpath ignores a readlink that fails mid-swap (non-strict mode), so the raw "
    "OSError this pins cannot arise",
)
def test_a_symlink_swapped_while_resolving_is_refused_with_the_path_masked(layout: dict[str, Path]) -> None:
    """A symlink removed or replaced during resolve gives FileAccessRefused, with no token in text or cause.

    A real thread swaps the entry between a symlink and a file while resolve runs, until the race is hit.
    """
    link = layout["bot"] / "documents" / "swap.pdf"
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                link.symlink_to(layout["inside"])
                link.unlink()
                link.write_bytes(b"")
                link.unlink()

    swapper = threading.Thread(target=swap, name="test-swapper")
    swapper.start()
    files = LocalFiles(layout["bot"])
    raced: list[FileAccessRefused] = []
    escaped: list[BaseException] = []
    secret = TOKEN.split(":")[1]
    deadline = time.monotonic() + 30
    try:
        while not raced and not escaped and time.monotonic() < deadline:
            try:
                files.resolve(str(link))
            except FileAccessRefused as exc:
                texts = [str(exc), repr(exc.__cause__), str(exc.__cause__)]
                if any(secret in text for text in texts):
                    escaped.append(exc)
                if "changed while it was being resolved" in str(exc):
                    raced.append(exc)
            except Exception as exc:
                escaped.append(exc)
    finally:
        stop.set()
        swapper.join(10)
    assert not escaped, f"a failure escaped unmasked or as a raw error: {escaped[0]!r}"
    assert raced, "the race was not hit within 30 s"
