"""Loading: the released yaml layout, and a full-size random checkpoint, strictly.

The full-size checkpoint's keys and shapes come from the reference modules built on
the meta device (no memory), filled with random values: llm.pt in bf16 (~1 GB on
disk, 0.5B parameters), flow.pt and hift.pt in fp32, weight norm as torch stores it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from voxwire.engine.cosyvoice2.model_config import ConfigError, QwenConfig, parse_config
from voxwire.engine.cosyvoice2.qwen2 import KVCache
from voxwire.engine.cosyvoice2.tiny import QWEN2_0_5B, release_yaml
from voxwire.engine.cosyvoice2.weights import CheckpointError, fold_weight_norm, load_hift, load_models
from voxwire.engine.cosyvoice2.yaml_reader import load_hyperpyyaml


def _random_like(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for k, v in state.items():
        if v.is_floating_point():
            out[k] = (torch.randn(v.shape, generator=g) * 0.02).to(dtype)
        else:
            out[k] = torch.zeros(v.shape, dtype=v.dtype)
    return out


@pytest.fixture(scope="module")
def full_dir(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path, reference) -> Path:
    path = tmp_path_factory.mktemp("cv2_full")
    (path / "cosyvoice2.yaml").write_text(release_yaml())
    shutil.copytree(tiny_dir / "CosyVoice-BlankEN", path / "CosyVoice-BlankEN")
    (path / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps(QWEN2_0_5B))
    for name in ("campplus.onnx", "speech_tokenizer_v2.onnx"):
        shutil.copy(tiny_dir / name, path / name)
    data = load_hyperpyyaml(release_yaml())
    with torch.device("meta"):
        modules = {key: reference.instantiate(data[key], path) for key in ("llm", "flow", "hift")}
    for key, module in modules.items():
        state = _random_like(module.state_dict(), torch.bfloat16 if key == "llm" else torch.float32)
        if key == "llm":  # tied embeddings are saved as one storage under both keys
            state["llm.model.lm_head.weight"] = state["llm.model.model.embed_tokens.weight"]
        torch.save(state, path / f"{key}.pt")
        del state
    return path


@pytest.mark.slow  # builds and loads a full-size (0.5B) checkpoint
@torch.inference_mode()
def test_full_size_checkpoint_loads_strictly(full_dir: Path) -> None:
    models = load_models(full_dir)
    n_lm = sum(p.numel() for p in models.lm.parameters())
    assert 490e6 < n_lm < 520e6, n_lm  # Qwen2-0.5B + speech embeddings/head
    assert models.lm.llm.model.lm_head.weight is models.lm.llm.model.model.embed_tokens.weight
    ref = torch.load(full_dir / "llm.pt", map_location="cpu", weights_only=True, mmap=True)
    key = "llm.model.model.layers.23.mlp.down_proj.weight"
    assert torch.equal(models.lm.state_dict()[key], ref[key].float())
    # Usable, not just loaded: one prefill through all 24 layers.
    cache = KVCache(models.cfg.lm.qwen, 16, "cpu", torch.float32)
    logp = models.lm.logprobs(models.lm.prompt_embeds(torch.arange(5), torch.arange(3)), cache)
    assert logp.shape == (6564,) and torch.isfinite(logp).all()
    flow_params = sum(p.numel() for p in models.flow.parameters())
    assert flow_params > 50e6, flow_params


@pytest.mark.slow  # needs the full-size checkpoint (about 11 s to build)
def test_a_wrong_checkpoint_is_refused(full_dir: Path, tmp_path: Path) -> None:
    state = torch.load(full_dir / "hift.pt", map_location="cpu", weights_only=True)
    state.pop("conv_post.bias")
    state["unexpected.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "hift.pt")
    from voxwire.engine.cosyvoice2.model_config import load_config

    with pytest.raises(CheckpointError, match="missing keys.*conv_post.bias.*unexpected keys"):
        load_hift(tmp_path / "hift.pt", load_config(full_dir))


def test_legacy_weight_norm_keys_fold_the_same() -> None:
    v, g = torch.randn(4, 3, 5), torch.rand(4, 1, 1) + 0.5
    new = fold_weight_norm({"c.parametrizations.weight.original0": g, "c.parametrizations.weight.original1": v})
    old = fold_weight_norm({"c.weight_g": g, "c.weight_v": v, "c.bias": torch.zeros(4)})
    assert torch.allclose(new["c.weight"], old["c.weight"]) and set(old) == {"c.weight", "c.bias"}
    assert torch.allclose(new["c.weight"].flatten(1).norm(dim=1), g.flatten())


def test_yaml_refs_and_unsupported_options() -> None:
    data = load_hyperpyyaml(release_yaml())
    assert data["flow"].get("decoder").get("estimator").get("static_chunk_size") == 50  # <a> * <b>
    qwen = QwenConfig(**{k: QWEN2_0_5B[k] for k in QwenConfig.__dataclass_fields__})
    bad = release_yaml().replace("use_cnn_module: False", "use_cnn_module: True")
    with pytest.raises(ConfigError, match="use_cnn_module"):
        parse_config(load_hyperpyyaml(bad), qwen)
