"""Read the released ``cosyvoice2.yaml`` without instantiating anything.

The released file is a hyperpyyaml document: ``!new:pkg.Class`` builds an object,
``!name:pkg.func`` makes a partial, ``!apply:pkg.func`` calls at load time and
``!ref <key>`` points at (or does arithmetic on) another entry. We parse it with
plain PyYAML, keep every tagged node as an inert :class:`Tagged` record, resolve
the references, and hand back plain data; engine/cosyvoice2/model_config.py then reads
the few numbers each module needs into dataclasses. Nothing named in the file is ever
imported or called.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from typing import Any, cast

import yaml


class ConfigError(ValueError):
    """The model directory's configuration cannot be used by this engine."""


@dataclass
class Tagged:
    """A ``!new:`` / ``!name:`` / ``!apply:`` node, kept as data."""

    kind: str  # "new" | "name" | "apply"
    target: str  # dotted path, e.g. cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.kwargs.get(key, default)

    @property
    def class_name(self) -> str:
        return self.target.rsplit(".", 1)[-1]


@dataclass
class _Ref:
    expr: str


class _Loader(yaml.SafeLoader):
    """SafeLoader plus constructors for hyperpyyaml's tags (all inert)."""


def _construct_tagged(kind: str):
    def construct(loader: _Loader, suffix: str, node: yaml.Node) -> Tagged:
        if isinstance(node, yaml.MappingNode):
            # Keyword arguments: hyperpyyaml writes their names as plain keys.
            return Tagged(kind, suffix, kwargs=cast(dict[str, Any], loader.construct_mapping(node, deep=True)))
        if isinstance(node, yaml.SequenceNode):
            return Tagged(kind, suffix, args=loader.construct_sequence(node, deep=True))
        value = loader.construct_scalar(cast(yaml.ScalarNode, node))  # it raises for a node of another kind
        return Tagged(kind, suffix, args=[value] if value not in ("", None) else [])

    return construct


def _construct_ref(loader: _Loader, node: yaml.Node) -> _Ref:
    return _Ref(str(loader.construct_scalar(cast(yaml.ScalarNode, node))))  # it raises for another kind


def _construct_tuple(loader: _Loader, node: yaml.Node) -> tuple:
    return tuple(loader.construct_sequence(cast(yaml.SequenceNode, node), deep=True))  # it raises for another kind


for _kind in ("new", "name", "apply"):
    _Loader.add_multi_constructor(f"!{_kind}:", _construct_tagged(_kind))
_Loader.add_constructor("!ref", _construct_ref)
_Loader.add_constructor("!copy", _construct_ref)  # a copy reads the same as a reference
_Loader.add_constructor("!tuple", _construct_tuple)
_Loader.add_multi_constructor(
    "!", lambda loader, suffix, node: None  # unknown tags (!include, !PLACEHOLDER): ignored
)

_REF = re.compile(r"<([^<>]+)>")
_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _eval_arith(expr: str) -> Any:
    """Evaluate ``1 + 2 * 3``-style arithmetic on literals only (no names, no calls)."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        raise ValueError(expr)

    return ev(ast.parse(expr, mode="eval"))


def _lookup(root: dict[str, Any], path: str) -> Any:
    # hyperpyyaml allows <a.b> and <a[b]> for nested keys.
    node: Any = root
    for part in re.split(r"[.\[\]]+", path.strip()):
        if not part:
            continue
        if isinstance(node, Tagged):
            node = node.kwargs
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"cosyvoice2.yaml: !ref <{path}> points at nothing")
        node = node[part]
    return node


def _resolve(value: Any, root: dict[str, Any], depth: int = 0) -> Any:
    if depth > 50:
        raise ConfigError("cosyvoice2.yaml: circular !ref")
    if isinstance(value, _Ref):
        refs = _REF.findall(value.expr)
        if len(refs) == 1 and value.expr.strip() == f"<{refs[0]}>":
            return _resolve(_lookup(root, refs[0]), root, depth + 1)
        resolved = {r: _resolve(_lookup(root, r), root, depth + 1) for r in refs}
        text = _REF.sub(lambda m: repr(resolved[m.group(1)]), value.expr)
        try:
            return _eval_arith(text)
        except (ValueError, SyntaxError, ZeroDivisionError):
            # Not arithmetic: hyperpyyaml then does string interpolation.
            return _REF.sub(lambda m: str(resolved[m.group(1)]), value.expr)
    if isinstance(value, Tagged):
        return Tagged(
            value.kind,
            value.target,
            [_resolve(v, root, depth + 1) for v in value.args],
            {k: _resolve(v, root, depth + 1) for k, v in value.kwargs.items()},
        )
    if isinstance(value, dict):
        return {k: _resolve(v, root, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, root, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(_resolve(v, root, depth + 1) for v in value)
    return value


def load_hyperpyyaml(text: str) -> dict[str, Any]:
    """Parse a hyperpyyaml document into plain data with :class:`Tagged` nodes."""
    try:
        raw = yaml.load(text, Loader=_Loader)  # noqa: S506 - our loader builds no objects
    except yaml.YAMLError as exc:
        raise ConfigError(f"cosyvoice2.yaml does not parse: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError("cosyvoice2.yaml: the top level is not a mapping")
    return _resolve(raw, raw)
