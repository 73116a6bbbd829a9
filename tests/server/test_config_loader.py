"""One settings object: TOML file < VOXWIRE_* environment < command-line flags."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from voxwire.server import config_loader
from voxwire.server.audio import FORMATS
from voxwire.server.config import ServerConfig


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
    assert config.engine.precision == "auto"  # the default: bf16 where the device computes it natively
    assert config.limits.max_connections == ServerConfig().limits.max_connections  # untouched: the default


def test_defaults_when_nothing_is_given():
    assert config_loader.load(parse([]), {}) == ServerConfig()


@pytest.mark.parametrize(
    "toml,env,message",
    [
        ("prot = 1\n", {}, "unknown setting prot"),
        ("[limits]\nmax_txt = 1\n", {}, "unknown setting [limits] max_txt"),
        ("port = 'eighty'\n", {}, 'port = "eighty" must be an integer'),
        ("workers = 2.5\n", {}, "workers = 2.5 must be an integer"),
        ("", {"VOXWIRE_LOG_FORMAT": "xml"}, "VOXWIRE_LOG_FORMAT=xml: log_format must be one of auto, json, text"),
        ("", {"VOXWIRE_LOG_TEXT": "maybe"}, "VOXWIRE_LOG_TEXT=maybe: log_text must be true or false"),
        ("", {"VOXWIRE_PORT": ""}, "VOXWIRE_PORT=: port must be an integer"),
        ("", {"VOXWIRE_CACHE_MB": "nan"}, "VOXWIRE_CACHE_MB=nan: cache_mb must be a number"),
        ("port = = 1\n", {}, "not valid TOML"),
        ("chunk_ms = 150\n", {}, "unknown setting chunk_ms; did you mean default_chunk_ms?"),
        ("[limits]\nmax_text_char = 1\n", {}, "did you mean [limits] max_text_chars?"),
        ("[limits]\nidle_timeout_seconds = 0\n", {}, "[limits] idle_timeout_seconds = 0 must be at least 0.1"),
        ("", {"VOXWIRE_SAMPLE_RATE": "96000"}, "VOXWIRE_SAMPLE_RATE=96000: default_sample_rate must be from 8000 to 48000"),
        ("", {"VOXWIRE_PRECISION": "fp64"}, "VOXWIRE_PRECISION=fp64: [engine] precision must be one of auto, fp32, bf16"),
        ("[engine]\nprecision = 'int4'\n", {}, '[engine] precision = "int4" must be one of auto, fp32, bf16'),
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
        [sys.executable, "-m", "voxwire", "serve", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for s in config_loader.settings():
        assert f"--{s.flag}" in out, s.flag
        assert s.env in out.replace("\n", "").replace(" ", ""), s.env


def test_a_bad_setting_stops_serve_with_a_clear_message(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, "-m", "voxwire", "serve", "--port", "not-a-port"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and run.stderr == "voxwire: --port not-a-port: port must be an integer\n"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("source", ["flag", "env", "file"])
def test_every_socket_format_can_be_the_default_from_flag_env_or_file(tmp_path: Path, fmt, source):
    path = tmp_path / "voxwire.toml"
    path.write_text(f'default_format = "{fmt}"\n' if source == "file" else "")
    argv = ["--config", str(path)] + (["--format", fmt] if source == "flag" else [])
    env = {"VOXWIRE_FORMAT": fmt} if source == "env" else {}
    assert config_loader.load(parse(argv), env).default_format == fmt


KINDS = {int: "an integer", float: "a number", bool: "true or false"}
# Every setting "abc" is no value of: the others take any text (a host, a path).
CHECKED = [s for s in config_loader.settings() if s.choices or s.scalar in KINDS]


@pytest.mark.parametrize("s", CHECKED, ids=[s.key for s in CHECKED])
def test_a_bad_value_is_refused_naming_the_setting_and_where_it_was_given(tmp_path: Path, s):
    """Whatever the setting, the message quotes the value as the operator wrote it, in the
    place they wrote it: the variable, the flag, or the settings file's line."""
    must = "must be " + (f"one of {', '.join(s.choices)}" if s.choices else KINDS[s.scalar])
    with pytest.raises(config_loader.SettingsError) as e:
        config_loader.load(parse([]), {s.env: "abc"})
    assert str(e.value) == f"{s.env}=abc: {s.toml_key} {must}"

    path = tmp_path / "voxwire.toml"
    path.write_text(f'[{s.section}]\n{s.field} = "abc"\n' if s.section else f'{s.field} = "abc"\n')
    with pytest.raises(config_loader.SettingsError) as e:
        config_loader.load(parse(["--config", str(path)]), {})
    assert str(e.value) == f'{path}: {s.toml_key} = "abc" {must}'

    if s.scalar is not bool and not s.choices:  # argparse itself refuses those flags' values
        with pytest.raises(config_loader.SettingsError) as e:
            config_loader.load(parse([f"--{s.flag}", "abc"]), {})
        assert str(e.value) == f"--{s.flag} abc: {s.toml_key} {must}"
