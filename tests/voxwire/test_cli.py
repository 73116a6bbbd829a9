"""The ``voxwire`` command: one owner, three subcommands, each dispatched to its part."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*args], capture_output=True, text=True, timeout=120)


def scripts(pyproject: Path) -> dict[str, str]:
    return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["scripts"]


def test_each_command_has_one_owner():
    server, client = scripts(ROOT / "pyproject.toml"), scripts(ROOT / "clients/python/pyproject.toml")
    assert not set(server) & set(client), "two distributions install the same command"
    assert server == {"voxwire": "voxwire.cli:main"}
    assert client == {"voxwire-say": "voxwire_client.cli:say_command"}


def test_help_lists_every_subcommand():
    r = run(sys.executable, "-m", "voxwire", "--help")
    assert r.returncode == 0
    for command in ("serve", "say", "bench"):
        assert command in r.stdout


@pytest.mark.parametrize(
    "command,says", [("serve", "--piper-backend"), ("say", "--sample-rate"), ("bench", "--quick")]
)
def test_each_subcommand_reaches_its_part(command, says):
    r = run(sys.executable, "-m", "voxwire", command, "--help")
    assert r.returncode == 0 and says in r.stdout and f"usage: voxwire {command}" in r.stdout


def test_an_unknown_or_missing_command_is_a_usage_error():
    assert run(sys.executable, "-m", "voxwire", "speak").returncode == 2
    assert run(sys.executable, "-m", "voxwire").returncode == 2


@pytest.mark.parametrize("script,args,says", [("voxwire", ["serve", "--help"], "--engine"), ("voxwire-say", ["--help"], "--url")])
def test_the_installed_commands_run(script, args, says):
    """What `make install` puts in the environment's bin/ (run `make install` if missing)."""
    path = Path(sysconfig.get_path("scripts")) / script
    assert path.exists(), f"{path} is not installed; run make install"
    r = run(str(path), *args)
    assert r.returncode == 0 and says in r.stdout, r.stderr
