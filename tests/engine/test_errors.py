"""engine/errors.py: every coded error survives pickling (Ray carries exceptions that way)."""

from __future__ import annotations

import ast
import importlib
import pickle
from pathlib import Path

import pytest

from voxwire.engine.errors import CodedError

ROOT = Path(__file__).resolve().parents[2]


def coded_error_classes() -> dict[str, type[CodedError]]:
    """Every class in engine/ and server/ that derives from CodedError, found in the
    source (so that a new one is tested without being listed here), then imported."""
    defined: dict[str, tuple[str, list[str]]] = {}  # name: (module, its bases' names)
    for folder in ("engine", "server"):
        for path in (ROOT / folder).rglob("*.py"):
            module = "voxwire." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                    defined[node.name] = (module, bases)
    coded = {"CodedError"}
    while True:  # subclasses of subclasses too
        more = {name for name, (_, bases) in defined.items() if coded & set(bases)} - coded
        if not more:
            break
        coded |= more
    coded.discard("CodedError")
    classes = {name: getattr(importlib.import_module(defined[name][0]), name) for name in coded}
    assert all(issubclass(c, CodedError) for c in classes.values()), classes
    return classes


def _examples() -> dict[str, CodedError]:
    """One instance of each, with every field it carries set to something other than its default."""
    from voxwire.engine.base import EngineError
    from voxwire.server.audio import FormatError
    from voxwire.server.doors.openai import Invalid
    from voxwire.server.doors.wyoming import BadEvent
    from voxwire.server.pipeline import Refused
    from voxwire.server.protocol import ProtocolError

    protocol = ProtocolError("rate_limited", "too many messages", "ctx-1", retry_after_ms=250, terminal=False)
    protocol.message_type = "progress"
    return {
        "EngineError": EngineError("over_memory_budget", "the segment needs 3 GB; the budget is 2 GB"),
        "FormatError": FormatError("unsupported_sample_rate", "mp3 cannot be encoded at 12345 Hz"),
        "Invalid": Invalid("\"speed\" must be a number", "invalid_speed", "speed"),
        "BadEvent": BadEvent("event_too_large", "an event of 2 GB"),
        "Refused": Refused("overloaded", "the server is at capacity", retry_after_ms=1000),
        "ProtocolError": protocol,
    }


def test_every_coded_error_in_the_codebase_has_an_example_here():
    assert set(coded_error_classes()) == set(_examples())


@pytest.mark.parametrize("name", sorted(_examples()))
def test_every_coded_error_round_trips_through_pickle_with_its_code_message_and_fields(name):
    error = _examples()[name]
    assert type(error).__name__ == name
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(error, protocol))
        assert type(back) is type(error)
        assert (back.code, back.message, str(back), back.args) == (error.code, error.message, str(error), error.args)
        assert vars(back) == vars(error)  # its own fields: ctx, extra, param, retry_after_ms...
        assert vars(back) is not vars(error)


def test_a_pickled_error_still_raises_and_is_caught_as_its_bases():
    from voxwire.server.audio import FormatError

    back = pickle.loads(pickle.dumps(FormatError("invalid_format", "unknown format 'wav2'")))
    with pytest.raises(ValueError, match="unknown format"):  # FormatError is a ValueError too
        raise back


def test_ray_carries_an_engine_error_with_its_code():
    """Ray's own serializer (cloudpickle), as it carries a replica's exception."""
    cloudpickle = pytest.importorskip("ray.cloudpickle", reason="the ray extra (make test installs it)")
    from voxwire.engine.base import EngineError

    back = cloudpickle.loads(cloudpickle.dumps(EngineError("engine_timeout", "the engine step took over 30 s")))
    assert (type(back), back.code, back.message) == (EngineError, "engine_timeout", "the engine step took over 30 s")
