"""The public surface: exactly these names, one error tree, typed package."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import telegram_fence
from telegram_fence import errors

#: What a bot author imports from ``telegram_fence``: at most 25 names, the errors a bot meets included.
PUBLIC = {
    # running a bot
    "Fence", "AttemptContext", "Exhaustion", "SqliteUpdateStore", "backoff", "default_retry", "configure_logging",
    # fenced calls and durable steps
    "queue_calls", "uncertain_calls", "Rates", "step", "step_key",
    # delivery
    "Broadcast", "Outbox", "CaptureRule", "OperatorChannel", "LocalFiles",
    # errors (every other one: telegram_fence.errors)
    "FenceError", "ConfigurationError", "StoreError", "OwnershipLost", "CallUncertain", "StepUncertain",
    "TelegramError", "WebhookTaken",
}

#: Names for backend authors, in ``telegram_fence.store``; the fence's own parts, in their modules.
ELSEWHERE = {
    "telegram_fence.store": ("UpdateStore", "Claim", "Identity", "Exhaustion", "SqliteUpdateStore"),
    "telegram_fence.conversation": ("FenceStateStorage", "FenceHandlerBackend"),
    "telegram_fence.ingress.webhook": ("WebhookIntake",),
    "telegram_fence.jsonlog": ("JsonFormatter", "JsonLineHandler"),
    "telegram_fence.files": ("DirectoryCheck",),
    "telegram_fence.errors": ("Transient", "Ambiguous", "Fatal", "Conflict", "Unauthorized", "InvalidUpdate",
                              "StoreUnavailable", "StateNotStorable", "FileAccessRefused"),
}


def test_all_lists_exactly_the_public_names() -> None:
    """telegram_fence.__all__ is exactly the bot author's names, at most 25, and each one imports."""
    assert set(telegram_fence.__all__) == PUBLIC and len(telegram_fence.__all__) == len(PUBLIC) <= 25
    for name in PUBLIC:
        assert getattr(telegram_fence, name) is not None


def test_backend_and_internal_names_live_in_their_modules_not_in_the_package() -> None:
    """The store contract imports from ``telegram_fence.store``, the fence's parts and the other errors from their
    modules; none of them is an attribute of ``telegram_fence`` itself."""
    import importlib

    for module, names in ELSEWHERE.items():
        loaded = importlib.import_module(module)
        for name in names:
            assert getattr(loaded, name) is not None, (module, name)
            if name not in PUBLIC:
                assert not hasattr(telegram_fence, name), name


def test_a_script_using_the_readme_names_imports_them_from_the_package() -> None:
    """Every name the README imports from ``telegram_fence`` is exported by it."""
    import re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    imported = {name.strip() for names in re.findall(r"^from telegram_fence import ([\w, ]+)$", readme, re.M)
                for name in names.split(",")}
    assert {"Fence", "configure_logging", "queue_calls"} <= imported
    assert imported <= PUBLIC


def test_every_error_is_a_fence_error() -> None:
    """Every exception class telegram_fence defines descends from FenceError."""
    classes = [obj for _, obj in inspect.getmembers(errors, inspect.isclass) if issubclass(obj, BaseException)]
    assert len(classes) >= 20
    for cls in classes:
        assert issubclass(cls, telegram_fence.FenceError), cls


def test_package_ships_py_typed() -> None:
    """The package is marked as typed (PEP 561)."""
    assert (Path(telegram_fence.__file__).parent / "py.typed").exists()


def _modules_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    code = f"{statement}\nimport sys\nprint('\\n'.join(sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return set(done.stdout.split())


#: Optional features: a bot that does not use them does not load them.
_OPTIONAL = ("telegram_fence.delivery", "telegram_fence.ingress.webhook",
             "telegram_fence.store.postgres", "telegram_fence.jsonlog", "telegram_fence.files", "psycopg",
             "wsgiref")


def test_importing_the_package_loads_only_the_version_and_the_errors() -> None:
    """``import telegram_fence`` imports no runtime, store, driver or telebot: the public names load on first use."""
    ours = {m for m in _modules_after("import telegram_fence") if m.startswith("telegram_fence")}
    assert ours == {"telegram_fence", "telegram_fence._version", "telegram_fence.errors"}
    loaded = _modules_after("import telegram_fence")
    assert "apsw" not in loaded and "telebot" not in loaded


def test_a_polling_fence_does_not_load_the_optional_features() -> None:
    """``from telegram_fence import Fence`` loads no broadcast, outbox, operator, webhook, PostgreSQL or JSON log."""
    loaded = _modules_after("from telegram_fence import Fence")
    assert "telegram_fence.runtime.fence" in loaded
    wrong = sorted(m for m in loaded if any(m == o or m.startswith(o + ".") for o in _OPTIONAL)
                   or m == "telegram_fence.ingress.webhook_guard")
    assert wrong == []


def test_a_polling_fence_loads_neither_sysconfig_nor_shlex() -> None:
    """``from telegram_fence import Fence`` loads neither ``sysconfig`` (with its build data: ≈ 0.15 MB, where
    ``os``'s folder names the standard library) nor ``shlex`` (for one log line of an exhaustion): telebot loads
    neither, so a polling bot on SQLite would pay them for nothing."""
    loaded = _modules_after("from telegram_fence import Fence")
    assert "telegram_fence.runtime.attempt" in loaded and "telegram_fence.runtime.workers" in loaded
    assert sorted(m for m in loaded if m in ("sysconfig", "shlex") or m.startswith("_sysconfigdata")) == []


_UNDER_OO = """
import importlib, pkgutil, sys, threading
import telebot
import telegram_fence
from telegram_fence import Fence
from telegram_fence.telegram import set_api_server
from telegram_fence.testing import FakeBotAPI

if Fence.__doc__ is not None:  # (asserts are stripped too)
    raise SystemExit("docstrings present: not running under -OO")
for name in telegram_fence.__all__:
    getattr(telegram_fence, name)
for module in pkgutil.walk_packages(telegram_fence.__path__, "telegram_fence."):
    if not module.name.endswith("__main__"):
        importlib.import_module(module.name)
with FakeBotAPI(max_long_poll=0.2) as api:
    set_api_server(api.api_url)
    api.push_messages(3, chats=[1, 2], text="m{i}")
    bot = telebot.TeleBot(api.token, threaded=False)
    done, seen = threading.Event(), []

    @bot.message_handler(func=lambda m: True)
    def reply(message):
        bot.send_message(message.chat.id, "ok")
        seen.append(message.message_id)
        if len(seen) == 3:
            done.set()

    fence = Fence(bot, sys.argv[1], workers=2, long_poll_timeout=0.2)
    fence.start()
    handled = done.wait(60)
    fence.stop()
    if not (fence.join(30) and handled):
        raise SystemExit(f"handled {seen}")
print("handled", len(seen))
"""


def test_every_module_imports_and_a_fence_runs_under_python_oo(tmp_path: Path) -> None:
    """Under ``python -OO`` (no docstrings, no asserts: how some deployments run, and the way to shed ≈ 0.3 MB of
    this package's docstrings) every module imports, every public name loads and a fence on SQLite handles its
    updates: nothing needs a docstring to work (``Fence.__init__``'s options and the conformance rules' names
    were read from docstrings, and the import raised ``IndexError``)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run([sys.executable, "-OO", "-c", _UNDER_OO, str(tmp_path / "fence.db")], capture_output=True,
                         text=True, env=env, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["handled", "3"]


def test_a_polling_fence_does_not_load_secrets() -> None:
    """``from telegram_fence import Fence`` does not import ``secrets`` (telebot does not either): claim ids and a
    resent call's id read ``os.urandom``, as ``secrets`` does."""
    assert "secrets" not in _modules_after("import telebot"), "telebot loads it: the check would prove nothing"
    assert "secrets" not in _modules_after("from telegram_fence import Fence")


#: The dataclasses ``from telegram_fence import Fence`` may define: the public value types (users may call
#: ``dataclasses.replace`` on them). Any other value class there is a ``records.Record``: a dataclass compiles its
#: methods at every import (≈ 0.4-1 ms a class; see docs/benchmarks.md, "what a bot pays to import the fence").
_PUBLIC_DATACLASSES = {"store.contract.Identity", "store.contract.Claim",
                       "store.contract.Exhaustion", "calls.frame.UncertainCall", "calls.limits.Rates"}


def test_a_polling_fence_defines_no_dataclass_but_the_public_value_types() -> None:
    """``from telegram_fence import Fence`` makes no dataclass of its own beyond the five public value types."""
    code = ("import dataclasses\nmade = []\norigin = dataclasses._process_class\n"
            "def noted(cls, *args, **kwargs):\n    made.append(f'{cls.__module__}.{cls.__qualname__}')\n"
            "    return origin(cls, *args, **kwargs)\n"
            "dataclasses._process_class = noted\nfrom telegram_fence import Fence\nprint('\\n'.join(made))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    made = {name.removeprefix("telegram_fence.") for name in done.stdout.split() if name.startswith("telegram_fence.")}
    assert "store.contract.Identity" in made, "the check no longer sees dataclasses being made"
    assert sorted(made - _PUBLIC_DATACLASSES) == []


def test_a_lazily_loaded_name_is_the_object_of_its_module() -> None:
    """A public name reached through the package is the very object its module defines, and dir() lists it."""
    from telegram_fence.delivery.broadcast import Broadcast
    from telegram_fence.runtime.fence import Fence

    assert telegram_fence.Fence is Fence
    assert telegram_fence.Broadcast is Broadcast
    assert set(telegram_fence.__all__) <= set(dir(telegram_fence))
    with pytest.raises(AttributeError):
        telegram_fence.NoSuchName  # noqa: B018


def test_help_of_fence_explains_every_option_of_its_constructor() -> None:
    """``help(telegram_fence.Fence)`` shows, under ``__init__``, what it raises and every keyword option's meaning
    (taken from ``FenceSettings``, where the options are documented once): no option is only a name in a
    signature, and the constructor is not pydoc's "Initialize self"."""
    import inspect
    import pydoc

    from telegram_fence import Fence

    doc = Fence.__init__.__doc__ or ""
    text = pydoc.render_doc(Fence, renderer=pydoc.plaintext)
    assert "Initialize self" not in text and doc.splitlines()[0] in text
    assert "ConfigurationError" in doc and "StoreCorrupt" in doc
    options = [name for name, p in inspect.signature(Fence).parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert len(options) > 20
    missing = [name for name in options if f"``{name}``" not in doc and f"``{name}(" not in doc
               and f"``{name}``" not in (Fence.__doc__ or "")]
    assert missing == [], f"Fence options that help(Fence) does not explain: {missing}"
    assert "``store``" in (Fence.__doc__ or ""), "the store attribute the README uses is not described"


def test_every_public_name_and_its_public_members_have_a_docstring() -> None:
    """``help()`` of every name of ``telegram_fence.__all__`` says something for each public method and property
    (an empty entry in ``help(AttemptContext)`` was a name without a promise)."""
    import inspect

    import telegram_fence

    missing = []
    for name in telegram_fence.__all__:
        obj = getattr(telegram_fence, name)
        if not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member, value in vars(obj).items():
                if member.startswith("_"):
                    continue
                if (callable(value) or isinstance(value, property)) and not (value.__doc__ or "").strip():
                    missing.append(f"{name}.{member}")
    assert missing == [], missing
