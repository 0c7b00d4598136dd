"""The package's layers: imports flow one way (CLI → runtime → ingress/delivery → store → errors/updates).

Reads every module's imports with ``ast`` (nothing is imported or run), resolves relative imports, and checks
each import of another ``telegram_fence`` module against the layer table below, including imports made inside
functions and under ``TYPE_CHECKING``. Also checks that the module graph has no cycle, counting those imports too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "telegram_fence"

#: The layer of each part of the package: a module may import its own layer or lower ones, never higher.
LAYERS: dict[str, int] = {
    "errors": 0,
    "updates": 0,
    "store": 1,
    "telegram": 1,
    "retry": 1,
    "jsonlog": 1,
    "http_serving": 1,
    "textlog": 1,
    "ingress": 2,
    "delivery": 2,
    "calls": 2,
    "files": 2,
    "runtime": 3,
    "conversation": 3,
    "steps": 3,
    "cli": 4,
    "testing": 4,
    "__init__": 5,
    "__main__": 5,
    "_version": 0,
    "records": 0,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _part(module: str) -> str:
    """The layer key of a module name: its first part below ``telegram_fence`` (or the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """``(line, imported module, at module level)`` for every import of a ``telegram_fence`` module in ``path``."""
    return _imports_of(path.read_text(), _module_name(path), path.name == "__init__.py")


def _is_module(name: str) -> bool:
    relative = Path(*name.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative / "__init__.py").is_file()


def _imports_of(source: str, name: str, is_package: bool) -> list[tuple[int, str, bool]]:
    """The imports of ``source``, the text of module ``name``, as :func:`_imports` gives them."""
    tree = ast.parse(source)
    package = name if is_package else name.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # "from . import x" imports the submodule origin.x when there is one, else a name of origin itself
            targets = [
                f"{origin}.{alias.name}" if _is_module(f"{origin}.{alias.name}") else origin for alias in node.names
            ]
        for target in targets:
            if target == "telegram_fence" or target.startswith("telegram_fence."):
                found.append((node.lineno, target, id(node) in top_level))
    return found


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_part_of_the_package_has_a_layer() -> None:
    """Each top-level module or subpackage of telegram_fence is placed in the layer table (a new one must be)."""
    parts = {_part(_module_name(path)) for path in _modules()}
    assert parts <= set(LAYERS), f"not in the layer table: {sorted(parts - set(LAYERS))}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_layer_above_its_own(path: Path) -> None:
    """A module imports only modules of its own layer or below (lazy imports inside functions included)."""
    own = LAYERS[_part(_module_name(path))]
    wrong = []
    for line, target, _ in _imports(path):
        level = LAYERS["__init__"] if target == "telegram_fence" else LAYERS.get(_part(target), -1)
        if level > own:
            wrong.append(f"line {line}: imports {target} (layer {level}) from layer {own}")
    assert not wrong, "\n".join(wrong)


def test_the_layer_check_sees_every_kind_of_import() -> None:
    """The import reader sees relative, absolute, function-level and package-name imports (the layer test can fail)."""
    source = (
        "from ..runtime import fence\n"
        "import telegram_fence.cli\n"
        "from .. import __version__\n"
        "def f():\n"
        "    from telegram_fence.ingress.poller import Poller\n"
    )
    found = _imports_of(source, "telegram_fence.store.probe", False)
    assert sorted((target, top) for _, target, top in found) == [
        ("telegram_fence", True),
        ("telegram_fence.cli", True),
        ("telegram_fence.ingress.poller", False),
        ("telegram_fence.runtime.fence", True),
    ]


def _graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module → the package modules it imports, from ``{name: (source, is_package)}``; every import counts.

    Lazy (function-level) and ``TYPE_CHECKING`` imports count as much as module-level ones, and a
    submodule importing its own package counts as an edge to that package's ``__init__``.
    """
    graph: dict[str, set[str]] = {}
    for name, (source, is_package) in sources.items():
        edges = set()
        for _, target, _ in _imports_of(source, name, is_package):
            while target not in sources and "." in target:
                target = target.rpartition(".")[0]
            if target != name and target in sources:
                edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (each sorted)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_counting_lazy_and_type_checking_imports() -> None:
    """No two modules of the package import each other, directly or around a circle, by any kind of import."""
    sources = {_module_name(path): (path.read_text(), path.name == "__init__.py") for path in _modules()}
    cycles = _cycles(_graph(sources))
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_sees_lazy_and_type_checking_imports() -> None:
    """A circle closed only by a TYPE_CHECKING or a function-level import is found (the cycle test can fail)."""
    sources = {
        "telegram_fence.runtime": ("", True),
        "telegram_fence.runtime.a": ("from .b import B\n", False),
        "telegram_fence.runtime.b": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n",
                                     False),
        "telegram_fence.runtime.c": ("def f():\n    from telegram_fence.runtime.a import g\n", False),
        "telegram_fence.runtime.d": ("from telegram_fence.runtime import a\n", False),
    }
    assert _cycles(_graph(sources)) == [
        ["telegram_fence.runtime.a", "telegram_fence.runtime.b", "telegram_fence.runtime.c"]
    ]


def test_the_architecture_module_table_matches_the_tree() -> None:
    """docs/architecture.md's module table names every module of the package, each in its layer, and no other."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("## Modules"):text.index("## Store contract")]
    rows = re.findall(r"^\| (\d) \| `([\w.]+)` \|", section, re.M)
    listed = {name: int(layer) for layer, name in rows}
    tree = {_module_name(path).removeprefix("telegram_fence.") for path in _modules()} - {"telegram_fence"}
    assert sorted(tree - set(listed)) == [], "modules missing from docs/architecture.md"
    assert sorted(set(listed) - tree) == [], "docs/architecture.md lists modules that do not exist"
    wrong = {name: layer for name, layer in listed.items() if LAYERS[name.split(".")[0]] != layer}
    assert not wrong, f"modules listed in the wrong layer: {wrong}"


def _defined_names(path: Path) -> set[str]:
    """``func``, ``Class`` and ``Class.method`` for everything defined at the top of ``path`` or in its classes."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{item.name}" for item in node.body if isinstance(item, ast.FunctionDef)}
    return names


def test_the_path_of_an_update_in_the_architecture_names_code_that_exists() -> None:
    """Each ``file:function`` step of docs/architecture.md's path of an update names a function of that file, and
    each of the two doors is drawn in at most eight numbered steps."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("## The path of one update"):text.index("The same path drawn")]
    steps = re.findall(r"`([\w/]+\.py):([\w.]+)`", section)
    assert len(steps) >= 15
    missing = [f"{file}:{name}" for file, name in steps if name not in _defined_names(PACKAGE / file)]
    assert missing == []
    doors = section.split("Through the ")[1:]
    assert len(doors) == 2
    for door in doors:
        numbered = re.findall(r"^(\d+)\. ", door, re.M)
        assert 0 < len(numbered) <= 8 and numbered == [str(i) for i in range(1, len(numbered) + 1)]


def test_no_class_of_the_runtime_or_the_doors_is_longer_than_350_lines() -> None:
    """Every class in ``runtime`` and ``ingress`` fits in 350 lines, docstrings included."""
    long = {}
    for folder in ("runtime", "ingress"):
        for path in sorted((PACKAGE / folder).glob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    size = node.end_lineno - node.lineno + 1
                    if size > 350:
                        long[f"{folder}/{path.name}:{node.name}"] = size
    assert long == {}
