"""The model's configuration as frozen dataclasses: the numbers each module is built from.

``load_config(model_dir)`` reads ``cosyvoice2.yaml`` (through yaml_reader.py, which
builds nothing) and ``CosyVoice-BlankEN/config.json``; ``parse_config`` checks that the
file describes the architecture this engine implements and picks out its numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .yaml_reader import ConfigError, Tagged, load_hyperpyyaml

__all__ = [
    "CFMConfig", "ConfigError", "CosyVoice2Config", "EncoderConfig", "EstimatorConfig", "FlowConfig",
    "HiFTConfig", "LMConfig", "MelConfig", "QwenConfig", "SamplingConfig", "load_config", "parse_config",
]  # fmt: skip


@dataclass(frozen=True)
class QwenConfig:
    """The Qwen2 backbone, from ``CosyVoice-BlankEN/config.json``."""

    hidden_size: int = 896
    intermediate_size: int = 4864
    num_hidden_layers: int = 24
    num_attention_heads: int = 14
    num_key_value_heads: int = 2
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    vocab_size: int = 151936
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_json(cls, path: Path) -> QwenConfig:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} is not readable JSON: {exc}") from exc
        names = cls.__dataclass_fields__
        return cls(**{k: data[k] for k in names if k in data})


@dataclass(frozen=True)
class SamplingConfig:
    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1


@dataclass(frozen=True)
class LMConfig:
    qwen: QwenConfig
    speech_token_size: int = 6561
    sampling: SamplingConfig = SamplingConfig()
    # Not in the yaml: the reference's inference() defaults.
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0


@dataclass(frozen=True)
class EncoderConfig:
    input_size: int = 512
    output_size: int = 512
    attention_heads: int = 8
    linear_units: int = 2048
    num_blocks: int = 6
    num_up_blocks: int = 4  # fixed in the reference
    static_chunk_size: int = 25  # in tokens; the up-sampled layers use it x stride
    pre_lookahead_len: int = 3
    upsample_stride: int = 2


@dataclass(frozen=True)
class EstimatorConfig:
    in_channels: int = 320
    out_channels: int = 80
    channels: tuple[int, ...] = (256,)
    attention_head_dim: int = 64
    n_blocks: int = 4
    num_mid_blocks: int = 12
    num_heads: int = 8
    static_chunk_size: int = 50  # in mel frames
    num_decoding_left_chunks: int = -1


@dataclass(frozen=True)
class CFMConfig:
    sigma_min: float = 1e-6
    t_scheduler: str = "cosine"
    inference_cfg_rate: float = 0.7
    n_timesteps: int = 10  # fixed in the reference's flow.inference
    spk_emb_dim: int = 80
    noise_frames: int = 50 * 300  # the reference draws this much fixed noise
    noise_seed: int = 0


@dataclass(frozen=True)
class FlowConfig:
    input_size: int = 512
    output_size: int = 80
    spk_embed_dim: int = 192
    vocab_size: int = 6561
    input_frame_rate: int = 25
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    encoder: EncoderConfig = EncoderConfig()
    estimator: EstimatorConfig = EstimatorConfig()
    cfm: CFMConfig = CFMConfig()


@dataclass(frozen=True)
class HiFTConfig:
    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    n_fft: int = 16
    hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_in_channels: int = 80
    f0_cond_channels: int = 512
    f0_num_class: int = 1

    @property
    def upsample_scale(self) -> int:
        scale = self.hop_len
        for r in self.upsample_rates:
            scale *= r
        return scale


@dataclass(frozen=True)
class MelConfig:
    """The matcha-style mel used for the flow's prompt (``feat_extractor``)."""

    n_fft: int = 1920
    num_mels: int = 80
    sampling_rate: int = 24000
    hop_size: int = 480
    win_size: int = 1920
    fmin: float = 0.0
    fmax: float | None = 8000.0
    center: bool = False


@dataclass(frozen=True)
class CosyVoice2Config:
    lm: LMConfig
    flow: FlowConfig
    hift: HiFTConfig
    mel: MelConfig
    sample_rate: int = 24000
    token_frame_rate: int = 25
    token_mel_ratio: int = 2
    chunk_size: int = 25


def _expect(node: Any, class_name: str, where: str) -> Tagged:
    if not isinstance(node, Tagged) or node.class_name != class_name:
        found = node.target if isinstance(node, Tagged) else type(node).__name__
        raise ConfigError(f"cosyvoice2.yaml: {where} should be {class_name}, found {found}")
    return node


def _pick(node: Tagged, cls: type, rename: dict[str, str] | None = None, **extra: Any) -> Any:
    """Build ``cls`` from the node's kwargs that name its fields; the rest keep defaults."""
    rename = rename or {}
    known = {f.name for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in node.kwargs.items():
        name = rename.get(key, key)
        if name in known:
            values[name] = _freeze(value)
    values.update(extra)
    return cls(**values)


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _require(node: Tagged, key: str, allowed: tuple[Any, ...], where: str) -> None:
    value = node.get(key, allowed[0])
    if value not in allowed:
        raise ConfigError(f"cosyvoice2.yaml: {where}.{key} = {value!r} is not supported")


def parse_config(data: dict[str, Any], qwen: QwenConfig) -> CosyVoice2Config:
    """Read the numbers every module needs out of the parsed yaml."""
    for key in ("llm", "flow", "hift"):
        if key not in data:
            raise ConfigError(f"cosyvoice2.yaml has no '{key}' entry")
    lm = _parse_lm(data["llm"], qwen)
    flow_cfg = _parse_flow(data["flow"])
    hift = _parse_hift(data["hift"])
    mel = MelConfig()
    feat = data.get("feat_extractor")
    if isinstance(feat, Tagged):
        mel = _pick(feat, MelConfig)

    return CosyVoice2Config(
        lm=lm,
        flow=flow_cfg,
        hift=hift,
        mel=mel,
        sample_rate=int(data.get("sample_rate", hift.sampling_rate)),
        token_frame_rate=int(data.get("token_frame_rate", flow_cfg.input_frame_rate)),
        token_mel_ratio=flow_cfg.token_mel_ratio,
        chunk_size=int(data.get("chunk_size", flow_cfg.encoder.static_chunk_size or 25)),
    )


def _parse_lm(node: Any, qwen: QwenConfig) -> LMConfig:
    llm = _expect(node, "Qwen2LM", "llm")
    sampling_node = llm.get("sampling")
    sampling = SamplingConfig()
    if isinstance(sampling_node, Tagged):
        if sampling_node.class_name != "ras_sampling":
            raise ConfigError(f"llm.sampling {sampling_node.target} is not supported")
        sampling = _pick(sampling_node, SamplingConfig)
    if int(llm.get("llm_input_size", qwen.hidden_size)) != qwen.hidden_size:
        raise ConfigError("llm.llm_input_size does not match CosyVoice-BlankEN/config.json")
    return LMConfig(
        qwen=qwen,
        speech_token_size=int(llm.get("speech_token_size", 6561)),
        sampling=sampling,
    )


def _parse_flow(node: Any) -> FlowConfig:
    flow = _expect(node, "CausalMaskedDiffWithXvec", "flow")
    enc = _expect(flow.get("encoder"), "UpsampleConformerEncoder", "flow.encoder")
    for key, allowed in (
        ("input_layer", ("linear",)),
        ("pos_enc_layer_type", ("rel_pos_espnet",)),
        ("selfattention_layer_type", ("rel_selfattn",)),
        ("use_cnn_module", (False,)),
        ("macaron_style", (False,)),
        ("normalize_before", (True,)),
        ("activation_type", ("swish",)),
    ):
        _require(enc, key, allowed, "flow.encoder")
    pre_lookahead = int(flow.get("pre_lookahead_len", 3))
    token_mel_ratio = int(flow.get("token_mel_ratio", 2))
    encoder = _pick(
        enc,
        EncoderConfig,
        pre_lookahead_len=pre_lookahead,
        upsample_stride=token_mel_ratio,
        static_chunk_size=int(enc.get("static_chunk_size", 0) or 0),
    )
    cfm, estimator = _parse_decoder(flow.get("decoder"))
    flow_cfg = _pick(
        flow,
        FlowConfig,
        encoder=encoder,
        estimator=estimator,
        cfm=cfm,
        token_mel_ratio=token_mel_ratio,
        pre_lookahead_len=pre_lookahead,
    )
    if flow_cfg.output_size != estimator.out_channels:
        raise ConfigError("flow.output_size and the estimator's out_channels differ")
    return flow_cfg


def _parse_decoder(node: Any) -> tuple[CFMConfig, EstimatorConfig]:
    cfm_node = _expect(node, "CausalConditionalCFM", "flow.decoder")
    params = cfm_node.get("cfm_params")
    if isinstance(params, Tagged):  # !new:omegaconf.DictConfig {content: {...}}
        params = params.get("content", params.kwargs)
    params = params or {}
    if params.get("solver", "euler") != "euler":
        raise ConfigError("only the euler solver is supported")
    cfm = CFMConfig(
        sigma_min=float(params.get("sigma_min", 1e-6)),
        t_scheduler=str(params.get("t_scheduler", "cosine")),
        inference_cfg_rate=float(params.get("inference_cfg_rate", 0.7)),
        spk_emb_dim=int(cfm_node.get("spk_emb_dim", 80)),
    )
    est = _expect(cfm_node.get("estimator"), "CausalConditionalDecoder", "flow.decoder.estimator")
    if est.get("act_fn", "gelu") != "gelu":
        raise ConfigError("flow.decoder.estimator.act_fn must be gelu")
    return cfm, _pick(est, EstimatorConfig)


def _parse_hift(node: Any) -> HiFTConfig:
    hift_node = _expect(node, "HiFTGenerator", "hift")
    istft = hift_node.get("istft_params", {}) or {}
    f0 = hift_node.get("f0_predictor")
    f0_extra: dict[str, Any] = {}
    if isinstance(f0, Tagged):
        _expect(f0, "ConvRNNF0Predictor", "hift.f0_predictor")
        f0_extra = {
            "f0_in_channels": int(f0.get("in_channels", 80)),
            "f0_cond_channels": int(f0.get("cond_channels", 512)),
            "f0_num_class": int(f0.get("num_class", 1)),
        }
    return _pick(
        hift_node,
        HiFTConfig,
        n_fft=int(istft.get("n_fft", 16)),
        hop_len=int(istft.get("hop_len", 4)),
        **f0_extra,
    )


def load_config(model_dir: Path) -> CosyVoice2Config:
    """Read ``cosyvoice2.yaml`` and ``CosyVoice-BlankEN/config.json`` from a model directory."""
    yaml_path = model_dir / "cosyvoice2.yaml"
    try:
        text = yaml_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {yaml_path}: {exc}") from exc
    qwen = QwenConfig.from_json(model_dir / "CosyVoice-BlankEN" / "config.json")
    return parse_config(load_hyperpyyaml(text), qwen)
