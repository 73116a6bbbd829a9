"""One settings object: TOML file < VOXWIRE_* environment < command-line flags."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from server import config_loader
from server.config import ServerConfig


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    config_loader.add_arguments(p)
    return p.parse_args(argv)


TOML = """
port = 9100
cache_mb = 8
voice = "x"

[limits]
max_text_chars = 500
idle_timeout_seconds = 12.5

[auth]
api_keys = ["from-file"]

[engine]
piper_backend = "onnx"
"""


def test_precedence_file_then_env_then_flags(tmp_path: Path):
    path = tmp_path / "voxwire.toml"
    path.write_text(TOML.replace('voice = "x"\n', ""))
    env = {"VOXWIRE_CONFIG": str(path), "VOXWIRE_PORT": "9200", "VOXWIRE_MAX_TEXT_CHARS": "600",
           "VOXWIRE_ALLOWED_ORIGINS": "https://a.example,https://b.example"}
    config = config_loader.load(parse(["--port", "9300", "--api-key", "k1", "--api-key", "k2"]), env)
    assert config.port == 9300  # flag over env over file
    assert config.limits.max_text_chars == 600  # env over file
    assert config.limits.idle_timeout_seconds == 12.5 and config.cache_mb == 8  # file
    assert config.auth.api_keys == ("k1", "k2")  # flags over file
    assert config.auth.allowed_origins == ("https://a.example", "https://b.example")
    assert config.engine.piper_backend == "onnx"
    assert config.limits.max_connections == ServerConfig().limits.max_connections  # untouched: the default


def test_defaults_when_nothing_is_given():
    assert config_loader.load(parse([]), {}) == ServerConfig()


@pytest.mark.parametrize(
    "toml,env,message",
    [
        ("prot = 1\n", {}, "unknown setting prot"),
        ("[limits]\nmax_txt = 1\n", {}, "unknown setting [limits] max_txt"),
        ("port = 'eighty'\n", {}, "port must be int"),
        ("", {"VOXWIRE_LOG_FORMAT": "xml"}, "log_format must be one of"),
        ("", {"VOXWIRE_LOG_TEXT": "maybe"}, "log_text must be bool"),
        ("port = = 1\n", {}, "not valid TOML"),
        ("chunk_ms = 150\n", {}, "unknown setting chunk_ms; did you mean default_chunk_ms?"),
        ("[limits]\nmax_text_char = 1\n", {}, "did you mean [limits] max_text_chars?"),
        ("[limits]\nidle_timeout_seconds = 0\n", {}, "must be at least 0.1, got 0"),
        ("", {"VOXWIRE_SAMPLE_RATE": "96000"}, "must be from 8000 to 48000, got 96000"),
    ],
)
def test_mistakes_are_errors(tmp_path: Path, toml, env, message):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(config_loader.SettingsError) as e:
        config_loader.load(parse(["--config", str(path)]), env)
    assert message in str(e.value)


def test_env_round_trip():
    config = config_loader.load(parse(["--api-key", "a", "--max-text-chars", "77", "--no-log-text"]), {})
    assert config_loader.load(parse([]), config_loader.to_env(config)) == config


def test_serve_help_documents_every_setting():
    out = subprocess.run(
        [sys.executable, "-m", "server", "serve", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for s in config_loader.settings():
        assert f"--{s.flag}" in out, s.flag
        assert s.env in out.replace("\n", "").replace(" ", ""), s.env


def test_a_bad_setting_stops_serve_with_a_clear_message(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, "-m", "server", "serve", "--port", "not-a-port"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "port must be int" in run.stderr
