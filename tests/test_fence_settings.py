"""The fence's options as one checked frozen value, and the checks of what a Fence is given (no threads)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from telegram_fence.errors import ConfigurationError
from telegram_fence.retry import default_retry
from telegram_fence.runtime.settings import FenceSettings, check_bot, open_store, split_capture


@pytest.mark.parametrize("name", ["workers", "lease", "max_attempts", "long_poll_timeout", "handler_timeout",
                                  "max_backlog", "batch_size"])
@pytest.mark.parametrize("value", [0, -1, True, "3"])
def test_each_number_option_must_be_positive_and_the_error_names_it(name: str, value: object) -> None:
    """A zero, negative, boolean or non-number option is refused with its name and value in the message."""
    with pytest.raises(ConfigurationError, match=f"^{name}={value!r} must be a positive number$"):
        FenceSettings(**{name: value})  # type: ignore[arg-type]


def test_settings_are_frozen_and_fill_in_the_defaults() -> None:
    """The lease is kept as a float, no retry means default_retry, and a made value cannot be changed."""
    settings = FenceSettings(lease=3)
    assert isinstance(settings.lease, float) and settings.lease == 3.0
    assert settings.retry_policy is default_retry
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.workers = 9  # type: ignore[misc]


def test_a_tokenless_bot_is_refused_and_a_threaded_one_accepted() -> None:
    """check_bot refuses a bot without a token and accepts a threaded one (the fence runs its handlers)."""
    threaded = type("Bot", (), {"threaded": True, "token": "1:x"})()
    tokenless = type("Bot", (), {"threaded": False, "token": ""})()
    check_bot(threaded)
    with pytest.raises(ConfigurationError, match="no token"):
        check_bot(tokenless)


def test_capture_is_split_into_the_outbox_and_its_hook() -> None:
    """A bare hook only captures; something that is neither hook nor outbox is refused."""
    def hook(conn: object, updates: object) -> None:
        return None

    assert split_capture(hook) == (None, hook)
    assert split_capture(None) == (None, None)
    with pytest.raises(ConfigurationError, match="capture must be"):
        split_capture(42)


def test_a_store_without_the_fenced_methods_is_refused_and_left_open() -> None:
    """open_store names the first missing method and does not own a store it was given."""
    with pytest.raises(ConfigurationError, match="has no record"):
        open_store(object())


def test_a_path_opens_a_sqlite_store_the_fence_owns(tmp_path: Path) -> None:
    """A path gives a SQLite store there, which the fence owns (and so closes)."""
    store, owns = open_store(str(tmp_path / "bot.db"))
    try:
        assert owns and callable(store.claim_owned)
    finally:
        store.close()
