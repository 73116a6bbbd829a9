"""First-chunk latency of the CosyVoice2 engine under concurrency (random weights).

Builds the full-size CosyVoice2-0.5B architecture with random weights in memory (no
download, no checkpoint files), registers nothing: each utterance uses a random
prompt of ``--prompt-seconds``. The LM is forced to emit exactly ``--tokens`` speech
tokens. ``C`` utterances start together and are advanced round-robin on one thread,
as the engine worker does (utterances without audio first), and we time each one's
first audio piece. Prints a markdown table and a JSON line.

    .venv/bin/python -m benchmarks.cosyvoice2_gpu                  # CUDA, full size, bf16
    .venv/bin/python -m benchmarks.cosyvoice2_gpu --tiny --device cpu --concurrency 1 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from engine.cosyvoice2.flow import CausalFlow
from engine.cosyvoice2.frontend import Prompt
from engine.cosyvoice2.hift import HiFTGenerator
from engine.cosyvoice2.lm import SpeechLM
from engine.cosyvoice2.model_config import QwenConfig, parse_config
from engine.cosyvoice2.pipeline import Stats, synthesize_ids
from engine.cosyvoice2.weights import Models, load_models
from engine.cosyvoice2.yaml_reader import load_hyperpyyaml


def full_size_models(device: torch.device, dtype: torch.dtype) -> Models:
    from engine.cosyvoice2.tiny import QWEN2_0_5B, release_yaml

    qwen = QwenConfig(**{k: QWEN2_0_5B[k] for k in QwenConfig.__dataclass_fields__})
    cfg = parse_config(load_hyperpyyaml(release_yaml()), qwen)
    torch.manual_seed(0)
    with torch.device(device):
        lm = SpeechLM(cfg.lm).to(dtype).eval()
        flow = CausalFlow(cfg.flow).to(dtype).eval()
        hift = HiFTGenerator(cfg.hift).eval()
    with torch.no_grad():  # keep random activations in a sane range
        for module in (lm, flow, hift):
            for p in module.parameters():
                if p.dim() >= 2:
                    p.mul_(0.5)
    return Models(cfg, lm, flow.to(device), hift.to(device))


def random_prompt(models: Models, seconds: float, seed: int) -> Prompt:
    rng = np.random.default_rng(seed)
    n = int(seconds * models.cfg.token_frame_rate)
    return Prompt(
        text_ids=rng.integers(0, min(1000, models.cfg.lm.qwen.vocab_size - 32), 30).astype(np.int64),
        speech_tokens=rng.integers(0, models.cfg.lm.speech_token_size, n).astype(np.int64),
        mel=(rng.standard_normal((2 * n, 80)) - 5).astype(np.float32),
        embedding=rng.standard_normal(192).astype(np.float32),
    )


def run_level(models: Models, concurrency: int, args: argparse.Namespace, sync) -> list[float]:
    stats = Stats()
    latencies: list[float] = []
    for rep in range(args.repeats):
        gens, started, firsts = [], [], {}
        for i in range(concurrency):
            prompt = random_prompt(models, args.prompt_seconds, seed=i)
            text = [(100 + k) % (models.cfg.lm.qwen.vocab_size - 32) for k in range(args.text_tokens)]
            g = torch.Generator(device=models.flow.input_embedding.weight.device).manual_seed(rep * 1000 + i)
            gens.append(
                synthesize_ids(
                    models, prompt, text, stats=stats, first_chunk_tokens=args.first_chunk,
                    generator=g, min_tokens=args.tokens, max_tokens=args.tokens,
                )
            )  # fmt: skip
            started.append(time.perf_counter())
        live = set(range(concurrency))
        while live:
            # Worker policy: utterances without audio first, round-robin among them.
            waiting = [i for i in sorted(live) if i not in firsts] or sorted(live)
            for i in waiting:
                try:
                    piece = next(gens[i])
                except StopIteration:
                    live.discard(i)
                    continue
                sync()
                if i not in firsts and piece.size:
                    firsts[i] = time.perf_counter() - started[i]
                    if args.first_only:
                        gens[i].close()
                        live.discard(i)
        latencies += [firsts[i] for i in range(concurrency) if i in firsts]
    return latencies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--tiny", action="store_true", help="tiny random model (CPU smoke test)")
    ap.add_argument("--model-dir", type=Path, default=None, help="load this model directory instead")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--tokens", type=int, default=100, help="speech tokens each utterance emits")
    ap.add_argument("--text-tokens", type=int, default=20)
    ap.add_argument("--prompt-seconds", type=float, default=6.0)
    ap.add_argument("--first-chunk", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--first-only", action="store_true", help="close each utterance after its first audio")
    args = ap.parse_args()

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if args.model_dir is not None:
        models = load_models(args.model_dir, device, dtype)
        label = str(args.model_dir)
    elif args.tiny:
        from engine.cosyvoice2.tiny import make_tiny_model_dir

        tmp = tempfile.mkdtemp(prefix="cv2_tiny_bench_")
        models = load_models(make_tiny_model_dir(Path(tmp)), device, dtype)
        label = "tiny random"
    else:
        models = full_size_models(device, dtype)
        label = "CosyVoice2-0.5B architecture, random weights"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    with torch.inference_mode():
        run_level(models, 1, argparse.Namespace(**{**vars(args), "repeats": 1}), sync)  # warm-up
        rows = []
        for c in args.concurrency:
            lat = np.asarray(run_level(models, c, args, sync)) * 1000
            rows.append({"concurrency": c, "n": int(lat.size), "p50_ms": float(np.percentile(lat, 50)),
                         "p95_ms": float(np.percentile(lat, 95)), "max_ms": float(lat.max())})  # fmt: skip

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"\nCosyVoice2 first-chunk latency — {label}, {gpu}, {dtype}, {args.tokens} tokens/utterance, "
          f"first chunk {args.first_chunk} tokens (+3 lookahead), prompt {args.prompt_seconds:.0f} s\n")  # fmt: skip
    print("| concurrency | utterances | p50 (ms) | p95 (ms) | max (ms) |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['n']} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['max_ms']:.1f} |")
    print()
    print(json.dumps({"benchmark": "cosyvoice2_first_chunk", "device": gpu, "dtype": str(dtype), "model": label,
                      "tokens": args.tokens, "first_chunk_tokens": args.first_chunk, "results": rows}))  # fmt: skip


if __name__ == "__main__":
    main()
