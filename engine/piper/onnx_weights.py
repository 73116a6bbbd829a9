"""Load a Piper voice's ONNX weights into the torch ``Vits``.

The export keeps most parameter names (``dec.ups.0.weight``), but constant folding
renamed a few: weight-normed WaveNet convs become ``onnx::Conv_8168``, the phoneme
embedding can carry an input's name (``sid``), and ``exp(-logs)`` of the duration
predictor's affine flow is folded into ``/dp/flows.0/Exp_output_0``. Those are named
by the graph node that consumes them: node names keep the module scope
(``/flow/flows.6/enc/in_layers.0/Conv``) and the input slot says weight or bias.

Hyperparameters come from the tensors' shapes and the consuming nodes' attributes
(strides, dilations), so other Piper VITS voices load without a hand-written config.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from .vits import Vits, VitsConfig

if TYPE_CHECKING:
    import onnx  # imported at runtime only where a file is read, to keep importing this cheap


class VitsLoadError(ValueError):
    """The ONNX file does not hold the VITS weights this module expects."""


@dataclass(frozen=True)
class VoiceConfig:
    """The parts of a Piper voice's JSON config that inference needs."""

    sample_rate: int
    noise_scale: float
    length_scale: float
    noise_w: float
    hop_length: int | None = None
    phoneme_id_map: dict[str, list[int]] = field(default_factory=dict)
    raw: dict = field(default_factory=dict)


def default_config_path(onnx_path: str | Path) -> Path:
    return Path(f"{onnx_path}.json")


def read_voice_config(onnx_path: str | Path, config_path: str | Path | None = None) -> VoiceConfig:
    path = Path(config_path) if config_path is not None else default_config_path(onnx_path)
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    inference = raw.get("inference", {})
    return VoiceConfig(
        sample_rate=int(raw["audio"]["sample_rate"]),
        noise_scale=float(inference.get("noise_scale", 0.667)),
        length_scale=float(inference.get("length_scale", 1.0)),
        noise_w=float(inference.get("noise_w", 0.8)),
        hop_length=raw.get("hop_length"),
        phoneme_id_map=raw.get("phoneme_id_map", {}),
        raw=raw,
    )


@dataclass
class OnnxTensor:
    value: np.ndarray
    source: str  # initializer name in the file
    attrs: dict[str, object]  # attributes of the consuming Conv/ConvTranspose node


_PARAM_NAME = re.compile(r"^[A-Za-z_]\w*(\.\w+)+$")
_SCOPED_NODE = re.compile(r"^/(?P<path>.+)/[^/]+$")
_FOLDED_EXP = re.compile(r"^/(?P<path>.+)/Exp(_\d+)?_output_0$")
# (op, input slot) -> parameter of the module named by the node's scope.
_WEIGHT_SLOTS = {
    ("Conv", 1): "weight",
    ("Conv", 2): "bias",
    ("ConvTranspose", 1): "weight",
    ("ConvTranspose", 2): "bias",
    ("Gather", 0): "weight",  # nn.Embedding
    ("MatMul", 1): "weight",  # nn.Linear, stored transposed
}


def _negated_logs(uses: list[tuple[onnx.NodeProto, int]]) -> str | None:
    """The module path of an ElementwiseAffine whose ``-logs`` this initializer is: its
    one consumer is that module's Exp node."""
    if len(uses) != 1 or uses[0][0].op_type != "Exp":
        return None
    scope = _SCOPED_NODE.match(uses[0][0].name)
    return scope["path"].replace("/", ".") if scope else None


def read_onnx_tensors(model: onnx.ModelProto) -> dict[str, OnnxTensor]:
    """Initializers under their torch parameter names, in file order. Graph constants
    (shapes, indices, scalars) are skipped."""
    from onnx import helper, numpy_helper

    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in model.graph.node:
        for slot, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, slot))

    out: dict[str, OnnxTensor] = {}
    for init in model.graph.initializer:
        value = numpy_helper.to_array(init)
        is_float = np.issubdtype(value.dtype, np.floating)
        uses = consumers.get(init.name, [])
        target, attrs = None, {}
        for node, slot in uses:
            param = _WEIGHT_SLOTS.get((node.op_type, slot))
            scope = _SCOPED_NODE.match(node.name)
            if param and scope:
                if not target:
                    target = f"{scope['path'].replace('/', '.')}.{param}"
                    if node.op_type == "MatMul":
                        value = value.T
                if node.op_type in ("Conv", "ConvTranspose"):
                    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                break
        if _PARAM_NAME.match(init.name):
            target = init.name  # named initializers map by name
        elif target is None and is_float and (m := _FOLDED_EXP.match(init.name)):
            # ElementwiseAffine in reverse multiplies by exp(-logs); the exporter folded
            # Neg+Exp of the parameter into this constant.
            target = f"{m['path'].replace('/', '.')}.logs"
            value = -np.log(value)
        elif target is None and is_float and (affine := _negated_logs(uses)):
            # The same, where the exporter folded only the Neg (an Exp node reads it).
            target, value = f"{affine}.logs", -value
        if target is None:
            if is_float and value.size > 1:
                raise VitsLoadError(
                    f"initializer {init.name!r} {list(value.shape)} does not map to any "
                    "model parameter (no Conv/Gather/MatMul consumer with a module scope)"
                )
            continue  # a graph constant
        if not is_float:
            raise VitsLoadError(f"tensor {target!r} ({init.name!r}) has dtype {value.dtype}")
        if target in out:
            raise VitsLoadError(
                f"tensor {target!r} is given twice (initializers "
                f"{out[target].source!r} and {init.name!r})"
            )
        out[target] = OnnxTensor(np.ascontiguousarray(value, dtype=np.float32), init.name, attrs)
    return out


def _indices(tensors: dict[str, OnnxTensor], pattern: str) -> list[int]:
    rx = re.compile(pattern)
    return sorted({int(m[1]) for name in tensors if (m := rx.fullmatch(name))})


def _first_int(tensor: OnnxTensor, attr: str) -> int | None:
    """The first value of an ints attribute (``dilations``, ``strides``) of the tensor's
    Conv node; None where the node has none."""
    value = tensor.attrs.get(attr)
    if not value:
        return None
    if not isinstance(value, (list, tuple)):
        raise VitsLoadError(
            f"initializer {tensor.source!r}: its Conv node's {attr} is {value!r}, not a list"
        )
    return int(value[0])


def config_from_tensors(tensors: dict[str, OnnxTensor], sample_rate: int) -> VitsConfig:
    """Hyperparameters from shapes (and, where shapes can't tell, node attributes)."""

    def get(name: str) -> OnnxTensor:
        if name not in tensors:
            raise VitsLoadError(f"missing tensor {name!r}")
        return tensors[name]

    def shape(name: str) -> tuple[int, ...]:
        return get(name).value.shape

    def dilation(name: str) -> int:
        d = _first_int(get(name), "dilations")
        if d is None:
            raise VitsLoadError(f"tensor {name!r}: its Conv node has no dilations attribute")
        return d

    def stride(name: str, kernel: int) -> int:
        s = _first_int(get(name), "strides")
        return kernel // 2 if s is None else s

    n_vocab, hidden = shape("enc_p.emb.weight")
    _, rel_positions, k_channels = shape("enc_p.encoder.attn_layers.0.emb_rel_k")
    filter_channels, _, kernel_size = shape("enc_p.encoder.ffn_layers.0.conv_1.weight")

    dp_convflows = _indices(tensors, r"dp\.flows\.(\d+)\.pre\.weight")
    dp_proj = f"dp.flows.{dp_convflows[0] if dp_convflows else 3}.proj.weight"

    n_ups = len(_indices(tensors, r"dec\.ups\.(\d+)\.weight"))
    ups_kernels = tuple(shape(f"dec.ups.{i}.weight")[2] for i in range(n_ups))
    ups_rates = tuple(stride(f"dec.ups.{i}.weight", k) for i, k in enumerate(ups_kernels))
    n_blocks = len(_indices(tensors, r"dec\.resblocks\.(\d+)\..*"))
    if n_ups == 0 or n_blocks % n_ups:
        raise VitsLoadError(f"{n_blocks} decoder resblocks do not divide into {n_ups} upsamples")
    kernels = n_blocks // n_ups
    resblock = "1" if "dec.resblocks.0.convs1.0.weight" in tensors else "2"
    conv = "convs1" if resblock == "1" else "convs"
    block_kernels, block_dilations = [], []
    for j in range(kernels):
        convs = _indices(tensors, rf"dec\.resblocks\.{j}\.{conv}\.(\d+)\.weight")
        block_kernels.append(shape(f"dec.resblocks.{j}.{conv}.0.weight")[2])
        block_dilations.append(
            tuple(dilation(f"dec.resblocks.{j}.{conv}.{c}.weight") for c in convs)
        )

    flow_layers = len(_indices(tensors, r"flow\.flows\.0\.enc\.in_layers\.(\d+)\.weight"))
    n_speakers, gin_channels = shape("emb_g.weight") if "emb_g.weight" in tensors else (1, 0)
    return VitsConfig(
        n_vocab=n_vocab,
        hidden_channels=hidden,
        filter_channels=filter_channels,
        n_heads=hidden // k_channels,
        n_layers=len(_indices(tensors, r"enc_p\.encoder\.attn_layers\.(\d+)\.conv_q\.weight")),
        kernel_size=kernel_size,
        window_size=(rel_positions - 1) // 2,
        inter_channels=shape("enc_p.proj.weight")[0] // 2,
        dp_filter_channels=shape("dp.pre.weight")[0],
        dp_kernel_size=shape("dp.convs.convs_sep.0.weight")[2],
        dp_n_layers=len(_indices(tensors, r"dp\.convs\.convs_sep\.(\d+)\.weight")),
        dp_n_flows=len(dp_convflows) + 1,  # + the convflow dropped at inference
        dp_num_bins=(shape(dp_proj)[0] + 1) // 3,
        flow_n_flows=len(_indices(tensors, r"flow\.flows\.(\d+)\.pre\.weight")),
        flow_n_layers=flow_layers,
        flow_kernel_size=shape("flow.flows.0.enc.in_layers.0.weight")[2],
        flow_dilation_rate=(
            dilation("flow.flows.0.enc.in_layers.1.weight") if flow_layers > 1 else 1
        ),
        resblock=resblock,
        resblock_kernel_sizes=tuple(block_kernels),
        resblock_dilation_sizes=tuple(block_dilations),
        upsample_rates=ups_rates,
        upsample_initial_channel=shape("dec.conv_pre.weight")[0],
        upsample_kernel_sizes=ups_kernels,
        sample_rate=sample_rate,
        n_speakers=n_speakers,
        gin_channels=gin_channels,
    )


def _check_conv_attrs(model: Vits, name: str, tensor: OnnxTensor) -> None:
    """The consuming node's geometry must match the torch conv the tensor lands in."""
    if not tensor.attrs or not name.endswith(".weight"):
        return
    module = model.get_submodule(name.rsplit(".", 1)[0])
    if not isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
        return
    a = tensor.attrs
    want = {
        "kernel_shape": list(module.kernel_size),
        "strides": list(module.stride),
        "dilations": list(module.dilation),
        "group": module.groups,
    }  # not pads: the export may pad in a separate Pad node (the encoder's FFN does)
    for key, expected in want.items():
        got = a.get(key)
        if got is not None and (list(got) if isinstance(got, (list, tuple)) else got) != expected:
            raise VitsLoadError(
                f"tensor {name!r} ({tensor.source!r}): graph node has {key}={got}, "
                f"model expects {expected}"
            )


def load_vits(
    onnx_path: str | Path, device: str = "cpu", config_path: str | Path | None = None
) -> Vits:
    """Build a ``Vits`` from a Piper ONNX voice; every parameter is set exactly once."""
    import onnx

    onnx_path = Path(onnx_path)
    try:
        proto = onnx.load(str(onnx_path))
    except Exception as e:  # onnx raises DecodeError and friends
        raise VitsLoadError(f"{onnx_path}: not a readable ONNX file ({e})") from e
    json_path = Path(config_path) if config_path is not None else default_config_path(onnx_path)
    voice = read_voice_config(onnx_path, json_path) if json_path.exists() else None
    tensors = read_onnx_tensors(proto)
    cfg = config_from_tensors(tensors, voice.sample_rate if voice else VitsConfig.sample_rate)
    takes_sid = any(i.name == "sid" for i in proto.graph.input)
    if takes_sid != (cfg.n_speakers > 1):
        raise VitsLoadError(
            f"{onnx_path}: the graph {'takes' if takes_sid else 'takes no'} speaker id but has "
            f"{cfg.n_speakers} speaker embeddings"
        )
    if voice and int(voice.raw.get("num_speakers", 1)) != cfg.n_speakers:
        raise VitsLoadError(
            f"{json_path}: num_speakers {voice.raw.get('num_speakers')} but the model has "
            f"{cfg.n_speakers} speaker embeddings"
        )
    if voice and voice.hop_length and voice.hop_length != cfg.hop_length:
        raise VitsLoadError(
            f"{json_path}: hop_length {voice.hop_length} but the decoder upsamples by "
            f"{cfg.hop_length}"
        )

    model = Vits(cfg)
    expected = dict(model.named_parameters())
    state: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name not in expected:
            raise VitsLoadError(f"unexpected tensor {name!r} ({tensor.source!r}) in {onnx_path}")
        want = tuple(expected[name].shape)
        if tensor.value.shape != want:
            raise VitsLoadError(
                f"tensor {name!r} ({tensor.source!r}) has shape {list(tensor.value.shape)}, "
                f"expected {list(want)}"
            )
        _check_conv_attrs(model, name, tensor)
        state[name] = torch.tensor(tensor.value)
    missing = [n for n in expected if n not in state]
    if missing:
        raise VitsLoadError(f"missing tensor {missing[0]!r} ({len(missing)} missing in all)")
    model.load_state_dict(state, strict=True)
    return model.to(device).eval().requires_grad_(False)
