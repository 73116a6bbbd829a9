"""What ``voxwire bench`` needs installed: the server's dependencies (a `make serve`
install) plus the ``bench`` extra, and nothing from the ``test`` extra. Without the extra
it says so in one line, naming the command that installs it."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from voxwire.benchmarks.bench import BENCH_EXTRA

ROOT = Path(__file__).resolve().parents[2]
BENCH = "voxwire.benchmarks.bench"
LOCAL_DISTRIBUTIONS = {"voxwire", "voxwire-client"}
"""The project's own: voxwire-client (clients/python) is not on an index, so the server's
distribution cannot declare it; `make serve` installs it beside the server."""


def normalised(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: list[str]) -> set[str]:
    return {normalised(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in requirements}  # type: ignore[union-attr]


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def source_of(module: str) -> Path | None:
    """The file of one of the benchmarks' modules in this checkout; None for any other."""
    parts = module.split(".")
    if parts[:2] != ["voxwire", "benchmarks"]:
        return None
    base = ROOT.joinpath("benchmarks", *parts[2:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None  # a name imported from a module (`from x import y`), not a module


def imported_names(path: Path) -> set[str]:
    """Every module name a file imports, lazily inside functions too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return names


def third_party_imports(start: str) -> dict[str, str]:
    """The top-level modules outside the standard library and the project that ``start``
    and the benchmark modules it imports (transitively) import, each with one importer.
    The engine and server modules it reaches are the server's, whose dependencies every
    install has."""
    found: dict[str, str] = {}
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        path = source_of(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        for name in imported_names(path):
            top = name.partition(".")[0]
            if top == "voxwire":
                todo.append(name)
            elif top not in sys.stdlib_module_names:
                found.setdefault(top, module)
    return found


def test_every_module_the_bench_imports_is_a_dependency_or_in_the_bench_extra():
    """httpx was imported by the bench and declared only in the test extra: a `make serve`
    install plus the bench extra could not start `voxwire bench`."""
    declared = requirement_names(project()["dependencies"]) | requirement_names(
        project()["optional-dependencies"]["bench"]) | LOCAL_DISTRIBUTIONS
    # Which distribution gives each module: read from this environment, which has them all.
    givers = importlib.metadata.packages_distributions()
    imports = third_party_imports(BENCH)
    assert "httpx" in imports and "matplotlib" in imports  # the walk reaches lazy imports
    undeclared = {
        module: (importer, givers.get(module)) for module, importer in imports.items()
        if not {normalised(d) for d in givers.get(module, [module])} & declared
    }
    assert undeclared == {}, "imported by the bench, declared by neither the server nor the bench extra"


def test_the_bench_checks_for_every_distribution_of_its_extra():
    assert set(map(normalised, BENCH_EXTRA)) == requirement_names(project()["optional-dependencies"]["bench"])
    givers = importlib.metadata.packages_distributions()
    for distribution, module in BENCH_EXTRA.items():
        assert normalised(distribution) in {normalised(d) for d in givers.get(module, [])}, (distribution, module)


# Runs `voxwire bench` as its console script does (voxwire.cli.main), with the named
# modules made unfindable as on an install that lacks them: each import finder is
# wrapped so that it finds nothing by those names, and `import httpx` fails just as it
# does where httpx was never installed.
HIDING_RUN = """
import sys
hidden = set(sys.argv[1].split(","))

class Hiding:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attribute):
        return getattr(self.finder, attribute)

sys.meta_path[:] = [Hiding(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
from voxwire.cli import main
sys.exit(main(sys.argv[2:]))
"""


def bench_without(hidden: list[str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", HIDING_RUN, ",".join(hidden), "bench", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("hidden", [["httpx"], sorted(set(BENCH_EXTRA.values()) - {"wyoming"})],
                         ids=["httpx alone", "the whole extra"])
def test_without_the_bench_extra_the_bench_says_which_extra_in_one_line(tmp_path, hidden):
    # (wyoming is also the server's own dependency: no install lacks it.)
    run = bench_without(hidden, "--tiny", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert line.startswith("voxwire bench: the bench extra is not installed (no module ")
    assert all(module in line for module in hidden), line
    # This checkout's Voxwire is installed editable: the extra comes from the checkout.
    assert line.endswith(f"-m pip install -e '{ROOT}[bench]'"), line
    assert not (tmp_path / "out").exists()  # nothing was measured


def test_help_needs_no_bench_extra(tmp_path):
    run = bench_without(sorted(BENCH_EXTRA.values()), "--help", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "--url" in run.stdout
