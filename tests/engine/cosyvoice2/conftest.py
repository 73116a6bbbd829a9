"""Shared fixtures for the CosyVoice2 engine tests.

The parity tests use the reference implementation bundled in the PyPI package
``cosyvoice2-eu`` as an oracle (see oracle-requirements.txt). Its import chain
pulls in ``matcha.utils``, whose ``__init__`` needs hydra/lightning/rich for
training utilities we never touch; those two modules are stubbed here.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from voxwire.engine.cosyvoice2.yaml_reader import Tagged, load_hyperpyyaml
from voxwire.engine.cosyvoice2.tiny import make_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fast tiny model (64-channel encoder)."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("cv2_tiny"))


@pytest.fixture(scope="session")
def tiny_dir_512(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose encoder has the 512 channels the reference hard-codes."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("cv2_tiny512"), encoder_dim=512, seed=1)


def _stub_matcha_utils() -> None:
    if "matcha.utils.pylogger" in sys.modules:
        return
    import matcha  # noqa: F401 - the real package root

    utils = types.ModuleType("matcha.utils")
    utils.__path__ = []  # a package, so submodule stubs resolve
    pylogger = types.ModuleType("matcha.utils.pylogger")
    pylogger.get_pylogger = lambda name=__name__: logging.getLogger(name)  # type: ignore[attr-defined]
    sys.modules["matcha.utils"] = utils
    sys.modules["matcha.utils.pylogger"] = pylogger


class Reference:
    """Builds the reference's modules from our tiny yaml (test-only instantiation)."""

    def __init__(self) -> None:
        _stub_matcha_utils()
        self.llm = importlib.import_module("cosyvoice.llm.llm")
        self.flow = importlib.import_module("cosyvoice.flow.flow")
        self.hift = importlib.import_module("cosyvoice.hifigan.generator")
        self.common = importlib.import_module("cosyvoice.utils.common")

    def instantiate(self, node: Any, model_dir: Path) -> Any:
        if isinstance(node, Tagged):
            if node.class_name == "Qwen2Encoder":
                from transformers import Qwen2Config, Qwen2ForCausalLM

                cfg = json.loads((model_dir / "CosyVoice-BlankEN" / "config.json").read_text())
                enc = self.llm.Qwen2Encoder.__new__(self.llm.Qwen2Encoder)
                torch.nn.Module.__init__(enc)
                enc.model = Qwen2ForCausalLM(Qwen2Config(**cfg))
                return enc
            module, name = node.target.rsplit(".", 1)
            target = getattr(importlib.import_module(module), name)
            args = [self.instantiate(a, model_dir) for a in node.args]
            kwargs = {k: self.instantiate(v, model_dir) for k, v in node.kwargs.items()}
            if node.kind == "name":
                return functools.partial(target, *args, **kwargs)
            return target(*args, **kwargs)
        if isinstance(node, dict):
            return {k: self.instantiate(v, model_dir) for k, v in node.items()}
        if isinstance(node, list):
            return [self.instantiate(v, model_dir) for v in node]
        return node

    def build(self, model_dir: Path, key: str) -> torch.nn.Module:
        data = load_hyperpyyaml((model_dir / "cosyvoice2.yaml").read_text())
        torch.manual_seed(0)
        module = self.instantiate(data[key], model_dir)
        state = torch.load(model_dir / f"{'llm' if key == 'llm' else key}.pt", map_location="cpu", weights_only=True)
        module.load_state_dict(state, strict=True)  # the fixture is in the reference's layout
        return module.eval()


@pytest.fixture(scope="session")
def reference() -> Reference:
    try:
        importlib.import_module("cosyvoice")
        importlib.import_module("diffusers")
        importlib.import_module("transformers")
    except ImportError as exc:  # pragma: no cover - depends on the environment
        # make test installs it: a missing oracle is a broken set-up, never a pass.
        pytest.fail(f"oracle not installed (tests/engine/cosyvoice2/oracle-requirements.txt): {exc}")
    return Reference()


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The tiny models gain nothing from threads, and on a shared 2-core machine two
    spinning OpenMP threads can make them 30x slower. Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
