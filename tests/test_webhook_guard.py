"""Takeover protection: the tagged URL and the decision as plain functions, table-driven."""

from __future__ import annotations

import pytest

from telegram_fence import ConfigurationError, FenceError, WebhookTaken
from telegram_fence.ingress.webhook_guard import (
    decide,
    is_ours,
    owner_host,
    split_tag,
    tag_of,
    tagged_url,
)

MINE = "https://bot.example.com/telegram/hook"
SECRET = "production-secret"
OTHER_SECRET = "staging-secret"


def test_the_tag_is_the_first_16_hex_of_an_hmac_of_the_url() -> None:
    """tagged_url appends tf=<16 hex of HMAC-SHA256(secret, url without tag)>, and split_tag takes it off again."""
    import hashlib
    import hmac

    full = tagged_url(MINE, SECRET)
    expected = hmac.new(SECRET.encode(), MINE.encode(), hashlib.sha256).hexdigest()[:16]
    assert full == f"{MINE}?tf={expected}"
    assert split_tag(full) == (MINE, expected)
    assert tag_of(SECRET, MINE) == expected
    assert SECRET not in full


@pytest.mark.parametrize(("url", "base"), [
    ("https://h.example/p?a=1", "https://h.example/p?a=1"),
    ("https://h.example/p?a=x%20y&b=", "https://h.example/p?a=x%20y&b="),
    ("https://h.example/p?tf=0000000000000000&a=1", "https://h.example/p?a=1"),
])
def test_tagging_keeps_the_other_query_parameters_exactly(url: str, base: str) -> None:
    """Other query parameters keep their exact text; an old tag is replaced, never doubled."""
    full = tagged_url(url, SECRET)
    assert split_tag(full)[0] == base
    assert full.count("tf=") == 1
    assert tagged_url(full, SECRET) == full


@pytest.mark.parametrize("url", ["", "bot.example.com/hook", "ftp://h/x", "https:///nohost"])
def test_a_url_without_scheme_or_host_is_refused(url: str) -> None:
    """A webhook url must be absolute http(s) with a host."""
    with pytest.raises(ConfigurationError):
        tagged_url(url, SECRET)


@pytest.mark.parametrize(("url", "host"), [
    ("", ""),
    ("https://bot.example.com/hook?tf=abc", "bot.example.com"),
    ("https://User:Pass@Bot.Example.com:8443/a/b?q=secret", "bot.example.com:8443"),
    ("https://[2001:db8::1]:443/x", "[2001:db8::1]:443"),
    ("https://[::1]/x", "[::1]"),
    ("https://h:notaport/x", "an unreadable address"),
])
def test_owner_host_names_host_and_port_only(url: str, host: str) -> None:
    """owner_host keeps host and explicit port, never credentials, path or query."""
    assert owner_host(url) == host


TAKEN = "https://staging.example.org/hook"

# (registered URL, takeover_from, expected reason or the host named by WebhookTaken)
DECISIONS = [
    ("", None, "empty"),
    ("", "anything.example", "empty"),
    (tagged_url(MINE, SECRET), None, "ours"),
    (tagged_url(MINE, SECRET), "bot.example.com", "ours"),
    (TAKEN, None, WebhookTaken("staging.example.org")),
    (TAKEN, "staging.example.org", "takeover"),
    (TAKEN, "STAGING.example.org", "takeover"),
    (TAKEN, "https://staging.example.org/other", "takeover"),
    (TAKEN, "elsewhere.example.org", WebhookTaken("staging.example.org")),
    ("https://staging.example.org:8443/hook", "staging.example.org", "takeover"),
    ("https://staging.example.org:8443/hook", "staging.example.org:8443", "takeover"),
    ("https://staging.example.org:8443/hook", "staging.example.org:9000", WebhookTaken("staging.example.org:8443")),
    (tagged_url(MINE, OTHER_SECRET), None, WebhookTaken("bot.example.com")),
    (MINE, None, WebhookTaken("bot.example.com")),
    (MINE + "?tf=", None, WebhookTaken("bot.example.com")),
    (tagged_url(MINE, OTHER_SECRET), "bot.example.com", "takeover"),
    (tagged_url("https://bot.example.com/other", SECRET), None, WebhookTaken("bot.example.com")),
]


@pytest.mark.parametrize(("info_url", "takeover_from", "expected"), DECISIONS)
def test_decide(info_url: str, takeover_from: str | None, expected: str | WebhookTaken) -> None:
    """Registering is allowed when empty, ours (same url, this secret's tag) or named in takeover_from; else refused."""
    if isinstance(expected, WebhookTaken):
        with pytest.raises(WebhookTaken) as info:
            decide(info_url, MINE, SECRET, takeover_from)
        assert info.value.host == expected.host
        assert isinstance(info.value, FenceError)
        text = str(info.value)
        assert expected.host in text
        for private in (SECRET, OTHER_SECRET, "/hook", "/other", "tf=", "?"):
            assert private not in text
    else:
        assert decide(info_url, MINE, SECRET, takeover_from) == expected


def test_is_ours_needs_the_same_address_and_this_secrets_tag() -> None:
    """Only the same base URL carrying this secret's tag is ours."""
    assert is_ours(tagged_url(MINE, SECRET), MINE, SECRET)
    assert is_ours(tagged_url(MINE, SECRET), tagged_url(MINE, SECRET), SECRET)
    assert not is_ours(tagged_url(MINE, OTHER_SECRET), MINE, SECRET)
    assert not is_ours(MINE, MINE, SECRET)
    assert not is_ours("", MINE, SECRET)
    assert not is_ours(tagged_url(MINE + "2", SECRET), MINE, SECRET)


def test_reasons_name_the_host_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 409 and moved reasons name the webhook's host, never its path or query."""
    from telegram_fence.ingress import webhook_guard

    def reasons(url: str) -> tuple[str | None, str]:
        info = webhook_guard.WebhookInfo(url, 0, None, None, None)
        monkeypatch.setattr(webhook_guard, "read_info", lambda token: info)
        told: list[str] = []
        webhook_guard.WebhookWatch("1:t", MINE, SECRET, on_moved=told.append)._check()
        return webhook_guard.webhook_conflict("1:t"), told[0]

    for text in reasons(tagged_url("https://thief.example.net:8443/path/secret-part?key=v", SECRET)):
        assert text is not None
        assert "thief.example.net:8443" in text
        assert "secret-part" not in text and "key=v" not in text
    conflict, moved = reasons("")
    assert conflict is None and "deleted" in moved
