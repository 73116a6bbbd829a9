"""The model directory: which files it needs, and loading its checkpoints strictly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from .flow import CausalFlow
from .hift import HiFTGenerator
from .lm import SpeechLM
from .model_config import CosyVoice2Config, load_config

DOWNLOAD_HINT = (
    "Download the released CosyVoice2-0.5B model (FunAudioLLM/CosyVoice2-0.5B, on Hugging Face "
    "or ModelScope) into pretrained_models/CosyVoice2-0.5B; this engine never downloads weights."
)

REQUIRED_FILES = (
    "cosyvoice2.yaml",
    "llm.pt",
    "flow.pt",
    "hift.pt",
    "campplus.onnx",
    "speech_tokenizer_v2.onnx",
    "CosyVoice-BlankEN/config.json",
    "CosyVoice-BlankEN/tokenizer_config.json",
)
# The Qwen2 BPE: either the fast tokenizer file or the vocab/merges pair.
TOKENIZER_ALTERNATIVES = (("CosyVoice-BlankEN/tokenizer.json",), ("CosyVoice-BlankEN/vocab.json", "CosyVoice-BlankEN/merges.txt"))


def missing_files(model_dir: Path) -> list[str]:
    """Relative paths that the engine needs and ``model_dir`` lacks (empty: all present)."""
    model_dir = Path(model_dir)
    missing = [f for f in REQUIRED_FILES if not (model_dir / f).is_file()]
    if not any(all((model_dir / f).is_file() for f in group) for group in TOKENIZER_ALTERNATIVES):
        missing += [f for f in TOKENIZER_ALTERNATIVES[1] if not (model_dir / f).is_file()]
    return missing


class CheckpointError(ValueError):
    """A checkpoint does not match the architecture its yaml describes."""


def fold_weight_norm(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Replace weight-norm pairs by the weight they stand for (dim 0, as torch does).

    Accepts both layouts torch has used: ``.weight_g``/``.weight_v`` and
    ``.parametrizations.weight.original0``/``original1``.
    """
    pairs = {
        ".parametrizations.weight.original0": ".parametrizations.weight.original1",
        ".weight_g": ".weight_v",
    }
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        for g_suffix, v_suffix in pairs.items():
            if key.endswith(g_suffix):
                stem = key[: -len(g_suffix)]
                v = state.get(stem + v_suffix)
                if v is None:
                    raise CheckpointError(f"{key} has no matching {v_suffix}")
                out[stem + ".weight"] = torch._weight_norm(v.float(), value.float(), 0)
                break
            if key.endswith(v_suffix):
                break  # consumed with its g
        else:
            out[key] = value
    return out


def _strict_load(module: nn.Module, state: dict[str, Tensor], name: str) -> None:
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{name}: {len(missing)} missing keys {missing[:5]}, {len(unexpected)} unexpected keys {unexpected[:5]}"
        )
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise CheckpointError(f"{name}: {key} has shape {tuple(value.shape)}, expected {tuple(expected[key].shape)}")
    module.load_state_dict(state, strict=True, assign=True)


def _read(path: Path) -> dict[str, Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same failure to the user
        raise CheckpointError(f"cannot read {path.name}: {exc}") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"{path.name} is not a state dict")
    return state


def load_lm(path: Path, cfg: CosyVoice2Config) -> SpeechLM:
    with torch.device("meta"):
        lm = SpeechLM(cfg.lm)
    state = dict(_read(path))
    head, embed = "llm.model.lm_head.weight", "llm.model.model.embed_tokens.weight"
    if cfg.lm.qwen.tie_word_embeddings and head not in state and embed in state:
        state[head] = state[embed]  # a tied head may have been saved once
    _strict_load(lm, state, path.name)
    if cfg.lm.qwen.tie_word_embeddings:
        lm.llm.model.lm_head.weight = lm.llm.model.model.embed_tokens.weight
    return lm


def load_flow(path: Path, cfg: CosyVoice2Config) -> CausalFlow:
    with torch.device("meta"):
        flow = CausalFlow(cfg.flow)
    _strict_load(flow, _read(path), path.name)
    return flow


def load_hift(path: Path, cfg: CosyVoice2Config) -> HiFTGenerator:
    state = {k.removeprefix("generator."): v for k, v in _read(path).items()}
    with torch.device("meta"):
        hift = HiFTGenerator(cfg.hift)
    _strict_load(hift, fold_weight_norm(state), path.name)
    # Buffers made on the meta device are rebuilt for real.
    hift.register_buffer("window", torch.hann_window(cfg.hift.n_fft, periodic=True), persistent=False)
    return hift


@dataclass
class Models:
    cfg: CosyVoice2Config
    lm: SpeechLM
    flow: CausalFlow
    hift: HiFTGenerator


def load_models(model_dir: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Models:
    """Load all three networks. The LM and flow run in ``dtype``; HiFT stays fp32
    (its iSTFT and sine source want the precision, and it is cheap)."""
    model_dir = Path(model_dir)
    cfg = load_config(model_dir)
    lm = load_lm(model_dir / "llm.pt", cfg).to(device=device, dtype=dtype).eval()
    flow = load_flow(model_dir / "flow.pt", cfg).to(device=device, dtype=dtype).eval()
    hift = load_hift(model_dir / "hift.pt", cfg).to(device=device, dtype=torch.float32).eval()
    return Models(cfg, lm, flow, hift)
