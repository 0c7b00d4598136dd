"""Every module that logs has a logger of its own, named for it, under ``telegram_fence``."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "telegram_fence"


def _logger_names() -> dict[str, list[str]]:
    """``{module path: [the names of the loggers it makes with logging.getLogger("...")]}``."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getLogger"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.setdefault(str(path.relative_to(PACKAGE)), []).append(node.args[0].value)
    return found


def test_no_two_modules_log_under_one_name() -> None:
    """A logger name belongs to one module: a line's ``name`` says which module wrote it."""
    owners = Counter(name for names in _logger_names().values() for name in set(names))
    assert [name for name, count in owners.items() if count > 1] == []


def test_every_logger_is_under_the_package() -> None:
    """Configuring ``telegram_fence`` configures every logger of the library."""
    names = [name for names in _logger_names().values() for name in names]
    assert names and all(name == "telegram_fence" or name.startswith("telegram_fence.") for name in names)
