"""Filling the one ServerConfig from a TOML file, the environment and the command line.

Precedence, lowest first: the defaults in the dataclasses, the TOML file (``--config``
or ``VOXWIRE_CONFIG``), ``VOXWIRE_*`` environment variables, command-line flags. Every
leaf field of ServerConfig and its nested sections is a setting: its TOML key is the
field's name, in the table of its section (``[limits] max_text_chars``); its flag is
that name with dashes (``--max-text-chars``) unless the field names another, and its
environment variable follows the flag (``VOXWIRE_MAX_TEXT_CHARS``). List settings take
a comma-separated value in the environment and repeat on the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.config import ServerConfig

ENV_PREFIX = "VOXWIRE_"
SECTIONS = {"engine", "limits", "auth"}


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Setting:
    section: str | None
    field: str
    flag: str
    type: Any
    default: Any
    help: str
    choices: tuple[str, ...] | None
    env: str
    bounds: tuple[float, float | None] | None = None

    @property
    def key(self) -> str:
        """The flag's stem: the argparse destination, unique across sections."""
        return self.flag.replace("-", "_")

    @property
    def toml_key(self) -> str:
        """How the settings file names it: ``[limits] max_text_chars``, or ``cache_mb``."""
        return f"[{self.section}] {self.field}" if self.section else self.field

    @property
    def is_list(self) -> bool:
        return typing.get_origin(self.type) is tuple

    @property
    def scalar(self) -> Any:
        """The element type: X for tuple[X, ...] and X | None."""
        t = self.type
        if self.is_list:
            t = typing.get_args(t)[0]
        if typing.get_origin(t) in (typing.Union, types.UnionType):
            t = next(a for a in typing.get_args(t) if a is not type(None))
        return t


def settings() -> list[Setting]:
    """Every setting, in the order of the dataclasses."""
    return list(_walk(ServerConfig, None))


def _walk(cls: type, section: str | None) -> Iterator[Setting]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in SECTIONS and section is None:
            yield from _walk(hints[f.name], f.name)
            continue
        if "help" not in f.metadata:
            continue  # not a setting (EngineOptions.extra)
        flag = f.metadata.get("flag", f.name.replace("_", "-"))
        env = f.metadata.get("env", ENV_PREFIX + flag.replace("-", "_").upper())
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        yield Setting(
            section, f.name, flag, hints[f.name], default, f.metadata["help"], f.metadata.get("choices"), env,
            f.metadata.get("range"),
        )


def _convert(s: Setting, value: Any, source: str) -> Any:
    if s.is_list:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise SettingsError(f"{source}: {s.key} must be a list")
        return tuple(_scalar(s, v, source) for v in items if not (isinstance(v, str) and not v.strip()))
    return _scalar(s, value, source)


def _scalar(s: Setting, value: Any, source: str) -> Any:
    t = s.scalar
    try:
        if value is None or (isinstance(value, str) and value == "" and s.type != str):
            return None
        if t is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        out = t(value) if t in (int, float, Path) else str(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{source}: {s.key} must be {getattr(t, '__name__', t)}, got {value!r}") from None
    if s.choices and out not in s.choices:
        raise SettingsError(f"{source}: {s.key} must be one of {', '.join(s.choices)}, got {out!r}")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; their default is "not given", so lower layers show through."""
    parser.add_argument("--config", type=Path, help="a TOML settings file (also: VOXWIRE_CONFIG)")
    groups: dict[str | None, argparse._ArgumentGroup] = {}
    for s in settings():
        group = groups.setdefault(s.section, parser.add_argument_group(s.section or "server"))
        shown = ",".join(map(str, s.default)) if s.is_list else s.default
        help = (
            f"{s.help} (default: {shown if shown not in ('', None) else 'none'}; env {s.env}; "
            f"file: {s.toml_key})"
        )
        if s.scalar is bool and not s.is_list:
            group.add_argument(f"--{s.flag}", dest=s.key, action=argparse.BooleanOptionalAction, default=None, help=help)
        elif s.is_list:
            group.add_argument(f"--{s.flag}", dest=s.key, action="append", default=None, help=help + "; repeat")
        else:
            group.add_argument(f"--{s.flag}", dest=s.key, default=None, choices=s.choices, help=help)


def load(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> ServerConfig:
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    path = getattr(args, "config", None) or (Path(env[ENV_PREFIX + "CONFIG"]) if env.get(ENV_PREFIX + "CONFIG") else None)
    table = _read_toml(path) if path else {}
    known = settings()
    _check_toml_keys(table, known, path)
    for s in known:
        raw = (table.get(s.section, {}) if s.section else table).get(s.field, dataclasses.MISSING)
        if raw is not dataclasses.MISSING:
            values[s.key] = _convert(s, raw, str(path))
        if s.env in env:
            values[s.key] = _convert(s, env[s.env], s.env)
        given = getattr(args, s.key, None) if args is not None else None
        if given is not None:
            values[s.key] = _convert(s, given, f"--{s.flag}")
    config = build(values, known)
    check_ranges(config, known)
    return config


def check_ranges(config: ServerConfig, known: Sequence[Setting] | None = None) -> None:
    """Refuse a value outside its documented range before anything starts: a server that
    came up with 9600-sample frames or a 30 ms step timeout fails every request instead."""
    for s in known or settings():
        if s.bounds is None:
            continue
        value = getattr(getattr(config, s.section) if s.section else config, s.field)
        low, high = s.bounds
        if value is None:
            continue
        if value < low or (high is not None and value > high):
            allowed = f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}"
            raise SettingsError(f"--{s.flag} ({s.toml_key}) must be {allowed}, got {value:g}")


def build(values: Mapping[str, Any], known: Sequence[Setting] | None = None) -> ServerConfig:
    """A ServerConfig from settings by key, every other field at its default."""
    known = known or settings()
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for s in known:
        if s.key in values:
            (nested[s.section] if s.section else top)[s.field] = values[s.key]
    defaults = ServerConfig()
    for name, fields in nested.items():
        top[name] = dataclasses.replace(getattr(defaults, name), **fields)
    return dataclasses.replace(defaults, **top)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise SettingsError(f"cannot read the settings file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path} is not valid TOML: {e}") from None


def _check_toml_keys(table: Mapping[str, Any], known: Sequence[Setting], path: Path | None) -> None:
    """A typo in a settings file is an error, not a silently ignored line."""
    allowed = {(s.section, s.field) for s in known}
    for key, value in table.items():
        if key in SECTIONS and isinstance(value, dict):
            for sub in value:
                if (key, sub) not in allowed:
                    raise SettingsError(f"{path}: unknown setting [{key}] {sub}{_did_you_mean(sub, known)}")
        elif (None, key) not in allowed:
            raise SettingsError(f"{path}: unknown setting {key}{_did_you_mean(key, known)}")


def _did_you_mean(name: str, known: Sequence[Setting]) -> str:
    # People write the flag's name (chunk_ms for --chunk-ms) or misspell a key.
    by_flag = [s for s in known if s.key == name]
    if by_flag:
        return f"; did you mean {by_flag[0].toml_key}?"
    fields = {s.field: s for s in known}
    close = difflib.get_close_matches(name, list(fields), n=1)
    return f"; did you mean {fields[close[0]].toml_key}?" if close else ""


def to_env(config: ServerConfig) -> dict[str, str]:
    """The config as VOXWIRE_* variables: how worker processes inherit it."""
    out = {}
    for s in settings():
        source = getattr(config, s.section) if s.section else config
        value = getattr(source, s.field)
        if value is None:
            continue
        out[s.env] = ",".join(map(str, value)) if s.is_list else str(value)
    return out
