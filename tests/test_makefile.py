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



def dry_run(target: str, venv: Path) -> list[str]:
    """Every command `make TARGET` would run on a machine with no .venv yet, with no PYTEST_ARGS."""
    out = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={venv}", "PYTEST_ARGS="],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return out.splitlines()


def pytest_runs(lines: list[str]) -> list[str]:
    """What each pytest command is given, after `-m pytest`."""
    return [line.split("-m pytest", 1)[1].strip() for line in lines if "-m pytest" in line]


def test_make_check_runs_the_tests_not_marked_slow_with_the_test_install_and_no_os_packages(tmp_path: Path):
    check, test = dry_run("check", tmp_path / "venv"), dry_run("test", tmp_path / "venv")
    assert pytest_runs(check) == ['-m "not slow"'], check
    # The same install as `make test`, but not its system-packages step (Chromium, nginx, apt-get).
    assert planned_installs("check", tmp_path / "venv") == planned_installs("test", tmp_path / "venv")
    assert any("apt-get" in line for line in test), "the check below would prove nothing"
    assert not any("apt-get" in line or "chromium" in line for line in check), check


def test_make_test_runs_every_test_with_no_marker_filter(tmp_path: Path):
    runs = pytest_runs(dry_run("test", tmp_path / "venv"))
    assert runs == [""], runs


def test_make_check_and_make_test_type_check_before_their_tests(tmp_path: Path):
    # A prerequisite: where mypy fails, make stops, and the target fails with it.
    for target in ("check", "test"):
        lines = dry_run(target, tmp_path / "venv")
        checks = [i for i, line in enumerate(lines) if line.endswith("-m mypy")]
        tests = [i for i, line in enumerate(lines) if "-m pytest" in line]
        assert len(checks) == 1 and checks[0] < tests[0], lines
