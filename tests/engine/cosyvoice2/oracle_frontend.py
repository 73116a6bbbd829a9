"""The reference's frontend code, importable without its weights or training packages.

* ``frontend_class()``: the oracle's ``cosyvoice.cli.frontend.CosyVoiceFrontEnd``. Its
  module imports ``whisper`` for ``log_mel_spectrogram`` only; the real package's
  ``__init__`` pulls in tiktoken and numba-compiled timing code, so ``whisper`` is
  replaced by a package that exposes ``whisper.audio`` (openai-whisper's own file).
* ``matcha_audio()``: Matcha-TTS's ``matcha/utils/audio.py`` (the ``feat_extractor``
  of cosyvoice2.yaml), loaded by path because conftest stubs ``matcha.utils``.
* ``FakeSession``: stands in for an onnxruntime session and records what it is fed,
  which is exactly the feature tensor the reference computes.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np


def _whisper_audio() -> types.ModuleType:
    if not hasattr(sys.modules.get("whisper"), "log_mel_spectrogram"):
        spec = importlib.util.find_spec("whisper")  # locates the package, runs nothing
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError("openai-whisper is not installed (oracle-requirements.txt)")
        package = types.ModuleType("whisper")
        package.__spec__ = spec
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["whisper"] = package
        package.log_mel_spectrogram = importlib.import_module("whisper.audio").log_mel_spectrogram  # type: ignore[attr-defined]
    return importlib.import_module("whisper.audio")


def whisper_log_mel_spectrogram():
    return _whisper_audio().log_mel_spectrogram


def frontend_class() -> type:
    _whisper_audio()
    return importlib.import_module("cosyvoice.cli.frontend").CosyVoiceFrontEnd


def frontend_utils() -> types.ModuleType:
    return importlib.import_module("cosyvoice.utils.frontend_utils")


def matcha_audio() -> types.ModuleType:
    name = "matcha_utils_audio_oracle"
    if name not in sys.modules:
        spec = importlib.util.find_spec("matcha")
        assert spec is not None and spec.origin is not None
        path = Path(spec.origin).parent / "utils" / "audio.py"
        file_spec = importlib.util.spec_from_file_location(name, path)
        assert file_spec is not None and file_spec.loader is not None
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = module
        file_spec.loader.exec_module(module)
    return sys.modules[name]


class FakeSession:
    """Records the inputs of ``run``; returns a dummy output of the right rank."""

    def __init__(self, n_inputs: int) -> None:
        self.inputs = [types.SimpleNamespace(name=f"input{i}") for i in range(n_inputs)]
        self.fed: dict[str, Any] = {}

    def get_inputs(self) -> list[types.SimpleNamespace]:
        return self.inputs

    def run(self, _outputs: Any, feeds: dict[str, Any]) -> list[np.ndarray]:
        self.fed = feeds
        return [np.zeros((1, 4), dtype=np.float32)]

    @property
    def first(self) -> np.ndarray:
        return self.fed[self.inputs[0].name]
