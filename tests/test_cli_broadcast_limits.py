"""A broadcast text over Telegram's limits (counted as Telegram counts) or not valid Unicode is refused at `create`."""

from __future__ import annotations

from pathlib import Path

import pytest

from telegram_fence.cli.main import main
from telegram_fence.delivery.broadcast import Broadcast
from telegram_fence.delivery.broadcast_message import TEXT_LIMIT, check_length, utf16_length, visible_text
from telegram_fence.errors import ConfigurationError


def test_lengths_are_counted_in_utf16_code_units() -> None:
    """An emoji outside the Basic Multilingual Plane counts 2, an accented letter 1."""
    assert utf16_length("a") == 1 and utf16_length("é") == 1 and utf16_length("😀") == 2
    assert check_length("😀" * (TEXT_LIMIT // 2)) == TEXT_LIMIT
    with pytest.raises(ConfigurationError, match=f"4098 characters .* at most {TEXT_LIMIT}"):
        check_length("😀" * (TEXT_LIMIT // 2 + 1))


@pytest.mark.parametrize(
    ("text", "mode", "visible"),
    [
        ("<b>bold</b> &amp; <a href='https://example.org/long/path'>link</a>", "HTML", "bold & link"),
        ('<pre><code class="language-python">x = 1</code></pre>', "HTML", "x = 1"),
        ("*bold* _it_ [link](https://example.org) `code`", "Markdown", "bold it link code"),
        ("*bold* \\*star\\* ||spoiler|| [link](https://example.org) ```python\ncode```", "MarkdownV2",
         "bold *star* spoiler link code"),
        ("  plain *text* stays  ", None, "plain *text* stays"),
    ],
)
def test_markup_is_not_counted(text: str, mode: str | None, visible: str) -> None:
    """With a parse_mode, tags, markup, link targets and code-block languages are left out of the count."""
    assert visible_text(text, mode) == visible


def test_markup_does_not_push_a_text_over_the_limit() -> None:
    """A text whose markup makes it longer than 4096 but whose visible text fits is accepted; one more is not."""
    text = "<b>" + "x" * TEXT_LIMIT + "</b>"
    assert check_length(text, "HTML") == TEXT_LIMIT
    with pytest.raises(ConfigurationError, match="after HTML markup"):
        check_length("<b>" + "x" * (TEXT_LIMIT + 1) + "</b>", "HTML")


def test_create_refuses_a_text_too_long_and_leaves_the_name_free(tmp_path: Path) -> None:
    """Broadcast.create raises before writing anything, so the name can be created with a shorter text."""
    broadcast = Broadcast(None, tmp_path, "news")
    with pytest.raises(ConfigurationError, match="Telegram allows at most 4096"):
        broadcast.create([1, 2], "y" * (TEXT_LIMIT + 1))
    assert not broadcast.path.exists()
    assert broadcast.create([1, 2], "y" * TEXT_LIMIT)


def test_the_cli_refuses_a_long_text_file_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`broadcast create --text-file` with 4097 visible characters exits 2 with one line; nothing is written."""
    audience = tmp_path / "audience.txt"
    audience.write_text("1\n2\n")
    text = tmp_path / "text.html"
    text.write_text("<i>" + "z" * (TEXT_LIMIT + 1) + "</i>")
    directory = tmp_path / "broadcasts"
    argv = ["broadcast", "create", "news", "--audience", str(audience), "--text-file", str(text),
            "--parse-mode", "HTML", "--dir", str(directory)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "4097" in err and len(err.strip().splitlines()) == 1
    assert not (directory / "news").exists()
    text.write_text("<i>" + "z" * TEXT_LIMIT + "</i>")
    assert main(argv) == 0


@pytest.mark.parametrize(
    ("text", "options", "named"),
    [
        ("hello \ud800 world", {}, r"message text holds a lone surrogate \(U\+D800\) at character 6"),
        ("bad bytes \udcff", {"parse_mode": "HTML"}, r"message text holds a lone surrogate \(U\+DCFF\)"),
        ("fine", {"reply_markup": {"inline_keyboard": [[{"text": "\udc80", "callback_data": "x"}]]}},
         r"send option 'reply_markup' \(as JSON\) holds a lone surrogate \(U\+DC80\)"),
    ],
)
def test_create_refuses_a_lone_surrogate_naming_it_and_leaves_the_name_free(
    tmp_path: Path, text: str, options: dict[str, object], named: str
) -> None:
    """A text or option with a lone surrogate is refused at create with a ConfigurationError naming it; nothing
    written."""
    broadcast = Broadcast(None, tmp_path, "news")
    with pytest.raises(ConfigurationError, match=named):
        broadcast.create([1, 2], text, **options)
    assert not broadcast.path.exists()
    assert broadcast.create([1, 2], "fine")


def test_the_cli_refuses_undecodable_argument_bytes_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`broadcast create --text` with bytes that are not UTF-8 (a lone surrogate in argv) exits 2 with one line."""
    audience = tmp_path / "audience.txt"
    audience.write_text("1\n")
    directory = tmp_path / "broadcasts"
    argv = ["broadcast", "create", "news", "--audience", str(audience), "--text", "caf\udce9", "--dir", str(directory)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "lone surrogate (U+DCE9)" in err and len(err.strip().splitlines()) == 1
    assert not (directory / "news").exists()
