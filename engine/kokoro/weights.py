"""Kokoro's weights into ``Kokoro``: the official checkpoint's layout, weight norm folded.

The official ``kokoro-v1_0.pth`` is a dict of the KModel's five parts (``bert``,
``bert_encoder``, ``predictor``, ``text_encoder``, ``decoder``), each a state dict whose
weight-normed layers keep ``weight_g`` and ``weight_v`` (and, in some copies, keys
prefixed ``module.`` by DataParallel). engine/kokoro/int8_graph.py gives the same layout
from the int8 graph, already folded.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path

import torch

from voxwire.engine.base import EngineError
from voxwire.engine.errors import ErrorCode
from voxwire.engine.kokoro.model import Kokoro, KokoroConfig

PARTS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
# Kept by the checkpoint, unused at inference: ALBERT's pooler and its position-id buffers.
_UNUSED = ("pooler.", "embeddings.position_ids", "embeddings.token_type_ids")


def _fold(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weight_g`` and ``weight_v`` as the weight they make: g * v / |v|, the norm over
    every dimension but the first (torch's ``weight_norm`` with dim=0)."""
    named = {key.removeprefix("module."): value for key, value in state.items()}
    out: dict[str, torch.Tensor] = {}
    for key, value in named.items():
        if key.endswith(".weight_g"):
            continue
        if key.endswith(".weight_v"):
            stem = key.removesuffix("weight_v")
            dims = tuple(range(1, value.dim()))
            out[stem + "weight"] = named[stem + "weight_g"] * value / value.norm(dim=dims, keepdim=True)
        else:
            out[key] = value
    return out


def load_parts(model: Kokoro, parts: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
    """Load the five parts into ``model``, strictly: a missing or misshapen weight is an
    error naming it, not a silently random layer."""
    state: dict[str, torch.Tensor] = {}
    for part in PARTS:
        if part not in parts:
            raise EngineError(ErrorCode.MODEL_INVALID, f"the Kokoro weights lack their {part!r} part")
        for key, value in _fold(parts[part]).items():
            if not key.startswith(_UNUSED):
                state[f"{part}.{key}"] = value.float()
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise EngineError(ErrorCode.MODEL_INVALID, f"the Kokoro weights do not fit Kokoro-82M: {e}") from e


def load_checkpoint(path: Path, config: KokoroConfig | None = None) -> Kokoro:
    """A ``Kokoro`` from an official checkpoint file (``kokoro-v1_0.pth``)."""
    try:
        parts = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
        raise EngineError(ErrorCode.MODEL_INVALID, f"cannot read the Kokoro checkpoint {path}: {e}") from e
    model = Kokoro(config or KokoroConfig())
    load_parts(model, parts)
    return model.eval()
