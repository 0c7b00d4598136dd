"""What an index would publish: the sdist and wheel `python -m build` makes, installed and checked as a user would.

The two `package` tests build once per run (about 15 s) from a copy of the source tree (nothing is written into the
checkout), install the wheel in a fresh venv (pip reaches the configured index for the dependencies) and run the
sdist's own tests. CI runs them; `-m "not package"` leaves them out of a quick local run.
"""

from __future__ import annotations

import configparser
import email
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
TEST_COMMAND = 'pip install -e ".[test]" && pytest'
DEMO_COMMAND = "pip install . && telegram-fence demo"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")

#: What the copy of the source tree leaves out (caches, local databases, earlier builds).
_IGNORE = shutil.ignore_patterns(
    ".git", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", ".mypy_cache", "*.egg-info", "build", "dist",
    "*.db", "*.db-wal", "*.db-shm", ".venv*",
)


def _clean_env() -> dict[str, str]:
    """The environment without PYTHONPATH, so a child imports the installed package, not this checkout, and without
    PYTEST_ADDOPTS (a selection made for this run, such as CI's ``-m 'drill or package'``, is not the sdist's)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """Run ``args``; return stdout and stderr together; fail the test (with the output) when it exits non-zero."""
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{output[-4000:]}"
    return output


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory holding the sdist and the wheel `python -m build` made (the wheel built from the sdist)."""
    base = tmp_path_factory.mktemp("package")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=_IGNORE)
    out = base / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], cwd=base, env=_clean_env())
    yield out


def _only(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {directory}, found {found}"
    return found[0]


@pytest.mark.package
def test_the_wheel_installs_in_a_fresh_venv_runs_the_demo_and_passes_twine_check(dist: Path, tmp_path: Path) -> None:
    """The wheel carries LICENSE and full metadata, passes `twine check --strict`, and runs `telegram-fence demo`."""
    wheel, sdist = _only(dist, "*.whl"), _only(dist, "*.tar.gz")
    output = _run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)], cwd=tmp_path)
    assert output.count("PASSED") == 2, output

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = email.message_from_bytes(archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))))
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert not any(n.startswith(("tests/", "docs/")) for n in names), "the wheel carries only the package"
    classifiers = metadata.get_all("Classifier") or []
    for version in PYTHONS:
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "License :: OSI Approved :: MIT License" in classifiers and "Typing :: Typed" in classifiers
    assert metadata["Author"] and metadata.get_all("Project-URL"), "authors and project URLs are set"
    assert "](docs/" not in metadata.get_payload(), "the long description links docs/ relatively"

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path, env=_clean_env())
    where = _run([str(venv / "bin" / "python"), "-c", "import telegram_fence; print(telegram_fence.__file__)"],
                 cwd=tmp_path, env=_clean_env())
    assert str(venv) in where, f"imported from {where!r}, not from the venv"
    demo = _run([str(venv / "bin" / "telegram-fence"), "demo", "--updates", "60", "--kills", "1"],
                cwd=tmp_path, env=_clean_env())
    assert "OK: nothing lost, nothing written twice" in demo, demo


@pytest.mark.package
def test_the_sdist_carries_its_test_suite_and_its_tests_run(dist: Path, tmp_path: Path) -> None:
    """The sdist holds every test module and support file of tests/; the whole suite collects and a subset passes."""
    sdist = _only(dist, "*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data") if sys.version_info >= (3, 12) else archive.extractall(tmp_path)
    unpacked = _only(tmp_path, "telegram_fence-*")
    ours = {p.name for p in (ROOT / "tests").glob("*.py")}
    theirs = {p.name for p in (unpacked / "tests").glob("*.py")}
    assert ours <= theirs, f"missing from the sdist: {sorted(ours - theirs)}"
    assert (unpacked / "LICENSE").is_file() and (unpacked / "docs" / "architecture.md").is_file()
    assert sorted(p.name for p in (unpacked / "examples").glob("*.py")) == sorted(
        p.name for p in (ROOT / "examples").glob("*.py")
    )
    env = dict(_clean_env(), PYTHONPATH=str(unpacked))  # the sdist's own code, not this checkout's
    pytest_cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    collected = _run([*pytest_cmd, "--collect-only"], cwd=unpacked, env=env)
    assert re.search(r"\d+ tests? collected", collected) and "error" not in collected.lower().split("collected")[-1]
    ran = _run([*pytest_cmd, "tests/test_layers.py", "tests/test_updates.py", "tests/test_store_snapshot.py"],
               cwd=unpacked, env=env)
    assert re.search(r"\d+ passed", ran) and "failed" not in ran, ran


def test_the_readme_starts_with_the_two_set_up_commands_and_ci_runs_the_test_one() -> None:
    """README.md opens with a code block of exactly the demo and the test command; .ci/run runs that test command."""
    match = re.match(r"```\n(.*?)\n```\n", README, re.DOTALL)
    assert match is not None, "README.md must start with a code block"
    assert match.group(1).splitlines() == [DEMO_COMMAND, TEST_COMMAND]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert TEST_COMMAND in [line.strip() for line in ci.splitlines()], ".ci/run must run the README's test command"


def test_the_readme_reads_well_on_an_index_page() -> None:
    """README.md (the long description) has no relative links and tells a user `pip install telegram_fence`."""
    relative = [link for link in re.findall(r"\]\(([^)]+)\)", README) if not link.startswith(("https://", "#"))]
    assert relative == [], f"relative links break on an index page: {relative}"
    assert "pip install telegram_fence" in README
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License\n\nCopyright (c) 2026 the telegram")


def test_the_project_urls_and_the_readme_links_name_one_repository() -> None:
    """setup.cfg's home page and project URLs and every repository link of README.md start with one address
    (a placeholder until there is a public repository: changed in one place, it must be changed in both)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    home = config["metadata"]["url"]
    urls = dict(line.split(" = ", 1) for line in config["metadata"]["project_urls"].strip().splitlines())
    assert urls["Source"] == home and set(urls) == {"Source", "Documentation", "Issues", "Changelog"}
    assert all(url == home or url.startswith(home + "/") for url in urls.values()), urls
    links = re.findall(r"\]\((https://github\.com/[^)]+)\)", README)
    assert links, "README.md links no file of the repository"
    assert all(link == home or link.startswith(home + "/blob/main/") for link in links), links
    missing = [link for link in links if link != home
               and not (ROOT / link.removeprefix(home + "/blob/main/").partition("#")[0]).is_file()]
    assert missing == [], f"README.md links files the repository does not have: {missing}"


def _imported_at_run_time(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports when it runs (``if TYPE_CHECKING:`` blocks left out;
    relative imports left out)."""
    import ast

    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                names.update(alias.name.partition(".")[0] for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names.add(child.module.partition(".")[0])
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return names


def test_the_postgres_extra_installs_what_the_postgres_store_imports_and_nothing_more() -> None:
    """setup.cfg's ``postgres`` extra names exactly the distributions ``telegram_fence.store.postgres`` imports when it
    runs: psycopg, not psycopg_pool (the store opens its own sessions)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    extra = [line.strip() for line in config["options.extras_require"]["postgres"].splitlines() if line.strip()]
    required = {re.split(r"[\[<>=!~; ]", line, maxsplit=1)[0].lower().replace("-", "_") for line in extra}
    imported: set[str] = set()
    for path in sorted((ROOT / "telegram_fence" / "store" / "postgres").glob("*.py")):
        imported |= _imported_at_run_time(path)
    third_party = {name for name in imported if name not in sys.stdlib_module_names and name != "telegram_fence"}
    assert third_party == {"psycopg"}, third_party
    assert required == third_party, f"the extra names {sorted(required)}; the store imports {sorted(third_party)}"
