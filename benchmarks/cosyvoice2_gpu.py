"""First-chunk latency of the CosyVoice2 engine under concurrency (random weights).

Builds the full-size CosyVoice2-0.5B architecture with random weights in memory (no
download, no checkpoint files), registers nothing: each utterance uses a random
prompt of ``--prompt-seconds``. The LM is forced to emit exactly ``--tokens`` speech
tokens. ``C`` utterances start together and are stepped through the engine's batched
step (``engine/cosyvoice2/batch.py``), batched and unbatched in the same run, and we
time each one's first audio piece. Prints a markdown table and a JSON line.

    .venv/bin/python -m voxwire.benchmarks.cosyvoice2_gpu                  # CUDA, full size, bf16
    .venv/bin/python -m voxwire.benchmarks.cosyvoice2_gpu --tiny --device cpu --first-only --repeats 1 --threads 1
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from voxwire.engine.cosyvoice2.flow import CausalFlow, cache_bound
from voxwire.engine.cosyvoice2.frontend import Prompt
from voxwire.engine.cosyvoice2.hift import HiFTGenerator
from voxwire.engine.cosyvoice2.lm import SpeechLM
from voxwire.engine.cosyvoice2.model_config import QwenConfig, parse_config
from voxwire.engine.cosyvoice2.batch import Batcher
from voxwire.engine.cosyvoice2.pipeline import Stats
from voxwire.engine.cosyvoice2.weights import Models, load_models
from voxwire.engine.cosyvoice2.yaml_reader import load_hyperpyyaml


def full_size_models(device: torch.device, dtype: torch.dtype) -> Models:
    from voxwire.engine.cosyvoice2.tiny import QWEN2_0_5B, release_yaml

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


def run_level(
    models: Models, concurrency: int, args: argparse.Namespace, sync, batched: bool
) -> tuple[list[float], list[int], list[int]]:
    """First-chunk latencies (s) of ``concurrency`` utterances started together, the batch
    size of every step, and the engine steps each stream took part in up to its first
    audio. Batched: every step advances all live streams together
    (those without audio first, up to ``--max-batch`` and the step budget), through the
    engine's own ``Batcher.step``. Unbatched: one stream per step, the one without audio
    that came first (the scheduler's first-audio-first policy with a batch of one)."""
    stats = Stats()
    batcher = Batcher(models, stats, args.first_chunk, fast_start=args.fast_start)
    latencies: list[float] = []
    sizes: list[int] = []
    steps_to_first: list[int] = []
    for rep in range(args.repeats):
        streams, firsts, taken = [], {}, [0] * concurrency
        text = [(100 + k) % (models.cfg.lm.qwen.vocab_size - 32) for k in range(args.text_tokens)]
        for i in range(concurrency):
            prompt = random_prompt(models, args.prompt_seconds, seed=i)
            streams.append(batcher.open(prompt, [text], 1.0, rep * 1000 + i, min_tokens=args.tokens, max_tokens=args.tokens))
        started = time.perf_counter()
        live = list(range(concurrency))
        while live:
            order = sorted(live, key=lambda i: (i in firsts, i))
            if batched:
                chosen, cost = [], 0
                for i in order[: args.max_batch]:
                    c = streams[i].cost()
                    if chosen and cost + c > args.step_budget:
                        continue
                    chosen.append(i)
                    cost += c
            else:
                chosen = order[:1]
            results = batcher.step([streams[i] for i in chosen])
            sync()
            now = time.perf_counter()
            sizes.append(len(chosen))
            for i, r in zip(chosen, results):
                if isinstance(r, Exception):
                    raise r
                taken[i] += 1
                if i not in firsts and any(p.size for p in r.pieces):
                    firsts[i] = now - started
                    steps_to_first.append(taken[i])
                    if args.first_only:
                        r.done = True
                if r.done:
                    streams[i].close()
                    live.remove(i)
        latencies += [firsts[i] for i in range(concurrency) if i in firsts]
    return latencies, sizes, steps_to_first


def print_memory(models: Models, args: argparse.Namespace, dtype: torch.dtype) -> None:
    """What admission counts per stream, by part, from the loaded model's own shapes."""
    batcher = Batcher(models, Stats(), args.first_chunk)
    text = list(range(100, 100 + args.text_tokens))
    print(f"KV cache: {batcher.kv_per_token} B per token per sequence ({dtype})")
    for seconds in (3.0, args.prompt_seconds):
        prompt = random_prompt(models, seconds, 0)
        plan = batcher.plan(prompt, text)
        kv = batcher.kv_per_token * (plan.n_prefill + plan.hi + 1)
        n_flow = len(prompt.speech_tokens) - plan.drop + plan.hi + models.cfg.flow.pre_lookahead_len
        flow = cache_bound(models.flow, n_flow, dtype)
        total = batcher.plan_bytes(prompt, plan)
        print(json.dumps({"prompt_seconds": seconds, "text_tokens": len(text), "max_speech_tokens": plan.hi,
                          "kv_bytes": kv, "flow_bytes": flow, "vocoder_bytes": total - kv - flow, "memory_bytes": total}))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--tiny", action="store_true", help="tiny random model (CPU smoke test)")
    ap.add_argument("--model-dir", type=Path, default=None, help="load this model directory instead")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--modes", nargs="+", default=["batched", "unbatched"], choices=["batched", "unbatched"],
                    help="unbatched: one stream per step (batching off)")  # fmt: skip
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--step-budget", type=int, default=8192, help="LM positions per step (a prefill costs its length)")
    ap.add_argument("--tokens", type=int, default=100, help="speech tokens each utterance emits")
    ap.add_argument("--text-tokens", type=int, default=20)
    ap.add_argument("--prompt-seconds", type=float, default=6.0)
    ap.add_argument("--first-chunk", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--first-only", action="store_true", help="close each utterance after its first audio")
    ap.add_argument("--fast-start", action="store_true",
                    help="trim the flow prompt for a first chunk after 13 LM tokens (default: the official schedule)")  # fmt: skip
    ap.add_argument("--memory-only", action="store_true",
                    help="print each stream's declared device memory (Stream.memory_bytes) and its parts, then exit")  # fmt: skip
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 suits the tiny model)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if args.model_dir is not None:
        models = load_models(args.model_dir, device, dtype)
        label = str(args.model_dir)
    elif args.tiny:
        from voxwire.engine.cosyvoice2.tiny import make_tiny_model_dir

        tmp = tempfile.mkdtemp(prefix="cv2_tiny_bench_")
        models = load_models(make_tiny_model_dir(Path(tmp)), device, dtype)
        label = "tiny random"
    else:
        models = full_size_models(device, dtype)
        label = "CosyVoice2-0.5B architecture, random weights"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if args.memory_only:
        print_memory(models, args, dtype)
        return

    with torch.inference_mode():
        run_level(models, 1, argparse.Namespace(**{**vars(args), "repeats": 1}), sync, True)  # warm-up
        rows = []
        for c in args.concurrency:
            for mode in args.modes:  # side by side, in the same run
                lat_s, sizes, to_first = run_level(models, c, args, sync, mode == "batched")
                lat = np.asarray(lat_s) * 1000
                rows.append({"concurrency": c, "mode": mode, "n": int(lat.size), "p50_ms": float(np.percentile(lat, 50)),
                             "p95_ms": float(np.percentile(lat, 95)), "max_ms": float(lat.max()),
                             "steps": len(sizes), "mean_batch": float(np.mean(sizes)), "max_batch": int(max(sizes)),
                             "steps_to_first_median": float(np.median(to_first))})  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)  # as it goes: a long run that is cut short keeps its rows

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"\nCosyVoice2 first-chunk latency — {label}, {gpu}, {dtype}, {args.tokens} tokens/utterance, "
          f"{'fast start' if args.fast_start else 'official schedule'}, prompt {args.prompt_seconds:.1f} s\n")  # fmt: skip
    print("| concurrency | mode | utterances | p50 (ms) | p95 (ms) | max (ms) | steps | mean batch | steps to first audio |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['mode']} | {r['n']} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['max_ms']:.1f} "
              f"| {r['steps']} | {r['mean_batch']:.1f} | {r['steps_to_first_median']:.0f} |")  # fmt: skip
    print()
    print(json.dumps({"benchmark": "cosyvoice2_first_chunk", "device": gpu, "dtype": str(dtype), "model": label,
                      "tokens": args.tokens, "first_chunk_tokens": args.first_chunk, "first_only": args.first_only,
                      "fast_start": args.fast_start, "prompt_seconds": args.prompt_seconds,
                      "repeats": args.repeats, "results": rows}))  # fmt: skip

if __name__ == "__main__":
    main()
