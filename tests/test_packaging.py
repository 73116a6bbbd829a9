"""What installing Voxwire puts into an environment: one top-level name, ``voxwire``.

The repository keeps server/, engine/ and benchmarks/ at its top (the design card's
layout); pyproject.toml maps them under ``voxwire``, so that no one else's ``server``
or ``engine`` package is shadowed by ours, nor ours by theirs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def setuptools_table() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def test_every_folder_is_packaged_under_voxwire():
    table = setuptools_table()
    folders = table["package-dir"]
    assert set(folders) == {"voxwire", "voxwire.server", "voxwire.engine", "voxwire.benchmarks", "voxwire.clients.js"}
    on_disk = set()
    for package, folder in folders.items():
        if not (ROOT / folder / "__init__.py").exists():  # data only: the browser client
            assert table["package-data"].get(package), f"{folder} has no __init__.py and ships no files"
            on_disk.add(package)
            continue
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            on_disk.add(".".join((package, *parts)))
    assert set(table["packages"]) == on_disk, "pyproject.toml's package list and the folders differ"


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
    for folder in setuptools_table()["package-dir"].values():
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
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
