"""The store's contract module: where the protocols and value types live, and who imports them from where."""

from __future__ import annotations

import ast
from pathlib import Path

import telegram_fence.store as store_package
from telegram_fence.store import contract

STORE = Path(__file__).resolve().parent.parent / "telegram_fence" / "store"


def _imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Every module ``path`` (or ``source`` read as that file) imports, function-level and TYPE_CHECKING ones too."""
    package = list(path.relative_to(STORE.parent.parent).parts[:-1])
    found: set[str] = set()
    text = path.read_text(encoding="utf-8") if source is None else source
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            origin = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                candidate = f"{origin}.{alias.name}"
                is_module = (STORE.parent.parent / Path(*candidate.split("."))).with_suffix(".py").is_file() or (
                    STORE.parent.parent / Path(*candidate.split(".")) / "__init__.py"
                ).is_file()
                found.add(candidate if is_module else origin)
    return found


def test_no_store_module_imports_the_store_package() -> None:
    """No module below telegram_fence.store imports the package __init__ (which imports the backends), so no cycle."""
    offenders = {
        str(path.relative_to(STORE)): "telegram_fence.store"
        for path in sorted(STORE.rglob("*.py"))
        if path.name != "__init__.py" or path.parent != STORE
        if "telegram_fence.store" in _imported_modules(path)
    }
    assert offenders == {}


def test_the_import_reader_sees_a_package_import() -> None:
    """The reader above resolves ``from .. import X`` in a backend module to the store package (the check can fail)."""
    probe = STORE / "sqlite" / "probe.py"
    assert "telegram_fence.store" in _imported_modules(probe, "def f():\n    from .. import Identity\n")
    assert "telegram_fence.store.contract" in _imported_modules(probe, "from ..contract import Identity\n")


def test_the_package_re_exports_the_contract() -> None:
    """``from telegram_fence.store import X`` gives the very objects defined in telegram_fence.store.contract."""
    for name in contract.__all__:
        assert getattr(store_package, name) is getattr(contract, name), name
    assert set(contract.__all__) <= set(store_package.__all__)
