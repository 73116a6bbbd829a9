"""engine/errors.py's ``ErrorCode``: the one list of error codes, the same as
docs/protocol.md's tables, and every code written as a string in the source one of it.

A code written as a member (``ErrorCode.UNKNOWN_VOICE``) cannot be misspelt without an
AttributeError; one still written as a string is found here by reading the source: where
a code goes (a coded error's ``code`` argument, any callable's parameter named ``code``,
``code=``, a ``{"code": ...}`` dict), where one is compared (``e.code == "..."``), and
the keys of a dict looked up by a code.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import orjson

from voxwire.engine.errors import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("server", "engine", "clients/python/voxwire_client", "benchmarks", "voxwire")
PROTOCOL = ROOT / "docs" / "protocol.md"
_LOGGING = {"debug", "info", "warning", "error", "exception", "critical"}


def documented_codes(section: str | None = None) -> dict[str, str]:
    """The codes in docs/protocol.md's tables of error codes, each with its table: the
    ``error`` section's, or (``section``) the one under that heading only."""
    text = PROTOCOL.read_text()
    errors = text[text.index("### `error`") : text.index("### Close codes")]
    tables = re.split(r"^#### ", errors, flags=re.M)
    codes: dict[str, str] = {}
    for table in tables:
        heading = table.splitlines()[0]
        if section is not None and heading != section:
            continue
        for row in re.findall(r"^\| (`[^|]+`) \|", table, flags=re.M):
            for code in re.findall(r"`([a-z_]+)`", row):
                assert code not in codes, f"{code} is in docs/protocol.md's tables twice"
                codes[code] = heading
    return codes


SOCKET_TABLE = "### `error`"
"""The heading of the table of protocol v1's codes: those a socket client can be sent."""


# ---------------------------------------------------------------- the source, read


@dataclass(frozen=True)
class Written:
    code: str
    path: Path
    line: int
    col: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.code!r}"


def sources() -> dict[Path, ast.Module]:
    return {
        path.relative_to(ROOT): ast.parse(path.read_text(), str(path))
        for folder in SOURCES
        for path in sorted((ROOT / folder).rglob("*.py"))
    }


def _positional(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Its positional parameters' names, ``self`` left out; a ``code`` that is a number
    (a WebSocket close code) is named "close_code" here."""
    names = [
        "close_code" if a.arg == "code" and _a_number(a.annotation) else a.arg
        for a in fn.args.posonlyargs + fn.args.args
    ]
    return names[1:] if names and names[0] in ("self", "cls") else names


def _a_number(annotation: ast.expr | None) -> bool:
    written = ast.unparse(annotation) if annotation is not None else ""
    return "int" in written and "str" not in written


def _code_index_of_class(node: ast.ClassDef) -> int | None | str:
    """Where a class's constructor takes ``code``: its ``__init__``'s parameter, or its
    (dataclass) field; "inherit" when it defines neither."""
    init = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
    if init is not None:
        names = _positional(init)
        return names.index("code") if "code" in names else None
    fields = [b.target.id for b in node.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)]
    return fields.index("code") if "code" in fields else "inherit"


def where_codes_go(trees: dict[Path, ast.Module]) -> tuple[dict[Path, dict[str, int | None]], dict[str, set[int]]]:
    """Callable name -> the index of its positional ``code``: per file (a method or a
    function of that file, which a call there means first; None if it takes no code),
    and across all files."""
    local: dict[Path, dict[str, int | None]] = defaultdict(dict)
    anywhere: dict[str, set[int]] = defaultdict(set)
    classes: dict[str, tuple[int | None | str, list[str], Path]] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "__init__":
                names = _positional(node)
                at = names.index("code") if "code" in names else None
                if local[path].get(node.name) is None:
                    local[path][node.name] = at
                if at is not None:
                    anywhere[node.name].add(at)
            elif isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))]
                classes[node.name] = (_code_index_of_class(node), bases, path)

    def index_of(name: str, seen: frozenset[str] = frozenset()) -> int | None:
        if name not in classes or name in seen:
            return None
        index, bases, _ = classes[name]
        if index == "inherit":
            return next((i for b in bases if (i := index_of(b, seen | {name})) is not None), None)
        return index if isinstance(index, int) else None

    for name, (_, _, path) in classes.items():
        if (i := index_of(name)) is not None:
            local[path][name] = i
            anywhere[name].add(i)
    return local, anywhere


def _is_a_code(e: ast.expr) -> bool:
    """``x.code``, ``code`` or ``x["code"]``."""
    return (
        (isinstance(e, ast.Attribute) and e.attr == "code")
        or (isinstance(e, ast.Name) and e.id == "code")
        or (isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and e.slice.value == "code")
    )


def _strings(e: ast.expr) -> list[ast.Constant]:
    items = e.elts if isinstance(e, (ast.Tuple, ast.List, ast.Set)) else [e]
    return [x for x in items if isinstance(x, ast.Constant) and isinstance(x.value, str)]


def _called(call: ast.Call) -> str | None:
    """The name a call's code argument is looked up by; None for a logging call."""
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if not isinstance(f, ast.Attribute):
        return None
    if f.attr in _LOGGING and not (isinstance(f.value, ast.Name) and f.value.id not in ("log", "logger", "logging")):
        return None  # log.error(...), logging.getLogger(...).error(...): a message
    return f.attr


def codes_written(trees: dict[Path, ast.Module]) -> Iterator[Written]:
    """Every code written as a string constant in ``trees``."""
    local, anywhere = where_codes_go(trees)
    for path, tree in trees.items():
        dicts = {
            target.id: node.value
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
            and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.value.keys)
        }
        found: list[ast.expr] = []
        keyed_by_code: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _called(node)
                if name is not None:
                    if name not in local[path]:  # defined elsewhere
                        at = anywhere.get(name, set())
                    else:  # this file's own, which may take no code
                        here = local[path][name]
                        at = set() if here is None else {here}
                    found += [node.args[i] for i in at if i < len(node.args)]
                found += [k.value for k in node.keywords if k.arg == "code"]
                f = node.func
                if (
                    isinstance(f, ast.Attribute) and f.attr == "get" and isinstance(f.value, ast.Name)
                    and f.value.id in dicts and node.args and _is_a_code(node.args[0])
                ):
                    keyed_by_code.add(f.value.id)
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and _is_a_code(node.slice):
                if node.value.id in dicts:
                    keyed_by_code.add(node.value.id)
            elif isinstance(node, ast.Dict):
                found += [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "code"]
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_is_a_code(s) for s in sides):
                    found += sides
        for name in keyed_by_code:
            found += [k for k in dicts[name].keys if k is not None]
        for e in found:
            for c in _strings(e):
                yield Written(c.value, path, c.lineno, c.col_offset, c.end_col_offset or c.col_offset)


def unknown(written: Iterator[Written]) -> list[str]:
    members = set(ErrorCode)
    return [str(w) for w in written if w.code not in members]


# ---------------------------------------------------------------- the tests


def test_every_member_is_named_as_it_is_written() -> None:
    assert [m.name for m in ErrorCode if m.name != m.value.upper()] == []


def test_the_enumeration_is_docs_protocol_tables() -> None:
    documented = set(documented_codes())
    members = {str(m) for m in ErrorCode}
    assert sorted(members - documented) == [], "codes docs/protocol.md does not list"
    assert sorted(documented - members) == [], "codes docs/protocol.md lists that ErrorCode lacks"


def test_the_socket_table_is_there() -> None:
    """The parse found the table of protocol v1's codes and the other one, not nothing."""
    socket = documented_codes(SOCKET_TABLE)
    assert {"invalid_json", "unknown_voice", "shutting_down"} <= set(socket)
    assert "voice_exists" not in socket and "voice_exists" in documented_codes()


def test_no_code_written_in_the_source_is_unknown() -> None:
    written = list(codes_written(sources()))
    assert len(written) > 10, "the scan found (almost) nothing: it no longer reads the source"
    assert unknown(iter(written)) == []


def test_only_the_client_writes_codes_as_strings() -> None:
    """The server, the engines and the benchmarks write ``ErrorCode`` members; the client
    shares no code with the server, so it alone spells the codes out."""
    client = Path("clients/python")
    assert [str(w) for w in codes_written(sources()) if not w.path.is_relative_to(client)] == []


def test_a_misspelt_code_is_found() -> None:
    """Each way of writing a code, misspelt, is reported (and its correct spelling is not)."""
    misspelt = '''
class CodedError(Exception):
    def __init__(self, code, message): ...
class EngineError(CodedError):
    pass
class Refused(CodedError):
    def __init__(self, code, message, retry_after_ms=None): ...
class Invalid(CodedError):
    def __init__(self, message, code, param): ...
class Failed:
    code: str
    message: str
def error(code, message): ...
def refuse(ids, code): ...
def close(code: int, reason: str): ...
def shut(outcome, code: str | None = None): ...
class Closed:
    def __init__(self, code: int | None, reason: str): ...
_STATUS = {"overloded": 429, "not_ready": 503}
def f(e, item):
    raise EngineError("unknown_vioce", "m")
    raise Refused("shuting_down", "m")
    raise Invalid("m", "invalid_jsn", "voice")
    Failed("engine_eror", "m")
    error("ratelimited", "m")
    refuse({}, "not_redy")
    close(1000, "no_reason")
    shut("failed", "idel_timeout")
    Closed(None, "a_reason")
    Error(text="m", code="bussy")
    send({"type": "error", "code": "unknown_ctxx"})
    if e.code == "session_text_limt" or item["code"] in ("no_voise", "overloaded"):
        return _STATUS.get(e.code, 400)
    log.error("unknown_voice_x")
'''
    tree = ast.parse(misspelt)
    found = unknown(codes_written({Path("example.py"): tree}))
    assert sorted(f.split("'")[1] for f in found) == sorted(
        ["overloded", "unknown_vioce", "shuting_down", "invalid_jsn", "engine_eror", "ratelimited",
         "not_redy", "idel_timeout", "bussy", "unknown_ctxx", "session_text_limt", "no_voise"]
    )


def test_a_member_goes_out_as_its_string() -> None:
    """JSON and msgpack carry a member as the plain code, as they did the string."""
    code = ErrorCode.UNKNOWN_VOICE
    assert orjson.dumps({"code": code}) == orjson.dumps({"code": "unknown_voice"})
    assert msgpack.packb({"code": code}) == msgpack.packb({"code": "unknown_voice"})
    assert f"{code}" == str(code) == "unknown_voice"
