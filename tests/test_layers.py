"""The layers, read from the source: no import runs the wrong way, and no modules import
each other in a cycle.

From the bottom up: engine/ (voxwire.engine: models, worker, text) knows nothing above
it; server/ (voxwire.server) is built on engine/; the client
(clients/python/voxwire_client) speaks the protocol and shares no code with either;
benchmarks/ (voxwire.benchmarks) measure the server and the engines; the ``voxwire``
command (voxwire/) sits above them all. tests/ may import anything, and nothing imports
tests/.

Every import counts: at module level, inside functions (lazy imports), and under
``if TYPE_CHECKING:`` (a type-only import still ties one module to the other, and a
type-only cycle is a cycle in the design).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Where each layer's source lives, relative to the repository root: the folders are the
# subpackages of ``voxwire`` (pyproject.toml's package-dir).
SOURCES = {
    "voxwire.engine": Path("engine"),
    "voxwire.server": Path("server"),
    "voxwire.benchmarks": Path("benchmarks"),
    "voxwire_client": Path("clients/python/voxwire_client"),
    "voxwire": Path("voxwire"),
}

# What each layer must not import (by layer).
FORBIDDEN = {
    "voxwire.engine": {"voxwire.server", "voxwire.benchmarks", "voxwire_client", "voxwire", "tests"},
    "voxwire.server": {"voxwire.benchmarks", "voxwire_client", "voxwire", "tests"},
    "voxwire_client": {"voxwire.server", "voxwire.engine", "voxwire.benchmarks", "voxwire", "tests"},
    "voxwire.benchmarks": {"voxwire", "tests"},
    "voxwire": {"tests"},
}


def layer_of(module: str, sources: dict[str, Path] = SOURCES) -> str:
    """The layer a module belongs to: the longest layer name it is in (voxwire.server.app
    is in voxwire.server, voxwire.cli in voxwire), else its top-level package."""
    within = [name for name in sources if module == name or module.startswith(name + ".")]
    return max(within, key=len) if within else module.split(".")[0]


DOORS = "voxwire.server.doors"
"""The doors' package: the registry (its __init__) and the base may be imported by any
server code; each other module or package in it is one door, which no other door and no
shared server code may import."""


def door_of(module: str) -> str | None:
    """The door a module is part of (voxwire.server.doors.websocket.session: websocket),
    None for the registry, the base and everything outside the doors."""
    if not module.startswith(DOORS + "."):
        return None
    name = module[len(DOORS) + 1:].split(".")[0]
    return None if name == "base" else name


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, e.g. server.cli
    target: str  # the module imported, as precisely as known, e.g. engine.audio_queue
    line: int
    path: Path

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target}"


def module_files(root: Path, sources: dict[str, Path] = SOURCES) -> dict[str, Path]:
    """Every module of the scanned packages: dotted name -> file."""
    modules: dict[str, Path] = {}
    for package, folder in sources.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module named by ``from <...> import``, relative levels resolved."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _literal_import(node: ast.Call) -> str | None:
    """``importlib.import_module("x")`` and ``__import__("x")`` with a literal name."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
        value = node.args[0].value
        return value if isinstance(value, str) and not value.startswith(".") else None
    return None


def imports(root: Path, modules: dict[str, Path]) -> Iterator[Import]:
    """Every import in every module, wherever it is in the file (ast.walk visits function
    bodies and ``if TYPE_CHECKING:`` blocks alike). A name imported from a package is the
    submodule when there is one (``from engine import audio_queue``), else the package."""
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(root)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(module, alias.name, node.lineno, where)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, module, path.name == "__init__.py")
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    yield Import(module, sub if sub in modules else base, node.lineno, where)
            elif isinstance(node, ast.Call) and (name := _literal_import(node)):
                yield Import(module, name, node.lineno, where)


def wrong_way(found: list[Import], forbidden: dict[str, set[str]] = FORBIDDEN) -> list[Import]:
    bad = [i for i in found if layer_of(i.target) in forbidden.get(layer_of(i.source), set())]
    return list(dict.fromkeys(bad))  # once each, in file order


def door_crossings(found: list[Import]) -> list[Import]:
    """Imports of a door from another door, or from shared server code (the registry,
    which names every door, excepted)."""
    bad = [
        i for i in found
        if (door := door_of(i.target)) is not None and i.source != DOORS and door_of(i.source) != door
        and layer_of(i.source) == "voxwire.server"
    ]
    return list(dict.fromkeys(bad))


def _known(target: str, modules: dict[str, Path]) -> str | None:
    """The scanned module an import loads, if any (``engine.base.Engine`` -> engine.base)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def graph_of(found: list[Import], modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the scanned modules it imports."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in found:
        target = _known(i.target, modules)
        if target is not None:
            graph[i.source].add(target)
    return graph


def tangles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import each other in a cycle: Tarjan's strongly
    connected components of more than one module, or a module importing itself."""

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # recursive: a few hundred modules at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph[v]:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(groups)


def cycles(found: list[Import], modules: dict[str, Path]) -> list[list[str]]:
    """One cycle through each tangle, first module repeated at the end."""
    graph = graph_of(found, modules)
    return [_one_cycle(group, graph) for group in tangles(graph)]


def _one_cycle(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the group's first module, staying inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return [*group, start]  # unreachable for a strongly connected group


def test_no_import_runs_the_wrong_way():
    modules = module_files(ROOT)
    assert {"voxwire.engine.worker", "voxwire.server.app", "voxwire_client.client", "voxwire.benchmarks.bench",
            "voxwire.cli"} <= set(modules)
    bad = wrong_way(list(imports(ROOT, modules)))
    assert not bad, "imports against the layers:\n" + "\n".join(map(str, bad))


def test_doors_import_no_other_door_and_shared_code_imports_none():
    modules = module_files(ROOT)
    assert {door_of(m) for m in modules} >= {"websocket", "openai", "wyoming"}
    bad = door_crossings(list(imports(ROOT, modules)))
    assert not bad, "imports across doors, or of a door by shared code:\n" + "\n".join(map(str, bad))


def test_no_import_cycles():
    modules = module_files(ROOT)
    graph = graph_of(list(imports(ROOT, modules)), modules)
    found = tangles(graph)
    assert not found, "modules that import each other in a cycle:\n" + "\n".join(
        f"{', '.join(group)} (e.g. {' -> '.join(_one_cycle(group, graph))})" for group in found
    )


# -- the walk itself catches what it must: a tree with every kind of mistake ---------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_walk_finds_hidden_imports_and_cycles(tmp_path):
    _write(tmp_path, {
        "engine/__init__.py": "",
        "engine/base.py": "from voxwire.engine import worker\n",  # cycle: base -> worker -> base
        "engine/worker.py": "from .base import Engine\n",
        "engine/lazy.py": "def f():\n    from voxwire.server.app import create_app\n",
        "engine/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tests.fixtures\n",
        "engine/dynamic.py": "import importlib\nimportlib.import_module('voxwire.benchmarks.bench')\n",
        "server/__init__.py": "",
        "server/app.py": "from voxwire.engine.worker import Worker\n",  # the right way: not reported
        "server/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from voxwire.server.b import B\n",
        "server/b.py": "def g():\n    from . import a\n",  # a type-only, lazy cycle: a -> b -> a
        "clients/python/voxwire_client/__init__.py": "from voxwire_client.cli import main\n",
        "clients/python/voxwire_client/cli.py": "import voxwire.engine.base\n",
        "server/doors/__init__.py": "from voxwire.server.doors import ws, tcp\n",  # the registry: allowed
        "server/doors/base.py": "from voxwire.server.pipeline import Speech\n",
        "server/doors/ws/__init__.py": "from voxwire.server.doors.ws.session import S\n",  # its own part
        "server/doors/ws/session.py": "from voxwire.server.doors.base import Door\n",
        "server/doors/tcp.py": "from voxwire.server.doors.ws import session\n",  # another door's
        "server/pipeline.py": "",
        "server/service.py": "from voxwire.server.doors.base import Door\nfrom voxwire.server.doors import tcp\n",
        "benchmarks/__init__.py": "",
        "voxwire/__init__.py": "",
    })  # fmt: skip
    modules = module_files(tmp_path)
    found = list(imports(tmp_path, modules))
    bad = {(i.source, i.target) for i in wrong_way(found)}
    assert bad == {
        ("voxwire.engine.lazy", "voxwire.server.app"),
        ("voxwire.engine.typed", "tests.fixtures"),
        ("voxwire.engine.dynamic", "voxwire.benchmarks.bench"),
        ("voxwire_client.cli", "voxwire.engine.base"),
    }
    assert {(i.source, i.target) for i in door_crossings(found)} == {
        ("voxwire.server.doors.tcp", "voxwire.server.doors.ws.session"),
        ("voxwire.server.service", "voxwire.server.doors.tcp"),
    }
    assert cycles(found, modules) == [
        ["voxwire.engine.base", "voxwire.engine.worker", "voxwire.engine.base"],
        ["voxwire.server.a", "voxwire.server.b", "voxwire.server.a"],
    ]
