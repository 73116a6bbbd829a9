"""Filling the one ServerConfig from a TOML file, the environment and the command line.

Precedence, lowest first: the defaults in the dataclasses, the TOML file (``--config``
or ``VOXWIRE_CONFIG``), ``VOXWIRE_*`` environment variables, command-line flags. Every
leaf field of ServerConfig and its nested sections is a setting: its TOML key is the
field's name, in the table of its section (``[limits] max_text_chars``); its flag is
that name with dashes (``--max-text-chars``) unless the field names another, and its
environment variable follows the flag (``VOXWIRE_MAX_TEXT_CHARS``). List settings take
a comma-separated value in the environment and repeat on the command line.

A value that cannot be used is refused with one line that quotes it as it was given
(``VOXWIRE_CHUNK_MS=abc: default_chunk_ms must be an integer``), before anything starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import os
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from voxwire.server.audio import FormatError, stream_rate
from voxwire.server.config import ServerConfig

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
    default_text: str | None = None
    """What the default means, in words, where its value (None, empty) says nothing."""

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
    def optional(self) -> bool:
        """None is a value of it (X | None): "the engine's own", "off"."""
        union = typing.get_origin(self.type) in (typing.Union, types.UnionType)
        return union and type(None) in typing.get_args(self.type)

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
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        yield Setting(
            section, f.name, flag, hints[f.name], default, f.metadata["help"], f.metadata.get("choices"), env,
            f.metadata.get("range"), f.metadata.get("default_text"),
        )


@dataclass(frozen=True)
class Given:
    """A setting's value as it was written, and where: what a refusal quotes, so the
    operator finds the line to fix whichever of the three places it came from."""

    setting: Setting
    source: Literal["flag", "env", "file"]
    raw: Any
    path: Path | None = None

    def __str__(self) -> str:
        s = self.setting
        if self.source == "flag":
            if isinstance(self.raw, bool):
                return f"--{s.flag}" if self.raw else f"--no-{s.flag}"
            return " ".join(f"--{s.flag} {v}" for v in (self.raw if s.is_list else [self.raw]))
        if self.source == "env":
            return f"{s.env}={self.raw}"
        return f"{self.path}: {s.toml_key} = {json.dumps(self.raw, default=str)}"

    def refuse(self, must: str) -> SettingsError:
        # A file's line names the setting itself; a flag or a variable is followed by the
        # setting it sets, under the one name it has everywhere (its settings-file key).
        subject = " " if self.source == "file" else f": {self.setting.toml_key} "
        return SettingsError(f"{self}{subject}must be {must}")


_KINDS: dict[Any, str] = {int: "an integer", float: "a number", bool: "true or false", str: "a string", Path: "a path"}


def _convert(given: Given) -> Any:
    s, value = given.setting, given.raw
    if s.is_list:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise given.refuse(f"a list ({_KINDS[s.scalar]} each)")
        return tuple(_scalar(given, v) for v in items if not (isinstance(v, str) and not v.strip()))
    return _scalar(given, value)


def _scalar(given: Given, value: Any) -> Any:
    s, t = given.setting, given.setting.scalar
    if value is None or (value == "" and (s.optional or t is not str)):
        if s.optional:
            return None  # VOXWIRE_SAMPLE_RATE= (empty): the default's meaning, the engine's own
        raise given.refuse(_KINDS[t])
    out = _parse(t, value)
    if out is None:
        raise given.refuse(f"a list ({_KINDS[t]} each)" if s.is_list else _KINDS[t])
    if s.choices and out not in s.choices:
        raise given.refuse(f"one of {', '.join(s.choices)}")
    if s.bounds is not None:
        low, high = s.bounds
        if out < low or (high is not None and out > high):
            raise given.refuse(f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}")
    return out


def _parse(t: Any, value: Any) -> Any:
    """``value`` as a ``t``, or None when it is not one. Strings come from flags and the
    environment; a settings file also gives TOML's own types, taken only where they
    mean the same (``workers = 2.5`` or ``port = true`` is no integer)."""
    if isinstance(value, str):
        if t is bool:
            return {"1": True, "true": True, "yes": True, "on": True,
                    "0": False, "false": False, "no": False, "off": False}.get(value.lower())
        if t in (int, float):
            try:
                number = t(value)
            except ValueError:
                return None
            return number if math.isfinite(number) else None  # "nan" passes every range check
        return Path(value) if t is Path else value
    if t is bool:
        return value if isinstance(value, bool) else None
    if t is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if t is float:
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if number else None
    return None  # a str or a Path from a number, a list or a table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; their default is "not given", so lower layers show through."""
    parser.add_argument("--config", type=Path, help="a TOML settings file (also: VOXWIRE_CONFIG)")
    groups: dict[str | None, argparse._ArgumentGroup] = {}
    for s in settings():
        group = groups.setdefault(s.section, parser.add_argument_group(s.section or "server"))
        help = f"{s.help} (default: {_shown_default(s)}; env {s.env}; file: {s.toml_key})"
        if s.scalar is bool and not s.is_list:
            group.add_argument(f"--{s.flag}", dest=s.key, action=argparse.BooleanOptionalAction, default=None, help=help)
        elif s.is_list:
            group.add_argument(f"--{s.flag}", dest=s.key, action="append", default=None, help=help + "; repeat")
        else:
            group.add_argument(f"--{s.flag}", dest=s.key, default=None, choices=s.choices, help=help)


def _shown_default(s: Setting) -> str:
    if s.default_text is not None:
        return s.default_text
    shown = ",".join(map(str, s.default)) if s.is_list else s.default
    return "none" if shown in ("", None) else str(shown)


def load(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> ServerConfig:
    """The settings, each value checked where it was given (its type, choices and range),
    then those that must agree with each other. Raises ``SettingsError``."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    path = getattr(args, "config", None) or (Path(env[ENV_PREFIX + "CONFIG"]) if env.get(ENV_PREFIX + "CONFIG") else None)
    table = _read_toml(path) if path else {}
    known = settings()
    _check_toml_keys(table, known, path)
    origins: dict[str, Given] = {}
    for s in known:
        raw = (table.get(s.section, {}) if s.section else table).get(s.field, dataclasses.MISSING)
        flag = getattr(args, s.key, None) if args is not None else None
        for given in (
            Given(s, "file", raw, path) if raw is not dataclasses.MISSING else None,
            Given(s, "env", env[s.env]) if s.env in env else None,
            Given(s, "flag", flag) if flag is not None else None,
        ):
            if given is not None:  # lowest precedence first: each one given overrides
                values[s.key] = _convert(given)
                origins[s.key] = given
    config = build(values, known)
    check_together(config, origins)
    return config


def check_together(config: ServerConfig, origins: Mapping[str, Given]) -> None:
    """Refuse settings that are each fine but cannot go together, before anything starts
    (no engine loaded, no port bound): otherwise every session, or every worker, would
    fail on its own later. ``origins`` names where each value was given."""

    def named(key: str, value: Any) -> str:
        return str(origins[key]) if key in origins else f"the default {key} {value}"

    if config.default_sample_rate is not None:
        try:
            # What a session does with a format and rate it is asked for (server/pipeline.py).
            stream_rate(config.default_format, config.default_sample_rate)
        except FormatError as e:
            raise SettingsError(
                f"{named('format', config.default_format)} with {named('sample_rate', config.default_sample_rate)}: "
                f"{e.message}"
            ) from None
    if config.workers > 1 and config.wyoming_port == 0:
        raise SettingsError(
            f"{named('workers', config.workers)} with {named('wyoming_port', 0)}: each worker would listen for "
            "Wyoming on a different free port; 0 (any free port) is for a single process, so name the port"
        )


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
