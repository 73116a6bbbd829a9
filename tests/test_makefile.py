"""The README's two commands: `make serve` installs the server alone, `make test` the rest."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def planned_installs(target: str, venv: Path) -> list[str]:
    """The pip commands `make TARGET` would run on a machine with no .venv yet (a dry run)."""
    out = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={venv}"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [line for line in out.splitlines() if "pip install" in line]


def extras(project: Path = ROOT) -> dict[str, list[str]]:
    return tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]


def test_make_serve_installs_no_test_bench_or_ray_package(tmp_path: Path):
    installs = planned_installs("serve", tmp_path / "venv")
    assert any(re.search(r"-e \.(\s|$)", line) for line in installs), installs  # the server itself
    for line in installs:
        assert "[" not in line, f"`make serve` installs an extra: {line}"
        assert " -r " not in line, f"`make serve` installs a requirements file (the test oracle): {line}"


def test_make_test_installs_every_extra_and_the_oracle(tmp_path: Path):
    installs = " ".join(planned_installs("test", tmp_path / "venv"))
    for extra in extras():
        assert re.search(rf"\.\[[^\]]*\b{extra}\b", installs), f"`make test` lacks the {extra} extra"
    assert "oracle-requirements.txt" in installs


def test_make_test_installs_every_client_extra_with_the_server_in_one_resolution(tmp_path: Path):
    # The framework extras (Pipecat, LiveKit) and Ray disagree about protobuf's newest
    # versions: installed in two pip runs, the second would break the first's packages.
    installs = planned_installs("test", tmp_path / "venv")
    for extra in extras(ROOT / "clients/python"):
        together = [line for line in installs if re.search(rf"clients/python\[[^\]]*\b{extra}\b", line)]
        assert together, f"`make test` lacks the client's {extra} extra"
        assert all(re.search(r"-e '?\.\[", line) for line in together), together

