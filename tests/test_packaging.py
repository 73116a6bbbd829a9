"""What installing Voxwire puts into an environment: one top-level name, ``voxwire``.

The repository keeps server/, engine/ and benchmarks/ at its top (the design card's
layout); voxwire/ links to them (voxwire/server is a link to ../server), so that they are
``voxwire``'s subpackages, no one else's ``server`` or ``engine`` package is shadowed by
ours, nor ours by theirs, and static tools follow the imports with no mapping.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


LINKS = {"server": "../server", "engine": "../engine", "benchmarks": "../benchmarks", "clients/js": "../../clients/js"}
"""voxwire/'s links to the top-level folders."""
UNINSTALLED = ("voxwire.benchmarks.studies",)
"""Packages in the checkout that the wheel leaves out: the one-off studies."""


def setuptools_table() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def test_voxwire_links_to_the_top_level_folders_and_maps_nothing():
    for name, target in LINKS.items():
        link = ROOT / "voxwire" / name
        assert link.is_symlink() and os.readlink(link) == target, link
    # The root, as found by the import system: no folder mapped elsewhere, so no import hook.
    assert setuptools_table()["package-dir"] == {"": "."}


def packages_on_disk() -> set[str]:
    """The packages under voxwire/, through its links: folders with an __init__.py, and the
    data-only browser client."""
    found = {"voxwire.clients.js"}
    for folder, _, files in os.walk(ROOT / "voxwire", followlinks=True):
        if "__init__.py" in files and "__pycache__" not in folder:
            found.add(".".join(Path(folder).relative_to(ROOT).parts))
    return found


def test_every_folder_is_packaged_under_voxwire_but_the_studies():
    table = setuptools_table()
    assert table["package-data"].get("voxwire.clients.js"), "the browser client ships no files"
    packaged = set(table["packages"])
    assert not {p for p in packaged if p.startswith(UNINSTALLED)}, "a study would be installed"
    expected = {p for p in packages_on_disk() if not p.startswith(UNINSTALLED)}
    assert packaged == expected, "pyproject.toml's package list and the folders differ"


def first_party_imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module


def test_nothing_imports_a_top_level_folder_by_its_own_name():
    """The editable install puts the checkout's root on the path, where ``import server``
    would work; installed from the wheel it fails. Every import names ``voxwire.``."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for top in ("voxwire", *LINKS)
        for path in sorted((ROOT / top).rglob("*.py"))
        for line, name in first_party_imports(path)
        if name.partition(".")[0] in {"server", "engine", "benchmarks", "clients"}
    ]
    assert wrong == []


@pytest.mark.slow
def test_an_installed_voxwire_adds_only_its_own_name(tmp_path):
    """Built as a wheel and installed into a fresh environment (its dependencies lent by
    this one's site-packages): the distribution's files sit under one top-level name,
    the browser client's files come with it, ``import server`` fails, and
    ``python -m voxwire serve --help`` works."""
    # Built from a copy: setuptools leaves build/ in the tree it builds, and a stale
    # build/ there would put modules that no longer exist into the next wheel.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    # As deploy/Dockerfile copies it: voxwire/ with its links, and the folders they name.
    ignore = shutil.ignore_patterns("__pycache__", "node_modules")
    shutil.copytree(ROOT / "voxwire", source / "voxwire", symlinks=True, ignore=ignore)
    for folder in ("server", "engine", "benchmarks", "clients/js"):
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels),
         str(source)], capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("voxwire-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # The dependencies (torch and the rest) from this environment, after the fresh one's own
    # packages: a plain path line, so this environment's editable Voxwire is not loaded.
    (site / "zz-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*code: str) -> subprocess.CompletedProcess[str]:
        # Away from the checkout, whose folders would otherwise be found first.
        return subprocess.run([python, *code], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)

    names = run("-c", "from importlib.metadata import distribution\n"
                      "files = distribution('voxwire').files\n"
                      "print(' '.join(sorted({f.parts[0] for f in files if not f.parts[0].endswith('.dist-info')"
                      " and f.parts[0] != '..'})))")
    assert names.returncode == 0, names.stderr
    assert names.stdout.split() == ["voxwire"]
    studies = run("-c", "from importlib.metadata import distribution\n"
                        "print(*(f for f in distribution('voxwire').files if 'studies' in f.parts))")
    assert studies.returncode == 0 and studies.stdout.strip() == "", studies.stdout + studies.stderr
    where = run("-c", "import voxwire.server.app, voxwire.engine.worker; print(voxwire.server.app.__file__)")
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(site)), "the installed package was not the one imported"
    # The browser client the server serves at /client/ came with it, every file it serves.
    client = run("-c", "from voxwire.server.app import JS_CLIENT_DIR as d\n"
                       "from voxwire.server.client_files import shipped_files\n"
                       "print(d, *sorted(n for n in shipped_files(d) if not (d / n).is_file()))")
    assert client.returncode == 0, client.stderr
    directory, *missing = client.stdout.split()
    assert directory.startswith(str(site)) and not missing, client.stdout
    for name in ("server", "engine", "benchmarks"):
        gone = run("-c", f"import {name}")
        assert gone.returncode != 0 and f"No module named '{name}'" in gone.stderr
    serve = run("-m", "voxwire", "serve", "--help")
    assert serve.returncode == 0, serve.stderr
    assert "--engine" in serve.stdout and "--wyoming-port" in serve.stdout
