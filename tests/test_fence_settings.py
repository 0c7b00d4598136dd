"""The fence's options as one checked frozen value, and the checks of what a Fence is given (no threads)."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import pytest

from telegram_fence.errors import ConfigurationError
from telegram_fence.retry import default_retry
from telegram_fence.runtime.fence import Fence
from telegram_fence.runtime.settings import FenceSettings, check_bot, open_store, split_capture


@pytest.mark.parametrize("name", ["workers", "lease", "max_attempts", "long_poll_timeout", "handler_timeout"])
@pytest.mark.parametrize("value", [0, -1, True, "3"])
def test_each_number_option_must_be_positive_and_the_error_names_it(name: str, value: object) -> None:
    """A zero, negative, boolean or non-number option is refused with its name and value in the message."""
    with pytest.raises(ConfigurationError, match=f"^{name}={value!r} must be a positive number$"):
        FenceSettings(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["lease", "long_poll_timeout", "watchdog_margin", "handler_timeout", "workers"])
@pytest.mark.parametrize("value", [math.nan, -math.inf])
def test_a_number_option_that_is_no_number_is_refused(name: str, value: float) -> None:
    """NaN (which compares false with everything) and minus infinity are refused, naming the option."""
    with pytest.raises(ConfigurationError, match=f"^{name}=.* must be a positive number$"):
        FenceSettings(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["lease", "long_poll_timeout", "watchdog_margin"])
def test_infinity_is_refused_where_time_is_computed_from_the_option(name: str) -> None:
    """An infinite lease, long poll or watchdog margin cannot work and is refused; an infinite handler_timeout
    (never take an update away) is accepted."""
    with pytest.raises(ConfigurationError, match=f"^{name}=inf must be a positive number$"):
        FenceSettings(**{name: math.inf})  # type: ignore[arg-type]
    assert FenceSettings(handler_timeout=math.inf).handler_timeout == math.inf


@pytest.mark.parametrize("name", ["retention", "shutdown_timeout", "conflict_grace"])
@pytest.mark.parametrize("value", [-1, math.nan, math.inf, "10", True])
def test_the_seconds_options_must_be_zero_or_more_and_finite(name: str, value: object) -> None:
    """retention, shutdown_timeout and conflict_grace take 0 or more seconds; anything else names the option."""
    with pytest.raises(ConfigurationError, match=f"^{name}=.* must be a number of seconds, 0 or more$"):
        FenceSettings(**{name: value})  # type: ignore[arg-type]
    assert getattr(FenceSettings(**{name: 0}), name) == 0  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["retry", "authorize", "on_exhausted", "on_ended"])
def test_a_hook_option_must_be_callable(name: str) -> None:
    """A hook given as something that cannot be called is refused at construction, not when it is first needed."""
    with pytest.raises(ConfigurationError, match=f"^{name}=42 must be a function or None$"):
        FenceSettings(**{name: 42})  # type: ignore[arg-type]


def test_allowed_updates_must_be_a_list_of_names_and_is_kept_as_a_tuple() -> None:
    """One string (a common slip for a one-item list) is refused; a list is kept as a tuple nobody can change."""
    with pytest.raises(ConfigurationError, match=r"^allowed_updates='message' must be a list"):
        FenceSettings(allowed_updates="message")
    assert FenceSettings(allowed_updates=["message"]).allowed_updates == ("message",)


def test_fence_takes_every_option_with_the_default_kept_by_the_settings() -> None:
    """Each option of Fence.__init__ that is a settings field has the settings' default (kept in one place)."""
    parameters = inspect.signature(Fence.__init__).parameters
    fields = {p.name: p.default for p in inspect.signature(FenceSettings).parameters.values()}
    assert set(fields) - set(parameters) <= {"skip_pending", "request_timeout"}  # set by run(), not the constructor
    wrong = {name: (parameters[name].default, default) for name, default in fields.items()
             if name in parameters and parameters[name].default != default}
    assert wrong == {}


def test_settings_are_frozen_and_fill_in_the_defaults() -> None:
    """The lease is kept as a float, no retry means default_retry, and a made value cannot be changed."""
    settings = FenceSettings(lease=3)
    assert isinstance(settings.lease, float) and settings.lease == 3.0
    assert settings.retry is default_retry
    with pytest.raises(AttributeError):
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


def test_a_store_lacking_methods_of_the_protocol_is_refused_naming_them(tmp_path: Path) -> None:
    """open_store names every method of the store protocol a given store lacks, and does not own (close) it."""
    from telegram_fence.store import SqliteUpdateStore

    with pytest.raises(ConfigurationError, match="has no clock, record, next_offset, exchange"):
        open_store(object())
    with SqliteUpdateStore(tmp_path / "bot.db") as inner:

        class NoExchange:
            def __getattr__(self, name: str) -> Any:
                if name == "exchange":
                    raise AttributeError(name)
                return getattr(inner, name)

        with pytest.raises(ConfigurationError, match=r"has no exchange; the fence needs every method"):
            open_store(NoExchange())
        assert inner.next_offset() == 0  # still open: the fence never owned it


@pytest.mark.parametrize("name", ["max_backlog", "batch_size", "no_such_option"])
def test_an_unknown_option_is_refused(tmp_path: Path, name: str) -> None:
    """An option a fence does not take (an unknown one, or one removed in 0.2.0) raises Python's own TypeError."""
    import telebot

    bot = telebot.TeleBot("123:abc")
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        Fence(bot, str(tmp_path / "bot.db"), **{name: 1})


def test_a_path_opens_a_sqlite_store_the_fence_owns(tmp_path: Path) -> None:
    """A path gives a SQLite store there, which the fence owns (and so closes)."""
    store, owns = open_store(str(tmp_path / "bot.db"))
    try:
        assert owns and callable(store.exchange)
    finally:
        store.close()


@pytest.mark.parametrize("name", ["workers", "max_attempts"])
def test_a_count_option_must_be_a_whole_number(name: str) -> None:
    """2.5 workers cannot run: a count given as a fraction is refused naming the option, not met later in a range()."""
    with pytest.raises(ConfigurationError, match=f"^{name}=2.5 must be a whole number$"):
        FenceSettings(**{name: 2.5})  # type: ignore[arg-type]


@pytest.mark.parametrize(("options", "message"), [
    ({"states": "yes"}, r"^states='yes' must be True, False or None"),
    ({"journal_calls": 1}, r"^journal_calls=1 must be True or False$"),
    ({"skip_pending": "no"}, r"^skip_pending='no' must be True or False$"),
    ({"uncertain_calls": "ignore"}, r"^uncertain_calls='ignore': use 'continue'"),
    ({"on_uncertain": 42}, r"^on_uncertain=42 must be a function or None$"),
    ({"rate_limits": {"per_chat": 1}}, r"^rate_limits=\{'per_chat': 1\} must be telegram_fence.calls.limits.Rates"),
    ({"operator": "@ops"}, r"^operator='@ops' must be an OperatorChannel"),
    ({"logger": "telegram_fence"}, r"^logger='telegram_fence' must be a logging.Logger or None$"),
    ({"metrics": 9464}, r"^metrics=9464 must be \(host, port\)"),
])
def test_each_part_option_is_checked_when_the_settings_are_made(options: dict[str, object], message: str) -> None:
    """The options that are objects or choices are refused at construction with a message naming the option."""
    with pytest.raises(ConfigurationError, match=message):
        FenceSettings(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("options", "name"), [
    ({"retention": -1}, "retention"), ({"shutdown_timeout": math.nan}, "shutdown_timeout"),
    ({"conflict_grace": math.inf}, "conflict_grace"), ({"watchdog_margin": 0}, "watchdog_margin"),
    ({"workers": 1.5}, "workers"), ({"states": 1}, "states"), ({"uncertain_calls": "raise!"}, "uncertain_calls"),
    ({"logger": 3}, "logger"), ({"journal_calls": None}, "journal_calls"),
])
def test_fence_refuses_a_bad_option_before_it_opens_anything(tmp_path: Path, options: dict[str, object],
                                                              name: str) -> None:
    """Fence() checks its options through the settings, first: the error names the option and no database file is
    created for a fence that was refused."""
    bot = type("Bot", (), {"threaded": False, "token": "1:x"})()
    db = tmp_path / "bot.db"
    with pytest.raises(ConfigurationError, match=f"^{name}="):
        Fence(bot, str(db), **options)  # type: ignore[arg-type]
    assert not db.exists()


def test_fence_reads_its_options_only_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fence.__init__ passes every settings option it takes to FenceSettings, as given, and reads none of them
    itself (the settings are the one source)."""
    import ast

    from telegram_fence.runtime import fence as fence_module

    source = inspect.getsource(Fence.__init__)
    tree = ast.parse(inspect.cleandoc("\n" + source) if source.startswith(" ") else source)
    fields = set(inspect.signature(FenceSettings).parameters)
    init = tree.body[0]
    assert isinstance(init, ast.FunctionDef)
    taken = {arg.arg for arg in init.args.kwonlyargs} & fields
    assert taken == fields - {"skip_pending", "request_timeout"}  # those two are run()'s
    assert {node.id for node in ast.walk(init) if isinstance(node, ast.Name) and node.id in fields} == set()

    class Made(Exception):
        pass

    def made(**options: object) -> None:
        raise Made(options)

    made._fields = FenceSettings._fields  # type: ignore[attr-defined]
    monkeypatch.setattr(fence_module, "FenceSettings", made)
    options = {name: object() for name in taken}
    bot = type("Bot", (), {"threaded": False, "token": "1:x"})()
    with pytest.raises(Made) as raised:
        Fence(bot, "unused.db", **options)  # type: ignore[arg-type]
    assert raised.value.args[0] == options
